"""Cost history actions: import traces and prices, and derive the pools' figures from them.

Pools carry the figures placement and the estimator read on every decision (interruption
rate, current spot price); they are derived here from the stored history, in one place, after
every import or refresh.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Case, OuterRef, Subquery, When

from costs import selectors
from costs.borrowing import figures_for
from costs.estimator import (
    DEFAULT_EMERGENCY_MISS_SHARE,
    DEFAULT_MIGRATION_OVERHEAD_HOURS,
    DEFAULT_NOTICE_SECONDS,
    Estimate,
    EstimateInput,
    EstimateRefused,
    estimate,
)
from costs.history import (
    PriceRow,
    Run,
    read_spot_price_rows,
    runs,
    trace_from_runs,
    trace_start,
)
from costs.models import AvailabilitySample, PriceSample, SpotPoolHistory
from costs.replay import DEFAULT_ON_DEMAND_PRICE, DEFAULT_SPOT_PRICE, ReplayJob
from costs.traces import (
    Trace,
    interruption_waits,
    load_trace,
    recent,
    spread,
    trace_from_dict,
)
from costs.what_if import ReplayRefused, WhatIfJob, WhatIfResult, replay_what_if
from jobs.models import Job
from migration.choices import Market
from migration.models import Accelerator, CapacityPool, Region
from migration.placement import PlacementChoice

logger = logging.getLogger(__name__)


@dataclass
class ImportReport:
    imported: int = 0
    skipped: list[str] = field(default_factory=list)

    def describe(self, what: str) -> str:
        text = f"imported {self.imported} {what}"
        if self.skipped:
            text += f"; skipped {len(self.skipped)}: " + "; ".join(self.skipped[:5])
            if len(self.skipped) > 5:
                text += f"; and {len(self.skipped) - 5} more"
        return text


def import_spot_traces(
    path: Path,
    *,
    region: str | None = None,
    accelerator: str | None = None,
    start: datetime | None = None,
) -> ImportReport:
    """Store every trace in `path` (a file, or a folder searched recursively) as availability
    runs (re-importing replaces a trace), then refresh the pools' figures.

    Region and accelerator come from a trace's name when it follows a known pattern, else from
    `region` and `accelerator`; a trace that says neither is skipped with the reason. A trace
    starts on the date of its dataset folder (aws-MM-DD-YYYY), else at `start`. A trace of
    several nodes is stored as one single-instance trace per node (`name#k`), so the rate
    pooled from them is per instance-hour. A file that is not a trace stops the import with
    a one-line error naming it."""
    files = sorted(path.rglob("*.json")) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        raise ValueError(f"no trace files (*.json) under {path}")
    report = ImportReport()
    regions = {r.code: r for r in Region.objects.all()}
    accelerators = {a.name: a for a in Accelerator.objects.all()}
    for file in files:
        trace = load_trace(file)
        name = f"{file.parent.name}/{file.stem}"
        where, card = trace.region or region, trace.accelerator or accelerator
        if where is None or card is None:
            report.skipped.append(f"{name} (its name says no region or card: give them)")
            continue
        if where not in regions or card not in accelerators:
            report.skipped.append(f"{name} (no region {where} or accelerator {card})")
            continue
        began = start if start is not None else trace_start(file)
        gap = timedelta(seconds=trace.gap_seconds)
        nodes = trace.node_traces()
        with transaction.atomic():
            AvailabilitySample.objects.filter(
                trace__in=[name, *(f"{name}#{k}" for k in range(1, trace.nodes + 1))]
            ).delete()
            for node in nodes:
                stored = name if len(nodes) == 1 else f"{name}#{node.name.rsplit('#', 1)[1]}"
                AvailabilitySample.objects.bulk_create(
                    AvailabilitySample(
                        region=regions[where],
                        accelerator=accelerators[card],
                        trace=stored,
                        at=began + gap * run.start,
                        ticks=run.ticks,
                        gap_seconds=round(trace.gap_seconds),
                        available=run.available,
                    )
                    for run in runs(node.unavailable)
                )
        report.imported += 1
    refresh_pool_figures()
    return report


def import_spot_prices(path: Path) -> ImportReport:
    """Store spot price observations for the pools they belong to (zone id and instance type),
    then refresh the pools' prices. Rows for pools Baton does not have are counted, not stored."""
    rows = read_spot_price_rows(path)
    pools = {(p.zone, p.instance_type): p for p in CapacityPool.objects.filter(market=Market.SPOT)}
    report = ImportReport()
    samples = []
    unknown: set[tuple[str, str]] = set()
    for row in rows:
        pool = pools.get((row.zone, row.instance_type))
        if pool is None:
            unknown.add((row.zone, row.instance_type))
            continue
        samples.append(PriceSample(pool=pool, at=row.at, price=row.price, source=path.name))
    PriceSample.objects.bulk_create(samples, ignore_conflicts=True)
    report.imported = len(samples)
    if unknown:
        report.skipped.append(f"{len(unknown)} zone/instance types with no pool")
    refresh_pool_figures()
    return report


def record_price_rows(rows: list[PriceRow], source: str) -> int:
    """Store fetched observations (e.g. from describe_spot_price_history) for known pools."""
    pools = {(p.zone, p.instance_type): p for p in CapacityPool.objects.filter(market=Market.SPOT)}
    samples = [
        PriceSample(pool=pools[(r.zone, r.instance_type)], at=r.at, price=r.price, source=source)
        for r in rows
        if (r.zone, r.instance_type) in pools
    ]
    PriceSample.objects.bulk_create(samples, ignore_conflicts=True)
    return len(samples)


def refresh_spot_prices_from_aws() -> str:
    """Pull recent spot prices of every region's spot pools from AWS, when credentials are
    configured; say what happened in words (the beat task logs it)."""
    from costs import aws

    if not aws.credentials_configured():
        return "skipped: no AWS credentials configured"
    types_by_region: dict[str, set[str]] = defaultdict(set)
    for code, type_name in CapacityPool.objects.filter(market=Market.SPOT).values_list(
        "region__code", "instance_type"
    ):
        types_by_region[code].add(type_name)
    stored = 0
    for region, types in sorted(types_by_region.items()):
        rows = aws.fetch_spot_prices(
            region, sorted(types), endpoint_url=settings.BATON_EC2_ENDPOINT
        )
        stored += record_price_rows(rows, source="aws")
    refresh_pool_figures()
    return f"stored {stored} spot price observation(s) from AWS"


def interruption_history() -> dict[tuple[str, str], list[Trace]]:
    """The most recent week of every stored trace, by (region, accelerator)."""
    by_trace: dict[str, list[AvailabilitySample]] = defaultdict(list)
    for sample in AvailabilitySample.objects.select_related("region", "accelerator").order_by(
        "trace", "at"
    ):
        by_trace[sample.trace].append(sample)
    history: dict[tuple[str, str], list[Trace]] = defaultdict(list)
    for name, samples in by_trace.items():
        first = samples[0]
        trace = trace_from_runs(
            name,
            first.region.code,
            first.accelerator.name,
            first.gap_seconds,
            [Run(0, s.ticks, s.available) for s in samples],
        )
        history[(first.region.code, first.accelerator.name)].append(recent(trace))
    return dict(history)


@transaction.atomic
def refresh_pool_figures() -> None:
    """Spot pools take the interruption figures of their region and card's recent history,
    else of the most similar histories (`costs.borrowing`), else the configured default rate;
    and their latest recorded price. The figures and where they come from are kept in
    `SpotPoolHistory` for the estimator."""
    history = interruption_history()
    default = settings.BATON_DEFAULT_INTERRUPTION_RATE
    latest = PriceSample.objects.filter(pool=OuterRef("pk")).order_by("-at").values("price")[:1]
    spot = CapacityPool.objects.filter(market=Market.SPOT).select_related("region", "accelerator")
    kept = {h.pool_id: h for h in SpotPoolHistory.objects.all()}
    for pool in spot.annotate(latest_price=Subquery(latest)):
        found = figures_for(pool.region.code, pool.accelerator.name, history)
        stats = found.stats
        rate = round(stats.interruption_rate_per_hour, 4) if stats else default
        row = kept.get(pool.pk) or SpotPoolHistory(pool=pool)
        row.source = found.source
        row.borrowed_from = list(found.borrowed_from)
        row.interruption_rate_per_hour = rate
        row.mean_outage_hours = stats.mean_outage_hours if stats else 0.0
        row.uptime_cv = stats.uptime_cv if stats else 1.0
        row.outage_cv = stats.outage_cv if stats else 1.0
        row.history_hours = stats.hours if stats else 0.0
        row.save()
        price: Decimal = pool.latest_price if pool.latest_price is not None else pool.price_per_hour
        if (rate, price) != (pool.interruption_rate_per_hour, pool.price_per_hour):
            pool.interruption_rate_per_hour = rate
            pool.price_per_hour = price
            pool.save(update_fields=["interruption_rate_per_hour", "price_per_hour"])


def estimate_input(job: Job) -> EstimateInput | None:
    """The estimator's view of a job (saved or not) on the pools placement would use now, with
    the history of the spot pool it would judge (rate, outage, spreads, and where they come
    from), the measured migration overhead and the measured share of missed emergency
    checkpoints; None when no pool of either market fits it.

    Raises ``EstimateRefused`` for a job too big to estimate within the bounds of one request.
    """
    from migration.selectors import market_situation, prospects

    seen = prospects(job)
    if seen.spot_fit is None and seen.on_demand_fit is None:
        return None
    situation = market_situation(job, seen)
    spot = seen.price(Market.SPOT)
    on_demand = seen.price(Market.ON_DEMAND)
    # A market with no fitting pool is priced like the other, so the comparison says so
    # through availability rather than through an infinite price.
    spot, on_demand = (
        on_demand if spot == float("inf") else spot,
        spot if on_demand == float("inf") else on_demand,
    )
    deadline_hours = situation.hours_to_deadline
    judged = seen.spot.pool if isinstance(seen.spot, PlacementChoice) else seen.spot_fit
    history = selectors.spot_pool_history(judged.id) if judged else None
    figures: dict[str, Any] = {}
    if judged is not None:
        source, borrowed = selectors.rate_source(history, judged.interruption_rate_per_hour)
        figures = {"interruption_rate_source": source}
        if history is not None and source != "pool":  # the figures derived with the rate
            figures.update(
                mean_outage_hours=history.mean_outage_hours,
                uptime_cv=history.uptime_cv,
                outage_cv=history.outage_cv,
                interruption_rate_borrowed_from=tuple(borrowed),
                history_hours=history.history_hours,
            )
    outage = candidate_outage([pool.id for pool in seen.spot_candidates])
    if outage is not None and "mean_outage_hours" in figures:
        # After an interruption placement takes any candidate pool that has spot: the job waits
        # only while all of them are away at once.
        mean, cv, pools = outage
        figures.update(mean_outage_hours=mean, outage_cv=cv, outage_pools=pools)
    # With the market simulator on, spot is interrupted on its compressed clock: the job meets
    # `scale` times more interruptions per hour of the clock, each outage `scale` times shorter.
    scale = settings.BATON_MARKET_TIME_SCALE or 1.0
    if "mean_outage_hours" in figures:
        figures["mean_outage_hours"] /= scale
    return EstimateInput(
        work_hours=situation.remaining_work_hours,
        spot_price_per_hour=spot,
        on_demand_price_per_hour=on_demand,
        interruption_rate_per_hour=seen.interruption_rate * scale,
        market_time_scale=scale,
        checkpoint_gb=job.checkpoint_gb,
        migration_overhead_hours=situation.restart_overhead_hours,
        deadline_hours=deadline_hours if deadline_hours and deadline_hours > 0 else None,
        max_wait_hours=job.max_wait_s / 3600,
        spot_available_now=situation.spot_available,
        emergency_miss_share=selectors.emergency_miss_share(DEFAULT_EMERGENCY_MISS_SHARE),
        notice_seconds=seen.spot_fit.notice_s if seen.spot_fit else DEFAULT_NOTICE_SECONDS,
        seed=0,  # the same job on the same pools gets the same estimate
        **figures,
    )


def candidate_outage(pool_ids: list[int]) -> tuple[float, float, int] | None:
    """How long an interrupted job waits for spot when placement may put it on any of the spot
    pools `pool_ids`: (mean hours, their coefficient of variation, how many of the pools have
    trace history). Over the most recent week of the traces behind them, at every
    interruption of one, the wait is nothing while another has spot, else the outage all of
    them share from there. Traces of one dataset are laid on one clock by their start;
    datasets recorded at different times are taken apart and pooled. None when no candidate
    pool has trace history."""
    behind, stored = selectors.candidate_pool_traces(pool_ids)
    if not behind:
        return None
    groups: dict[tuple[str, int], list[tuple[Trace, float]]] = defaultdict(list)
    for name in sorted({n for names in behind.values() for n in names}):
        found = stored[name]
        trace = trace_from_runs(
            name, "", "", found.gap_seconds, [Run(0, ticks, up) for ticks, up in found.runs]
        )
        latest = recent(trace)
        start = found.start.timestamp() / 3600 + (trace.ticks - latest.ticks) * trace.tick_hours
        groups[(name.split("/", 1)[0], found.gap_seconds)].append((latest, start))
    waits = [
        seen
        for group in groups.values()
        if (seen := interruption_waits([t for t, _ in group], [s for _, s in group])) is not None
    ]
    every = np.concatenate(waits) if waits else np.zeros(0)
    if every.size == 0:
        return None
    return float(every.mean()), spread(every), len(behind)


def estimate_job(job: Job, *, refuse: bool = False) -> Estimate | None:
    """Spot against on-demand for a job, before it launches (DESIGN §7); None when no pool
    fits it, or when it is too big to estimate (``EstimateRefused`` with ``refuse=True``)."""
    try:
        inputs = estimate_input(job)
    except EstimateRefused as refused:
        if refuse:
            raise
        logger.info("job %s not estimated: %s", job.pk, refused)
        return None
    return estimate(inputs) if inputs else None


@dataclass
class WhatIf:
    """What the costs page shows for an accelerator and a hypothetical job on it."""

    figures: dict[str, dict[str, Any]]
    estimate: Estimate | None


# The page's estimate and its two charts are the costly part of a GET: kept this long for the
# same inputs (which change with every import, price refresh or migration that moves them).
WHAT_IF_CACHE_SECONDS = 600


def _estimate_figures(inputs: EstimateInput) -> tuple[dict[str, Any], Estimate]:
    from costs import charts

    key = "costs:what-if:" + hashlib.sha256(repr(inputs).encode()).hexdigest()
    cached = cache.get(key)
    if cached is None:
        result = estimate(inputs)
        figures = {
            "interval": charts.cost_against_interval(inputs, result.checkpoint_interval_s),
            "completion": charts.completion_time(inputs),
        }
        cached = (figures, result)
        cache.set(key, cached, WHAT_IF_CACHE_SECONDS)
    return cached


def what_if(job: Job) -> WhatIf:
    """History charts of the job's accelerator, and its estimate with charts, when it fits.

    Raises ``EstimateRefused`` for a job too big to estimate within one request's bounds."""
    from costs import charts

    name = job.accelerator.name
    figures = {
        "prices": charts.price_history(selectors.price_series(name)),
        "rates": charts.interruption_rates(*selectors.pool_rates(name)),
    }
    inputs = estimate_input(job)
    if inputs is None:
        return WhatIf(figures, None)
    estimate_figures, result = _estimate_figures(inputs)
    return WhatIf({**figures, **estimate_figures}, result)


def accrue_job_costs(job: Job) -> tuple[Decimal, Decimal]:
    """Cost so far of a job from its instance-seconds at each pool's price, and what the same
    seconds would have cost on on-demand capacity of the same hardware (the savings baseline).
    Saved on the job; returns (cost, on-demand cost)."""
    from django.utils import timezone

    from migration.models import Instance

    now = timezone.now()
    on_demand_rate = (
        CapacityPool.objects.filter(
            market=Market.ON_DEMAND,
            accelerator_id=job.accelerator_id,
            gpus_per_instance=job.gpus_per_node,
        )
        .order_by("price_per_hour")
        .values_list("price_per_hour", flat=True)
        .first()
    )
    cost = baseline = Decimal("0")
    instances = Instance.objects.filter(job=job).select_related("pool")
    for instance in instances:
        began = instance.started_at or instance.launched_at
        if began is None:
            continue
        hours = Decimal(max(0.0, ((instance.ended_at or now) - began).total_seconds()) / 3600)
        price = instance.pool.price_per_hour
        cost += hours * price
        rate = price if instance.pool.market == Market.ON_DEMAND else on_demand_rate
        baseline += hours * (rate if rate is not None else price)
    cost, baseline = cost.quantize(Decimal("0.0001")), baseline.quantize(Decimal("0.0001"))
    Job.objects.filter(pk=job.pk).update(cost_so_far=cost, on_demand_cost_so_far=baseline)
    job.cost_so_far, job.on_demand_cost_so_far = cost, baseline
    return cost, baseline


def stored_trace(name: str) -> Trace | None:
    """A trace of history rebuilt from its runs (every node of a wide one), or None."""
    samples = selectors.stored_trace_samples(name)
    if not samples:
        return None
    by_node: dict[str, list[AvailabilitySample]] = defaultdict(list)
    for sample in samples:
        by_node[sample.trace].append(sample)
    first = samples[0]
    nodes = [
        trace_from_runs(
            node,
            first.region.code,
            first.accelerator.name,
            rows[0].gap_seconds,
            [Run(0, row.ticks, row.available) for row in rows],
        )
        for node, rows in sorted(by_node.items())
    ]
    length = max(node.ticks for node in nodes)
    lost = np.zeros(length, dtype=np.int64)
    for node in nodes:
        lost[: node.ticks] += node.unavailable
        lost[node.ticks :] += 1  # a node whose record ends early counts as lost
    width = len(nodes)
    return Trace(
        name=name,
        region=first.region.code,
        zone=None,
        accelerator=first.accelerator.name,
        nodes=width,
        gap_seconds=float(first.gap_seconds),
        unavailable=lost >= width,
        lost_nodes=lost if width > 1 else None,
    )


def _job_prices(pool: CapacityPool, nodes: int) -> tuple[float, float]:
    """(spot, on-demand) per hour of a gang of `nodes` on `pool`'s hardware: the pool's own
    price and the cheapest on-demand pool of the same card and width (its region first)."""
    on_demand = (
        CapacityPool.objects.filter(
            market=Market.ON_DEMAND,
            accelerator_id=pool.accelerator_id,
            gpus_per_instance=pool.gpus_per_instance,
        )
        .order_by(Case(When(region_id=pool.region_id, then=0), default=1), "price_per_hour")
        .values_list("price_per_hour", flat=True)
        .first()
    )
    spot = float(pool.price_per_hour) * nodes
    return spot, float(on_demand if on_demand is not None else pool.price_per_hour) * nodes


def replay_for_user(fields: dict[str, Any]) -> WhatIfResult:
    """What-if replay (`POST /api/replays/` and the replay page) from validated fields: a job's
    shape and tolerance over an uploaded trace, a stored one, or a spot pool's own history
    (with the pool's prices). Raises ``ReplayRefused`` naming the field when it cannot."""
    from migration.selectors import migration_overhead_hours

    nodes = fields.get("nodes") or 1
    pool: CapacityPool | None = fields.get("pool")
    trace: Trace | None = None
    if fields.get("trace_data") is not None:
        try:
            trace = trace_from_dict("uploaded", fields["trace_data"])
        except ValueError as exc:
            raise ReplayRefused("trace_data", str(exc)) from None
    elif fields.get("trace"):
        trace = stored_trace(fields["trace"])
        if trace is None:
            raise ReplayRefused("trace", f"no stored trace is named {fields['trace']!r}")
    elif pool is not None:
        names = selectors.pool_trace_names(pool)
        if not names:
            raise ReplayRefused(
                "pool", "this pool has no history to replay, nor a similar one: name a trace"
            )
        trace = stored_trace(names[0])
    if trace is None:
        raise ReplayRefused("trace", "give a trace (a stored one's name), trace_data, or a pool")
    spot_price, on_demand_price = DEFAULT_SPOT_PRICE * nodes, DEFAULT_ON_DEMAND_PRICE * nodes
    if pool is not None:
        spot_price, on_demand_price = _job_prices(pool, nodes)
    if fields.get("spot_price") is not None:
        spot_price = fields["spot_price"]
    if fields.get("on_demand_price") is not None:
        on_demand_price = fields["on_demand_price"]
    restart = fields.get("restart_overhead_hours")
    if restart is None:
        restart = migration_overhead_hours(DEFAULT_MIGRATION_OVERHEAD_HOURS)
    deadline = fields["deadline_hours"]
    start = fields.get("start_hours")
    if start is None:  # a pool's own history: its most recent window
        start = max(0.0, trace.hours - deadline) if pool is not None else 0.0
    try:
        job = ReplayJob(fields["task_hours"], deadline, restart, spot_price, on_demand_price)
    except ValueError as exc:
        raise ReplayRefused("non_field_errors", str(exc)) from None
    request = WhatIfJob(
        job=job,
        tolerance=fields.get("tolerance") or "balanced",
        nodes=nodes,
        start_hours=start,
        max_wait_hours=fields.get("max_wait_hours"),
        max_interruptions=fields.get("max_interruptions"),
    )
    return replay_what_if(request, trace)

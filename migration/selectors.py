"""Read-only queries shared by the API, the pages and the consumers."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F
from django.utils import timezone

from costs.estimator import (
    DEFAULT_MIGRATION_OVERHEAD_HOURS,
    DEFAULT_RESTORE_GB_PER_S,
    DEFAULT_SAVE_GB_PER_S,
    expected_cost_to_finish,
)
from costs.policies import MarketDecision, MarketSituation, decide_market, spot_pool_allowed
from jobs.models import Job
from migration.checkpoint import ManifestRef
from migration.choices import CheckpointKind, CheckpointStatus, Market, MigrationPhase
from migration.compatibility import HardwareOption, Rule, hardware_options
from migration.events import serialize_event
from migration.models import (
    CapacityPool,
    Checkpoint,
    CompatibilityRule,
    Migration,
    TimelineEvent,
)
from migration.placement import (
    CROSS_REGION_GB_PER_S,
    PlacementChoice,
    PlacementRequest,
    PoolView,
    Rejection,
    candidate_pools,
    cheapest_fit,
    choose_pool,
)
from migration.placement import likely_regions as rank_regions

REPLAY_LIMIT = 5000
# The interval assumed for a job that checkpoints by steps only (the seed's 5 minutes).
DEFAULT_CHECKPOINT_INTERVAL_S = 300
CLOSED_PHASES = (MigrationPhase.DONE, MigrationPhase.FAILED)


def can_watch_job(user: Any, job_id: int) -> bool:
    """Members of the job's project and staff may watch it; unknown jobs are refused."""
    return Job.objects.visible_to(user).filter(pk=job_id).exists()


def job_events_after(job_id: int, since: int) -> tuple[list[dict[str, Any]], str | None]:
    """The job's events after `since`, and its state as of the same read (one query when
    there are events, so the state is never older than the events)."""
    events = list(
        TimelineEvent.objects.filter(job_id=job_id, id__gt=since)
        .select_related("job")
        .order_by("id")[:REPLAY_LIMIT]
    )
    state: str | None
    if events:
        state = events[-1].job.state
    else:
        state = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
    return [serialize_event(e) for e in events], state


def fleet_events_after(since: int) -> tuple[list[dict[str, Any]], str | None]:
    events = TimelineEvent.objects.filter(id__gt=since).order_by("id")
    return [serialize_event(e) for e in events[:REPLAY_LIMIT]], None


def migration_overhead_hours(default: float, last: int = 50) -> float:
    """Mean duration of the last finished migrations (notice to running again), or `default`
    before there is any: the restart overhead the estimator and the policies charge."""
    took = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    durations = list(
        Migration.objects.filter(phase=MigrationPhase.DONE, finished_at__isnull=False)
        .order_by("-finished_at")
        .annotate(took=took)
        .values_list("took", flat=True)[:last]
    )
    if not durations:
        return default
    return sum(d.total_seconds() for d in durations) / len(durations) / 3600


def compatibility_rules() -> list[Rule]:
    rows = CompatibilityRule.objects.filter(enabled=True).select_related("source", "target")
    return [Rule(r.source.name, r.target.name, r.kind, r.target_count) for r in rows]


def pool_views() -> list[PoolView]:
    """Every enabled pool with its free capacity, in one query."""
    pools = (
        CapacityPool.objects.with_free()
        .filter(enabled=True)
        .select_related("region", "accelerator")
    )
    return [
        PoolView(
            id=p.pk,
            region=p.region.code,
            zone=p.zone,
            instance_type=p.instance_type,
            accelerator=p.accelerator.name,
            gpus_per_instance=p.gpus_per_instance,
            market=p.market,
            price_per_hour=float(p.price_per_hour),
            free=p.free,  # type: ignore[attr-defined]  # annotated by with_free()
            interruption_rate_per_hour=p.interruption_rate_per_hour,
            notice_s=p.advance_notice_s + p.final_window_s,
            last_preempted_at=p.last_preempted_at,
        )
        for p in pools
    ]


def _request(
    job: Job, market: str, overhead_hours: float, replicas: frozenset[str] = frozenset()
) -> PlacementRequest:
    """The job as placement sees it: hardware options, gang, cap and what finishing takes
    (the estimator's restart: the migration overhead plus the restore, decision 020)."""
    options = hardware_options(
        job.accelerator.name, job.gpus_per_node, compatibility_rules(), job.allow_model_parallel
    )
    cap = float(job.max_price_per_hour) if job.max_price_per_hour is not None else None
    interval_s = job.checkpoint_every_seconds or DEFAULT_CHECKPOINT_INTERVAL_S
    return PlacementRequest(
        options=tuple(options),
        nodes=job.nodes,
        market=market,
        max_price_per_hour=cap,
        requested=job.accelerator.name,
        remaining_hours=max(remaining_work_hours(job), 1e-6),
        restart_overhead_hours=overhead_hours + job.checkpoint_gb / DEFAULT_RESTORE_GB_PER_S / 3600,
        checkpoint_interval_hours=interval_s / 3600,
        save_seconds=job.checkpoint_gb / DEFAULT_SAVE_GB_PER_S,
        copy_hours=job.checkpoint_gb / CROSS_REGION_GB_PER_S / 3600,
        replica_regions=replica_regions(job) | replicas,
    )


def replica_regions(job: Job) -> frozenset[str]:
    """Regions holding a ready copy of the job's newest checkpoint (placement's locality)."""
    if job.pk is None:
        return frozenset()
    newest = complete_checkpoints(job)
    if not newest:
        return frozenset()
    checkpoint = newest[0]
    regions = set(checkpoint.replicas.filter(status="ready").values_list("region__code", flat=True))
    if checkpoint.region is not None:
        regions.add(checkpoint.region.code)
    return frozenset(regions)


@dataclass(frozen=True)
class Prospects:
    """What placement sees for a job now: the pool it would take in each market (or why none
    has room), and the pool each market would cost even while full.

    The policy judges the pool placement would actually take: its price and interruption rate.
    Only when a market has no room do the figures come from its best full pool, so the policy
    can still weigh that market (balanced's expected costs) and say why it is out (the
    conservative limit on interruptions); spot is then unavailable to it all the same."""

    spot: PlacementChoice | Rejection
    on_demand: PlacementChoice | Rejection
    spot_fit: PoolView | None
    on_demand_fit: PoolView | None
    nodes: int
    spot_request: PlacementRequest | None = None
    overhead_hours: float = DEFAULT_MIGRATION_OVERHEAD_HOURS
    # Every spot pool the job may be placed on (room or not): where an interrupted job can go.
    spot_candidates: tuple[PoolView, ...] = ()

    def _judged(self, market: str) -> PoolView | None:
        chosen = self.spot if market == Market.SPOT else self.on_demand
        if isinstance(chosen, PlacementChoice):
            return chosen.pool
        return self.spot_fit if market == Market.SPOT else self.on_demand_fit

    def price(self, market: str) -> float:
        """Price per hour of the whole gang in `market` (infinite when nothing fits)."""
        fit = self._judged(market)
        return fit.price_per_hour * self.nodes if fit else math.inf

    @property
    def interruption_rate(self) -> float:
        """Interruptions per hour of the gang: any rank's interruption moves them all."""
        fit = self._judged(Market.SPOT)
        return fit.interruption_rate_per_hour * self.nodes if fit else 0.0

    @property
    def lost_hours_per_interruption(self) -> float:
        """Work an interruption of the judged spot pool loses: none when the emergency
        checkpoint fits its notice, else half a checkpoint interval on average."""
        fit, request = self._judged(Market.SPOT), self.spot_request
        if fit is None or request is None or request.save_seconds <= fit.notice_s:
            return 0.0
        return request.checkpoint_interval_hours / 2


def allowed_pools(job: Job, views: list[PoolView]) -> list[PoolView]:
    """`views` without the spot pools the job's tolerance refuses (too often interrupted)."""
    return [
        p
        for p in views
        if p.market != Market.SPOT
        or spot_pool_allowed(job.tolerance, p.interruption_rate_per_hour * job.nodes)
    ]


def prospects(
    job: Job,
    *,
    pools: list[PoolView] | None = None,
    exclude_pools: frozenset[int] = frozenset(),
    replica_regions: frozenset[str] = frozenset(),
) -> Prospects:
    """The candidate pools of both markets for `job` (saved or not): one query for the pools
    unless `pools` are given, none of `exclude_pools` (a pool being reclaimed), with
    `replica_regions` counted as holding a ready replica besides those recorded.

    Spot pools the tolerance does not allow (too often interrupted for a conservative job) are
    never chosen; when no allowed pool fits at all, the best disallowed one still sets the
    figures, so the policy can say why spot is out.
    """
    views = [p for p in (pool_views() if pools is None else pools) if p.id not in exclude_pools]
    allowed = allowed_pools(job, views)
    overhead = migration_overhead_hours(DEFAULT_MIGRATION_OVERHEAD_HOURS)
    spot_request = _request(job, Market.SPOT, overhead, replica_regions)
    od_request = replace(spot_request, market=Market.ON_DEMAND)
    return Prospects(
        spot=choose_pool(spot_request, allowed),
        on_demand=choose_pool(od_request, views),
        spot_fit=cheapest_fit(spot_request, allowed) or cheapest_fit(spot_request, views),
        on_demand_fit=cheapest_fit(od_request, views),
        nodes=job.nodes,
        spot_request=spot_request,
        overhead_hours=overhead,
        spot_candidates=tuple(candidate_pools(spot_request, allowed)),
    )


def likely_regions(job: Job) -> list[str]:
    """The regions the job would land in next, most likely first (either market, ranked as
    placement ranks pools, those with room first): where its checkpoints are replicated."""
    pools = allowed_pools(job, pool_views())
    spot = _request(job, Market.SPOT, migration_overhead_hours(DEFAULT_MIGRATION_OVERHEAD_HOURS))
    markets = [] if job.on_demand_only else [spot]
    return rank_regions([*markets, replace(spot, market=Market.ON_DEMAND)], pools)


def remaining_work_hours(job: Job) -> float:
    return job.expected_hours * max(0.0, 1 - job.step / job.total_steps)


def _hours_between(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() / 3600


def market_situation(job: Job, seen: Prospects, now: datetime | None = None) -> MarketSituation:
    """The job and its prospects in the terms of the cost policies: spot is available when a
    spot pool has room for the gang, and its figures are that pool's (how long its spot has had
    room too: since it last took back an instance)."""
    now = now or timezone.now()
    created = job.created_at or now
    spot = seen.spot if isinstance(seen.spot, PlacementChoice) else None
    preempted = None if spot is None else spot.pool.last_preempted_at
    return MarketSituation(
        tolerance=job.tolerance,
        remaining_work_hours=remaining_work_hours(job),
        spot_available=spot is not None,
        spot_price_per_hour=seen.price(Market.SPOT),
        on_demand_price_per_hour=seen.price(Market.ON_DEMAND),
        interruption_rate_per_hour=seen.interruption_rate,
        current_market=job.market or None,
        restart_overhead_hours=seen.overhead_hours,
        hours_to_deadline=_hours_between(job.deadline, now) if job.deadline else None,
        total_work_hours=job.expected_hours,
        total_hours_to_deadline=_hours_between(job.deadline, created) if job.deadline else None,
        interruptions=job.interruptions,
        max_interruptions=job.max_interruptions,
        waited_for_spot_hours=_hours_between(now, job.waiting_since) if job.waiting_since else 0.0,
        max_wait_hours=job.max_wait_s / 3600,
        allow_on_demand=job.allow_on_demand_fallback and seen.on_demand_fit is not None,
        lost_hours_per_interruption=seen.lost_hours_per_interruption,
        spot_available_hours=None if preempted is None else _hours_between(now, preempted),
    )


def _sentence(text: str) -> str:
    return f"{text[0].upper()}{text[1:]}."


def placement_decision(
    job: Job,
    *,
    replica_regions: frozenset[str] = frozenset(),
    exclude_pools: frozenset[int] = frozenset(),
) -> tuple[PlacementChoice | None, MarketDecision, str]:
    """Ask the cost policies which market, judging the pools placement would take, then take
    that market's pool (or say why not). `replica_regions` and `exclude_pools` as `prospects`.

    A deadline at risk sends a job to on-demand; when every on-demand pool is full and spot
    has room, the job runs on spot rather than spend its slack waiting."""
    seen = prospects(job, exclude_pools=exclude_pools, replica_regions=replica_regions)
    if seen.spot_fit is None and seen.on_demand_fit is None:
        reason = f"{seen.spot.reason}; {seen.on_demand.reason}"
        return None, MarketDecision(Market.SPOT, reason, wait=True, rule="no_capacity"), reason
    if job.on_demand_only:  # its interruption awareness failed once: on-demand for good
        decision = MarketDecision(
            Market.ON_DEMAND,
            "An instance of this job could not hear interruption notices, so it stays on "
            "on-demand capacity.",
            rule="awareness_abnormal",
        )
    else:
        decision = decide_market(market_situation(job, seen))
    if decision.wait:
        return None, decision, decision.reason
    chosen = seen.spot if decision.market == Market.SPOT else seen.on_demand
    if isinstance(chosen, PlacementChoice):
        return chosen, decision, f"{decision.reason} {_sentence(chosen.reason)}"
    if decision.rule == "safety_net" and isinstance(seen.spot, PlacementChoice):
        reason = (
            f"{decision.reason} But {chosen.reason}, and waiting spends slack while spot has "
            f"room: {seen.spot.reason}."
        )
        return seen.spot, MarketDecision(Market.SPOT, reason, rule="safety_net_spot"), reason
    return None, decision, f"{decision.reason} But {chosen.reason}."


# Policy rules that move a running job between markets (costs/policies.py): the deadline's
# safety net, and the tolerance's own reasons to leave spot.
TO_ON_DEMAND_RULES = frozenset(
    {"safety_net", "behind_plan", "cheaper_on_demand", "conservative_rate"}
)
TO_SPOT_RULES = frozenset({"spot_with_slack"})


def market_review(job: Job) -> MarketDecision | None:
    """For a running job with a deadline: the decision to move it to the other market now, or
    None to stay.

    The market it runs in is judged by the pool it holds (it has room: the job is in it); the
    other by the pool placement would take. Spot -> on-demand when the slack no longer covers
    the work left plus the kept restarts (or the tolerance rules spot out); on-demand -> spot
    when spot has room, the slack allows, and spot is expected to cost less to finish even
    after paying the move's restart. Either way only when the target market has room."""
    if job.deadline is None or job.on_demand_only or job.pool_id is None:
        return None
    if job.market not in (Market.SPOT, Market.ON_DEMAND):
        return None
    views = pool_views()
    held = next((p for p in views if p.id == job.pool_id), None)
    if held is None:
        return None
    seen = prospects(job, pools=views)
    holding = PlacementChoice(
        held,
        HardwareOption(held.accelerator, held.gpus_per_instance),
        f"the pool it runs in ({held.instance_type} in {held.zone or held.region})",
    )
    if job.market == Market.SPOT:
        seen = replace(seen, spot=holding, spot_fit=held)
    else:
        seen = replace(seen, on_demand=holding, on_demand_fit=held)
    situation = market_situation(job, seen)
    decision = decide_market(situation)
    if decision.wait or decision.market == job.market:
        return None
    if decision.market == Market.ON_DEMAND:
        ok = decision.rule in TO_ON_DEMAND_RULES and isinstance(seen.on_demand, PlacementChoice)
        return decision if ok else None
    if decision.rule not in TO_SPOT_RULES or not isinstance(seen.spot, PlacementChoice):
        return None
    spot, on_demand = expected_cost_to_finish(
        situation.remaining_work_hours,
        situation.spot_price_per_hour,
        situation.on_demand_price_per_hour,
        situation.interruption_rate_per_hour,
        situation.restart_overhead_hours,
        Market.ON_DEMAND,
        situation.lost_hours_per_interruption,
    )
    if spot >= on_demand:
        return None
    return MarketDecision(
        Market.SPOT,
        f"{decision.reason} Spot is expected to cost ${spot:,.2f} to finish, on-demand "
        f"${on_demand:,.2f}.",
        rule=decision.rule,
    )


def open_migration(job: Job) -> Migration | None:
    """The job's migration in progress, if any."""
    return job.migrations.exclude(phase__in=CLOSED_PHASES).order_by("-id").first()


# Regions a migration's placement leaves out (their store could not be reached), kept in
# `Migration.validation` beside the attempt's validation.
UNREACHABLE = "unreachable_regions"


def unreachable_pools(migration: Migration | None) -> frozenset[int]:
    """The pools of the regions the migration found unreachable."""
    regions = ((migration.validation or {}).get(UNREACHABLE) or []) if migration else []
    if not regions:
        return frozenset()
    return frozenset(
        CapacityPool.objects.filter(region__code__in=regions).values_list("pk", flat=True)
    )


def checkpoint_rank(checkpoint: Checkpoint) -> int:
    return ManifestRef.parse(checkpoint.manifest_key).rank


def complete_checkpoints(job: Job, before_step: int | None = None) -> list[Checkpoint]:
    """Committed checkpoints every rank of the job wrote (rank 0's row of each), newest first."""
    rows = Checkpoint.objects.filter(job=job, status=CheckpointStatus.COMMITTED)
    if before_step is not None:
        rows = rows.filter(step__lt=before_step)
    by_step: dict[tuple[int, str], dict[int, Checkpoint]] = {}
    for row in rows.order_by("-step", "-id"):
        by_step.setdefault((row.step, row.kind), {})[checkpoint_rank(row)] = row
    complete = [
        ranks[0] for ranks in by_step.values() if set(range(job.nodes)) <= set(ranks) and 0 in ranks
    ]
    return sorted(
        complete, key=lambda c: (c.step, c.kind == CheckpointKind.EMERGENCY), reverse=True
    )

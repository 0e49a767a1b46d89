"""Capacity actions: place a job, reserve and release instances.

Each service owns its transaction and schedules side effects with `transaction.on_commit`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from django.db import transaction
from django.utils import timezone

from costs.estimator import DEFAULT_MIGRATION_OVERHEAD_HOURS
from costs.policies import MarketDecision, MarketSituation, decide_market, spot_pool_allowed
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import set_state
from migration.choices import ACTIVE_INSTANCE_STATES, InstanceState, Market, TimelineKind
from migration.compatibility import Rule, hardware_options
from migration.events import record_event
from migration.models import CapacityPool, CompatibilityRule, Instance
from migration.placement import (
    PlacementChoice,
    PlacementRequest,
    PoolView,
    Rejection,
    cheapest_fit,
    choose_pool,
)
from migration.selectors import migration_overhead_hours

logger = logging.getLogger(__name__)

PLACEABLE_STATES = (JobState.PENDING, JobState.WAITING, JobState.MIGRATING, JobState.PLACING)


@dataclass(frozen=True)
class PlacementOutcome:
    job_id: int
    placed: bool
    reason: str
    pool_id: int | None = None


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
        )
        for p in pools
    ]


def _request(job: Job, market: str) -> PlacementRequest:
    options = hardware_options(
        job.accelerator.name, job.gpus_per_node, compatibility_rules(), job.allow_model_parallel
    )
    cap = float(job.max_price_per_hour) if job.max_price_per_hour is not None else None
    return PlacementRequest(
        options=tuple(options),
        nodes=job.nodes,
        market=market,
        max_price_per_hour=cap,
        requested=job.accelerator.name,
    )


@dataclass(frozen=True)
class Prospects:
    """What placement sees for a job now: the pool it would take in each market (or why none
    has room), and the pool each market would cost even while full (for prices and rates)."""

    spot: PlacementChoice | Rejection
    on_demand: PlacementChoice | Rejection
    spot_fit: PoolView | None
    on_demand_fit: PoolView | None
    nodes: int

    def price(self, market: str) -> float:
        """Price per hour of the whole gang in `market` (infinite when nothing fits)."""
        fit = self.spot_fit if market == Market.SPOT else self.on_demand_fit
        return fit.price_per_hour * self.nodes if fit else math.inf

    @property
    def interruption_rate(self) -> float:
        """Interruptions per hour of the gang: any rank's interruption moves them all."""
        return self.spot_fit.interruption_rate_per_hour * self.nodes if self.spot_fit else 0.0


def prospects(job: Job) -> Prospects:
    """The candidate pools of both markets for `job` (saved or not), in one query.

    Spot pools the tolerance does not allow (too often interrupted for a conservative job) are
    never chosen; when no allowed pool fits at all, the best disallowed one still sets the
    figures, so the policy can say why spot is out.
    """
    pools = pool_views()
    allowed = [
        p
        for p in pools
        if p.market != Market.SPOT
        or spot_pool_allowed(job.tolerance, p.interruption_rate_per_hour * job.nodes)
    ]
    spot_request, od_request = _request(job, Market.SPOT), _request(job, Market.ON_DEMAND)
    return Prospects(
        spot=choose_pool(spot_request, allowed),
        on_demand=choose_pool(od_request, pools),
        spot_fit=cheapest_fit(spot_request, allowed) or cheapest_fit(spot_request, pools),
        on_demand_fit=cheapest_fit(od_request, pools),
        nodes=job.nodes,
    )


def remaining_work_hours(job: Job) -> float:
    return job.expected_hours * max(0.0, 1 - job.step / job.total_steps)


def _hours_between(later: datetime, earlier: datetime) -> float:
    return (later - earlier).total_seconds() / 3600


def market_situation(job: Job, seen: Prospects, now: datetime | None = None) -> MarketSituation:
    """The job and its prospects in the terms of the cost policies."""
    now = now or timezone.now()
    created = job.created_at or now
    return MarketSituation(
        tolerance=job.tolerance,
        remaining_work_hours=remaining_work_hours(job),
        spot_available=isinstance(seen.spot, PlacementChoice),
        spot_price_per_hour=seen.price(Market.SPOT),
        on_demand_price_per_hour=seen.price(Market.ON_DEMAND),
        interruption_rate_per_hour=seen.interruption_rate,
        current_market=job.market or None,
        restart_overhead_hours=migration_overhead_hours(DEFAULT_MIGRATION_OVERHEAD_HOURS),
        hours_to_deadline=_hours_between(job.deadline, now) if job.deadline else None,
        total_work_hours=job.expected_hours,
        total_hours_to_deadline=_hours_between(job.deadline, created) if job.deadline else None,
        interruptions=job.interruptions,
        max_interruptions=job.max_interruptions,
        waited_for_spot_hours=_hours_between(now, job.waiting_since) if job.waiting_since else 0.0,
        max_wait_hours=job.max_wait_s / 3600,
        allow_on_demand=job.allow_on_demand_fallback and seen.on_demand_fit is not None,
    )


def _decide(job: Job) -> tuple[PlacementChoice | None, MarketDecision, str]:
    """Ask the cost policies which market, then take that market's pool (or say why not)."""
    seen = prospects(job)
    if seen.spot_fit is None and seen.on_demand_fit is None:
        reason = f"{seen.spot.reason}; {seen.on_demand.reason}"
        return None, MarketDecision(Market.SPOT, reason, wait=True, rule="no_capacity"), reason
    decision = decide_market(market_situation(job, seen))
    chosen = seen.spot if decision.market == Market.SPOT else seen.on_demand
    if decision.wait or not isinstance(chosen, PlacementChoice):
        why = decision.reason if decision.wait else f"{decision.reason} But {chosen.reason}."
        return None, decision, why
    return chosen, decision, f"{decision.reason} {chosen.reason[0].upper()}{chosen.reason[1:]}."


def _reserve(job: Job, choice: PlacementChoice) -> list[Instance] | None:
    """Take `job.nodes` slots of the chosen pool under its row lock, or None if they went."""
    pool = CapacityPool.objects.select_for_update().get(pk=choice.pool.id)
    used = Instance.objects.filter(pool=pool, state__in=ACTIVE_INSTANCE_STATES).count()
    if pool.capacity - used < job.nodes:
        return None
    return [Instance.objects.create(pool=pool, job=job, rank=rank) for rank in range(job.nodes)]


def place_job(job_id: int) -> PlacementOutcome:
    """Choose a pool for a job and reserve it; the job goes placing -> starting, or waiting.

    Safe to run twice: a job that is not waiting for placement is left alone.
    """
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state not in PLACEABLE_STATES:
            return PlacementOutcome(job_id, False, f"job is {job.state}")
        if job.state != JobState.PLACING:
            set_state(job, JobState.PLACING)

    for _attempt in range(3):  # a pool filled between the choice and the lock: choose again
        with transaction.atomic():
            job = Job.objects.select_for_update().select_related("accelerator").get(pk=job_id)
            if job.state != JobState.PLACING:
                return PlacementOutcome(job_id, False, f"job is {job.state}")
            choice, decision, reason = _decide(job)
            if choice is None:
                last = job.events.order_by("-id").first()
                set_state(job, JobState.WAITING, waiting_since=job.waiting_since or timezone.now())
                # Told once per rule, not at every retry (a reason's figures change as time
                # passes; the rule changes only when the situation does).
                if (
                    last is None
                    or last.kind != TimelineKind.WAITING
                    or (last.data.get("policy") != decision.rule)
                ):
                    record_event(
                        job, TimelineKind.WAITING, {"reason": reason, "policy": decision.rule}
                    )
                return PlacementOutcome(job_id, False, reason)
            instances = _reserve(job, choice)
            if instances is None:
                continue
            set_state(
                job,
                JobState.STARTING,
                pool_id=choice.pool.id,
                market=choice.pool.market,
                waiting_since=None,
            )
            if choice.pool.market == Market.ON_DEMAND:
                record_event(
                    job,
                    TimelineKind.FALLBACK_ON_DEMAND,
                    {"reason": decision.reason, "policy": decision.rule},
                )
            record_event(
                job,
                TimelineKind.PLACEMENT_DECIDED,
                {
                    "pool": choice.pool.id,
                    "instance_type": choice.pool.instance_type,
                    "region": choice.pool.region,
                    "zone": choice.pool.zone,
                    "market": choice.pool.market,
                    "accelerator": choice.option.accelerator,
                    "gpus_per_instance": choice.option.gpus_per_instance,
                    "substitute": choice.option.substitute,
                    "rule": choice.option.rule_kind,
                    "price_per_hour": choice.pool.price_per_hour,
                    "instances": [i.pk for i in instances],
                    "reason": reason,
                    "policy": decision.rule,
                },
            )
            return PlacementOutcome(job_id, True, reason, choice.pool.id)
    return PlacementOutcome(job_id, False, "capacity kept changing; will retry")


def release_job_instances(job: Job, reason: str) -> int:
    """End every active instance of a job (inside the caller's transaction); frees capacity."""
    from migration.tasks import retry_waiting_jobs_task

    now = timezone.now()
    released = Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).update(
        state=InstanceState.RELEASED, ended_at=now
    )
    if released:
        logger.info("released %d instance(s) of job %s: %s", released, job.pk, reason)
        transaction.on_commit(retry_waiting_jobs_task.delay)
    return released


def jobs_to_retry() -> list[int]:
    """Waiting jobs, migrations first (jobs that ran before), then oldest first."""
    waiting = Job.objects.filter(state=JobState.WAITING).order_by(
        "-interruptions", "waiting_since", "id"
    )
    return list(waiting.values_list("id", flat=True)[:100])


def recover_orphaned_instances() -> list[int]:
    """After a restart, end local instances whose processes died with the last run and send
    their jobs back to placement. Returns the ids of the jobs re-queued."""
    from migration.choices import Backend
    from migration.tasks import place_job_task

    requeued: list[int] = []
    orphans = (
        Instance.objects.filter(state__in=ACTIVE_INSTANCE_STATES, pool__backend=Backend.LOCAL)
        .values_list("job_id", flat=True)
        .distinct()
    )
    for job_id in list(orphans):
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).update(
                state=InstanceState.FAILED, ended_at=timezone.now()
            )
            if job.state in (JobState.STARTING, JobState.RUNNING):
                set_state(job, JobState.MIGRATING)
            if job.state in PLACEABLE_STATES:
                requeued.append(job.pk)
                transaction.on_commit(partial(place_job_task.delay, job.pk))
    return requeued

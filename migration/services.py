"""Capacity actions: place a job, reserve and release instances.

Each service owns its transaction and schedules side effects with `transaction.on_commit`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from jobs.services import set_state
from migration.choices import ACTIVE_INSTANCE_STATES, InstanceState, Market, TimelineKind
from migration.compatibility import Rule, hardware_options
from migration.events import record_event
from migration.models import CapacityPool, CompatibilityRule, Instance
from migration.placement import PlacementChoice, PlacementRequest, PoolView, choose_pool

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
            free=p.free,
            interruption_rate_per_hour=p.interruption_rate_per_hour,
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


def _decide(job: Job) -> tuple[PlacementChoice | None, str]:
    """Spot first; on-demand when spot has no room and the job allows the fallback."""
    pools = pool_views()
    spot = choose_pool(_request(job, Market.SPOT), pools)
    if isinstance(spot, PlacementChoice):
        return spot, spot.reason
    if not job.allow_on_demand_fallback:
        return None, f"{spot.reason}; on-demand fallback is off for this job"
    on_demand = choose_pool(_request(job, Market.ON_DEMAND), pools)
    if isinstance(on_demand, PlacementChoice):
        return on_demand, f"{spot.reason}, so on-demand: {on_demand.reason}"
    return None, f"{spot.reason}; {on_demand.reason}"


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
            choice, reason = _decide(job)
            if choice is None:
                set_state(job, JobState.WAITING, waiting_since=job.waiting_since or timezone.now())
                record_event(job, TimelineKind.WAITING, {"reason": reason})
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
                transaction.on_commit(lambda pk=job.pk: place_job_task.delay(pk))
    return requeued

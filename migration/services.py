"""Capacity actions: place a job, reserve and release instances.

Each service owns its transaction and schedules side effects with `transaction.on_commit`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from costs.services import accrue_job_costs
from jobs.choices import JobState
from jobs.lifecycle import set_state
from jobs.models import Job
from migration.backends import get_backend
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    InstanceState,
    Market,
    MigrationPhase,
    TimelineKind,
)
from migration.events import record_event
from migration.models import CapacityPool, Instance, Migration
from migration.selectors import open_migration, placement_decision, unreachable_pools
from portal.enqueue import enqueue_on_commit
from portal.locks import lock_rows

logger = logging.getLogger(__name__)

# A cancelled job's workload gets this long to exit cleanly before its processes are killed.
STOP_GRACE_S = 10.0
# What an ended instance's agent gets before its group is killed: often the agent is the one
# reporting the end, still waiting for the answer; killing it at once drops that request and,
# with it, the hooks of the transaction that answers it (the placement it queues).
AGENT_GRACE_S = 10.0
PLACEABLE_STATES = (JobState.PENDING, JobState.WAITING, JobState.MIGRATING, JobState.PLACING)


@dataclass(frozen=True)
class PlacementOutcome:
    job_id: int
    placed: bool
    reason: str
    pool_id: int | None = None


def _reserve(job: Job, pool_id: int, migration: Migration | None = None) -> list[Instance] | None:
    """Take `job.nodes` slots of a pool under its row lock, or None if they went."""
    pool = lock_rows(CapacityPool.objects).get(pk=pool_id)
    used = Instance.objects.filter(pool=pool, state__in=ACTIVE_INSTANCE_STATES).count()
    if pool.capacity - used < job.nodes:
        return None
    return [
        Instance.objects.create(pool=pool, job=job, rank=rank, migration=migration)
        for rank in range(job.nodes)
    ]


def reserve_placement(job: Job, migration: Migration) -> tuple[CapacityPool, str] | None:
    """Pre-reserve the gang's next pool for a migration (at an advance notice): the
    instances wait, unlaunched, for the placement to take them. None when nothing fits."""
    choice, _decision, reason = placement_decision(job)
    if choice is None:
        return None
    if _reserve(job, choice.pool.id, migration) is None:
        return None
    return CapacityPool.objects.get(pk=choice.pool.id), reason


def _take_reserved(
    job: Job, migration: Migration | None
) -> tuple[CapacityPool, list[Instance]] | None:
    """Instances pre-reserved for the migration, if their pool can still take the job."""
    if migration is None:
        return None
    reserved = list(
        Instance.objects.filter(
            job=job,
            migration=migration,
            state=InstanceState.PROVISIONING,
            launched_at__isnull=True,
        ).select_related("pool__region", "pool__accelerator")
    )
    if not reserved:
        return None
    pool = reserved[0].pool
    usable = pool.enabled and not (job.on_demand_only and pool.market == Market.SPOT)
    if len(reserved) == job.nodes and usable:
        return pool, reserved
    for instance in reserved:
        end_instance(instance, InstanceState.RELEASED)
    return None


def _pool_data(pool: CapacityPool, reason: str) -> dict[str, Any]:
    return {
        "pool": pool.pk,
        "instance_type": pool.instance_type,
        "region": pool.region.code,
        "zone": pool.zone,
        "market": pool.market,
        "accelerator": pool.accelerator.name,
        "gpus_per_instance": pool.gpus_per_instance,
        "substitute": False,
        "rule": None,
        "price_per_hour": float(pool.price_per_hour),
        "reason": reason,
    }


def _placed(
    job: Job,
    migration: Migration | None,
    pool: CapacityPool,
    instances: list[Instance],
    data: dict[str, Any],
) -> None:
    """The job has its instances: starting, `placement_decided`, and its start queued."""
    set_state(job, JobState.STARTING, pool_id=pool.pk, market=pool.market, waiting_since=None)
    if migration is not None:
        migration.to_pool = pool
        migration.phase = MigrationPhase.REPLICATING
        migration.save(update_fields=["to_pool", "phase"])
    record_event(
        job,
        TimelineKind.PLACEMENT_DECIDED,
        {**data, "instances": [i.pk for i in instances]},
        migration=migration,
    )
    enqueue_on_commit("migration.tasks.start_job_task", job.pk)


def place_job(job_id: int) -> PlacementOutcome:
    """Choose a pool for a job and reserve it; the job goes placing -> starting, or waiting.

    A migrating job takes the pool pre-reserved at its advance notice when there is one.
    Safe to run twice: a job that is not waiting for placement is left alone.
    """
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=job_id)
        if job.state not in PLACEABLE_STATES:
            return PlacementOutcome(job_id, False, f"job is {job.state}")
        if job.state != JobState.PLACING:
            set_state(job, JobState.PLACING)

    for _attempt in range(3):  # a pool filled between the choice and the lock: choose again
        with transaction.atomic():
            job = lock_rows(Job.objects).select_related("accelerator").get(pk=job_id)
            if job.state != JobState.PLACING:
                return PlacementOutcome(job_id, False, f"job is {job.state}")
            migration = open_migration(job)
            reserved = _take_reserved(job, migration)
            if reserved is not None:
                pool, instances = reserved
                reason = "the pool pre-reserved at the advance notice"
                _placed(job, migration, pool, instances, _pool_data(pool, reason))
                return PlacementOutcome(job_id, True, reason, pool.pk)
            choice, decision, reason = placement_decision(
                job, exclude_pools=unreachable_pools(migration)
            )
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
                        job,
                        TimelineKind.WAITING,
                        {"reason": reason, "policy": decision.rule},
                        migration=migration,
                    )
                return PlacementOutcome(job_id, False, reason)
            taken = _reserve(job, choice.pool.id, migration)
            if taken is None:
                continue
            if choice.pool.market == Market.ON_DEMAND:
                record_event(
                    job,
                    TimelineKind.FALLBACK_ON_DEMAND,
                    {"reason": decision.reason, "policy": decision.rule},
                    migration=migration,
                )
            pool = CapacityPool.objects.select_related("region", "accelerator").get(
                pk=choice.pool.id
            )
            data = {
                **_pool_data(pool, reason),
                "accelerator": choice.option.accelerator,
                "gpus_per_instance": choice.option.gpus_per_instance,
                "substitute": choice.option.substitute,
                "rule": choice.option.rule_kind,
                "policy": decision.rule,
            }
            _placed(job, migration, pool, taken, data)
            return PlacementOutcome(job_id, True, reason, choice.pool.id)
    return PlacementOutcome(job_id, False, "capacity kept changing; will retry")


def end_instance(
    instance: Instance, state: str, revoke: bool = True, grace_s: float = AGENT_GRACE_S
) -> None:
    """Mark an active instance ended (its slot frees) and stop its processes after commit:
    SIGTERM, then SIGKILL after `grace_s` (0: at once, as a cloud reclaims); `revoke` refuses
    its agent's token from now on."""
    if instance.state not in ACTIVE_INSTANCE_STATES:
        return
    instance.state = state
    instance.ended_at = timezone.now()
    if revoke:
        instance.agent_token_hash = None
    instance.save(update_fields=["state", "ended_at", "agent_token_hash"])
    release_process(instance, grace_s)
    accrue_job_costs(instance.job)
    enqueue_on_commit("migration.tasks.retry_waiting_jobs_task")  # a slot is free


def release_process(instance: Instance, grace_s: float) -> None:
    """Stop the instance's processes after commit (the backend is idempotent)."""

    if instance.launched_at is None:  # reserved, never started: nothing to stop
        return

    def release() -> None:
        try:
            get_backend(instance.pool.backend).release(instance, grace_s=grace_s)
        except Exception:  # the sweep finds what is left
            logger.exception("releasing instance %s failed", instance.pk)

    transaction.on_commit(release, robust=True)


def finish_migration(migration: Migration, phase: str) -> None:
    """Close a migration and write the seconds each step took, from its timeline."""
    now = timezone.now()
    events = list(migration.events.order_by("id").values_list("kind", "at"))
    timings: dict[str, float] = {}
    previous = migration.started_at
    for kind, at in events:
        timings[kind] = round(timings.get(kind, 0.0) + (at - previous).total_seconds(), 3)
        previous = at
    timings["total"] = round((now - migration.started_at).total_seconds(), 3)
    migration.phase = phase
    migration.finished_at = now
    migration.timings = timings
    migration.save(update_fields=["phase", "finished_at", "timings"])


def release_job_instances(job: Job, reason: str) -> int:
    """End every active instance of a job and stop its processes (inside the caller's
    transaction, the job locked); frees capacity for waiting jobs."""
    instances = list(
        Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).select_related("pool")
    )
    for instance in instances:
        end_instance(instance, InstanceState.RELEASED, grace_s=STOP_GRACE_S)
    migration = open_migration(job)
    if migration is not None:
        finish_migration(migration, MigrationPhase.FAILED)
    if instances:
        logger.info("released %d instance(s) of job %s: %s", len(instances), job.pk, reason)
    return len(instances)


def jobs_to_retry() -> list[int]:
    """Waiting jobs, migrations first (jobs that ran before), then oldest first."""
    waiting = Job.objects.filter(state=JobState.WAITING).order_by(
        "-interruptions", "waiting_since", "id"
    )
    return list(waiting.values_list("id", flat=True)[:100])

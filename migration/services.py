"""Capacity actions: place a job, reserve and release instances.

Each service owns its transaction and schedules side effects with `transaction.on_commit`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial

from django.db import transaction
from django.utils import timezone

from jobs.choices import JobState
from jobs.lifecycle import set_state
from jobs.models import Job
from migration.choices import ACTIVE_INSTANCE_STATES, InstanceState, Market, TimelineKind
from migration.events import record_event
from migration.models import CapacityPool, Instance
from migration.placement import PlacementChoice
from migration.selectors import placement_decision

logger = logging.getLogger(__name__)

PLACEABLE_STATES = (JobState.PENDING, JobState.WAITING, JobState.MIGRATING, JobState.PLACING)


@dataclass(frozen=True)
class PlacementOutcome:
    job_id: int
    placed: bool
    reason: str
    pool_id: int | None = None


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
            choice, decision, reason = placement_decision(job)
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

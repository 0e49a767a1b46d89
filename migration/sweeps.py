"""What beat checks every few seconds: instances that went silent or never started, reclaims
that are overdue, jobs a lost task left behind, tokens of ended agents, and costs so far.

Each finding is handled in its own transaction with the job's row locked first, so a sweep
racing an agent's report or a task sees one consistent state and does nothing twice.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from costs.services import accrue_job_costs
from jobs.choices import JobState
from jobs.models import Job
from migration import interruptions, orchestration
from migration.backends import get_backend
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    InstanceState,
    MigrationPhase,
    MigrationTrigger,
)
from migration.models import Instance
from migration.selectors import market_review, open_migration
from portal.enqueue import enqueue_on_commit
from portal.locks import lock_rows

logger = logging.getLogger(__name__)

# A job left in one of these states this long without a change lost its task: queue it again.
STUCK_AFTER = timedelta(seconds=15)
RECLAIM_SLACK = timedelta(seconds=2)
# A job moved by the deadline rule stays put at least this long (no flapping between markets).
REVIEW_SPACING = timedelta(minutes=5)


def _gone_from_backend(instance: Instance) -> bool:
    try:
        return get_backend(instance.pool.backend).describe(instance).state == "gone"
    except Exception:
        logger.exception("describing instance %s failed", instance.pk)
        return False


def _end(instance_id: int, reason: str) -> bool:
    """Declare one instance gone (lost or failed to start), under the job's lock first."""
    job_id = Instance.objects.values_list("job_id", flat=True).get(pk=instance_id)
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=job_id)
        instance = lock_rows(Instance.objects).select_related("pool").get(pk=instance_id)
        if instance.state not in ACTIVE_INSTANCE_STATES:
            return False
        logger.warning("instance %s of job %s is %s", instance.pk, job.pk, reason)
        orchestration.instance_gone(job, instance, reason=reason)
        return True


def lost_instances() -> int:
    """Running instances whose heartbeats stopped, or whose processes are gone."""
    now = timezone.now()
    silent_since = now - timedelta(seconds=settings.BATON_HEARTBEAT_TIMEOUT_SECONDS)
    running = Instance.objects.filter(state=InstanceState.RUNNING).select_related("pool")
    silent = set(
        running.annotate(heard=Coalesce("last_heartbeat", "started_at"))
        .filter(heard__lt=silent_since)
        .values_list("pk", flat=True)
    )
    found = silent | {i.pk for i in running.exclude(pk__in=silent) if _gone_from_backend(i)}
    return sum(_end(pk, "lost") for pk in sorted(found))


def unstarted_instances() -> int:
    """Launched instances whose agent never reported: timed out, or the process is gone."""
    now = timezone.now()
    launched = Instance.objects.filter(
        state=InstanceState.PROVISIONING, launched_at__isnull=False
    ).select_related("pool")
    found = []
    for instance in launched:
        assert instance.launched_at is not None
        waited = (now - instance.launched_at).total_seconds()
        limit = instance.pool.provisioning_delay_s + settings.BATON_START_TIMEOUT_SECONDS
        if waited > limit or (waited > 1 and _gone_from_backend(instance)):
            found.append(instance.pk)
    return sum(_end(pk, "start_failed") for pk in found)


def overdue_reclaims() -> int:
    """Interrupted instances still held after their reclaim time (a lost reclaim task)."""
    overdue = Instance.objects.filter(
        state__in=ACTIVE_INSTANCE_STATES, reclaim_at__lt=timezone.now() - RECLAIM_SLACK
    ).values_list("pk", flat=True)
    return sum(interruptions.reclaim_instance(pk) for pk in list(overdue))


def stuck_jobs() -> int:
    """Jobs whose placement or start task was lost: queue it again (both are idempotent)."""
    before = timezone.now() - STUCK_AFTER
    stale = Job.objects.filter(updated_at__lt=before)
    count = 0
    for job_id in stale.filter(state__in=(JobState.PENDING, JobState.PLACING)).values_list(
        "pk", flat=True
    ):
        enqueue_on_commit("migration.tasks.place_job_task", job_id)
        count += 1
    for job in stale.filter(state__in=(JobState.STARTING, JobState.MIGRATING)):
        if job.state == JobState.STARTING and job.instances.filter(
            state=InstanceState.PROVISIONING, launched_at__isnull=True
        ):
            enqueue_on_commit("migration.tasks.start_job_task", job.pk)
            count += 1
        migration = open_migration(job)
        if (
            job.state == JobState.MIGRATING
            and migration
            and migration.phase == MigrationPhase.PLACING
        ):
            enqueue_on_commit("migration.tasks.place_job_task", job.pk)
            count += 1
    return count


def stale_tokens() -> int:
    """Revoke the tokens of agents that exited a while ago (their last lines have landed)."""
    ended = timezone.now() - timedelta(seconds=orchestration.TOKEN_GRACE_S)
    return (
        Instance.objects.filter(agent_token_hash__isnull=False)
        .filter(~Q(state__in=ACTIVE_INSTANCE_STATES), ended_at__lt=ended)
        .update(agent_token_hash=None)
    )


def review_markets() -> int:
    """Running jobs with a deadline whose market the deadline rule now says to change: move
    them (trigger `policy`), at most once per REVIEW_SPACING."""
    quiet_since = timezone.now() - REVIEW_SPACING
    candidates = Job.objects.filter(
        state=JobState.RUNNING, deadline__isnull=False, on_demand_only=False
    ).exclude(migrations__finished_at__gt=quiet_since)
    moved = 0
    for job_id in list(candidates.values_list("pk", flat=True)):
        job = Job.objects.select_related("accelerator").get(pk=job_id)
        decision = market_review(job)  # outside the write transaction: it reads many pools
        if decision is None:
            continue
        with transaction.atomic():
            job = lock_rows(Job.objects).get(pk=job_id)
            if orchestration.start_planned_migration(job, MigrationTrigger.POLICY, decision.reason):
                moved += 1
    return moved


def accrue_costs() -> int:
    """Cost so far of every job holding capacity now."""
    jobs = Job.objects.filter(instances__state__in=ACTIVE_INSTANCE_STATES).distinct()
    for job in jobs:
        accrue_job_costs(job)
    return jobs.count()


def recover_local_instances() -> list[int]:
    """At start-up: instances of the local backend still marked active were left by a run that
    ended without stopping them (a crash). End what is left of their processes and let their
    jobs migrate from their last checkpoints. Returns the ids of the jobs moved."""
    orphans = Instance.objects.filter(
        state__in=ACTIVE_INSTANCE_STATES, pool__backend="local"
    ).select_related("pool")
    moved = set()
    for instance in orphans:
        get_backend(instance.pool.backend).release(instance)
        if _end(instance.pk, "lost"):
            moved.add(instance.job_id)
    return sorted(moved)


def sweep() -> dict[str, int]:
    """One round of every check; returns what each found."""
    return {
        "lost": lost_instances(),
        "unstarted": unstarted_instances(),
        "reclaimed": overdue_reclaims(),
        "requeued": stuck_jobs(),
        "policy": review_markets(),
        "revoked": stale_tokens(),
        "costed": accrue_costs(),
    }

"""Interruptions from outside the instance: a staff member's "interrupt" (the API and the
admin), the market simulator, and the reclaim that follows a final notice.

An interruption is a schedule on the instance (advance notice, final notice, reclaim) that its
metadata endpoint serves, so the agent on the instance sees it exactly as it would see AWS's:
the agent reports the notices, and the migration follows from its reports
(`migration.orchestration`). At the reclaim time the capacity is taken away whatever the agent
did, as a cloud would.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from jobs.models import Job
from migration import orchestration
from migration.choices import ACTIVE_INSTANCE_STATES, InstanceState
from migration.models import Instance
from portal.enqueue import enqueue_on_commit
from portal.locks import lock_rows

logger = logging.getLogger(__name__)


class InstanceNotRunning(Exception):
    """Only a running instance can be interrupted."""


def interrupt_instance(
    instance_id: int, advance_notice_s: float, final_window_s: float, source: str = "manual"
) -> Instance:
    """Schedule the two-level notice on a running instance: the advance notice at once when
    `advance_notice_s` > 0, the final notice that many seconds later, and the reclaim
    `final_window_s` after the final notice. Raises InstanceNotRunning otherwise.
    """
    job_id = Instance.objects.filter(pk=instance_id).values_list("job_id", flat=True).first()
    if job_id is None:
        raise Instance.DoesNotExist(f"instance {instance_id} does not exist")
    with transaction.atomic():
        # Lock order everywhere: the job, then its instances.
        lock_rows(Job.objects).filter(pk=job_id).values_list("pk").first()
        instance = lock_rows(Instance.objects).get(pk=instance_id)
        if instance.state != InstanceState.RUNNING:
            raise InstanceNotRunning(f"instance {instance.pk} is {instance.state}, not running")
        if instance.final_notice_at is not None:
            raise InstanceNotRunning(f"instance {instance.pk} is already under a final notice")
        now = timezone.now()
        final_at = now + timedelta(seconds=advance_notice_s)
        if advance_notice_s > 0:
            instance.advance_notice_at = now
        instance.final_notice_at = final_at
        instance.reclaim_at = final_at + timedelta(seconds=final_window_s)
        instance.save(update_fields=["advance_notice_at", "final_notice_at", "reclaim_at"])
        logger.info(
            "instance %s interrupted (%s): final notice at %s, reclaimed at %s",
            instance.pk,
            source,
            instance.final_notice_at.isoformat(),
            instance.reclaim_at.isoformat(),
        )
        enqueue_on_commit(
            "migration.tasks.reclaim_instance_task",
            instance.pk,
            countdown=advance_notice_s + final_window_s,
        )
        return instance


def reclaim_instance(instance_id: int) -> bool:
    """Take the instance away once its reclaim time has come (safe to run twice, and early:
    it waits for the time). True when it ended the instance now."""
    job_id = Instance.objects.filter(pk=instance_id).values_list("job_id", flat=True).first()
    if job_id is None:
        return False
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=job_id)
        instance = lock_rows(Instance.objects).select_related("pool").get(pk=instance_id)
        if instance.state not in ACTIVE_INSTANCE_STATES or instance.reclaim_at is None:
            return False
        if instance.reclaim_at > timezone.now():
            left = (instance.reclaim_at - timezone.now()).total_seconds()
            enqueue_on_commit("migration.tasks.reclaim_instance_task", instance.pk, countdown=left)
            return False
        orchestration.instance_gone(job, instance, reason="reclaimed")
        return True

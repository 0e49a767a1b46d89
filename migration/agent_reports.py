"""What agents report, turned into state: heartbeats, notices, checkpoints, restores, results,
exits and log lines (the portal side of the agent API in docs/instance-side.md).

Events of one instance carry increasing `seq` numbers; a batch re-sent after a lost answer is
applied once. Each batch is one transaction under the instance's row lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.choices import JobState
from jobs.lifecycle import is_finished
from jobs.models import Job
from migration import orchestration, replication
from migration.checkpoint import ManifestRef, StoreConfigError
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    CheckpointKind,
    CheckpointStatus,
    InstanceState,
    InterruptionLevel,
)
from migration.events import broadcast
from migration.models import Checkpoint, Instance, InterruptionEvent, LogLine
from portal.enqueue import enqueue_on_commit
from portal.locks import lock_rows

logger = logging.getLogger(__name__)

MAX_LINE_CHARS = 4000


def _when(event: dict[str, Any]) -> datetime:
    parsed = parse_datetime(str(event.get("at") or ""))
    if parsed is None:
        return timezone.now()
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


def _started(instance: Instance, job: Job, at: datetime) -> None:
    """First word from an agent: its instance runs (the job, once the gang is ready)."""
    if instance.state != InstanceState.PROVISIONING:
        return
    instance.state = InstanceState.RUNNING
    instance.started_at = at
    instance.save(update_fields=["state", "started_at"])
    orchestration.on_started(job, instance)


def _self_check(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    instance.self_check = {k: v for k, v in event.items() if k not in {"seq", "type"}}
    _started(instance, job, _when(event))
    if event.get("ok") is False:
        _abnormal(instance, job, "its self-check failed")


def _heartbeat(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    instance.last_heartbeat = _when(event)
    _started(instance, job, instance.last_heartbeat)
    if event.get("listener") not in (None, "ok"):
        _abnormal(instance, job, f"its listener is {event.get('listener')}")
    _progress(instance, job, event)


def _progress(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    step = event.get("step")
    if (
        instance.rank != 0
        or instance.state not in ACTIVE_INSTANCE_STATES
        or not isinstance(step, int)
        or step < 0
    ):
        return
    job.step = step
    job.save(update_fields=["step", "updated_at"])
    payload = {"job": job.pk, "step": step, "val_loss": event.get("val_loss")}
    transaction.on_commit(lambda: broadcast(job.pk, "job.progress", payload), robust=True)


def _notice(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    level = event.get("level")
    if level not in InterruptionLevel.values:
        logger.warning("instance %s sent a notice of unknown level %r", instance.pk, level)
        return
    deadline = parse_datetime(str(event.get("deadline") or ""))
    InterruptionEvent.objects.create(
        instance=instance,
        level=level,
        received_at=_when(event),
        deadline_at=deadline,
        source=str(event.get("source") or "imds")[:32],
    )
    orchestration.on_notice(
        job, instance, level, event.get("deadline"), str(event.get("source") or "imds")
    )


def _checkpoint(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    manifest = str(event.get("manifest") or "")
    kind = event.get("kind")
    try:
        ref = ManifestRef.parse(manifest)
    except StoreConfigError:
        ref = None
    if ref is None or ref.job != job.checkpoint_key or kind not in CheckpointKind.values:
        logger.warning("instance %s sent a malformed checkpoint report: %s", instance.pk, event)
        return
    checkpoint, _ = Checkpoint.objects.update_or_create(
        job=job,
        manifest_key=manifest,
        defaults={
            "step": int(event.get("step") or 0),
            "kind": kind,
            "status": CheckpointStatus.COMMITTED,
            "region": instance.pool.region,
            "bytes_total": int(event.get("bytes_total") or 0),
            "bytes_new": int(event.get("bytes_new") or 0),
            "validation_reference": event.get("validation_reference"),
        },
    )
    orchestration.on_checkpoint(job, instance, checkpoint)
    if replication.rank_rows_complete(checkpoint):  # every rank has it: copies go out now
        first = replication.rank_zero_row(checkpoint)
        replication.record_home(first)
        enqueue_on_commit("migration.tasks.replicate_checkpoint_task", first.pk)


def _restore(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    orchestration.on_restore(job, instance, event)


def _result(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    if instance.rank == 0 and instance.state in ACTIVE_INSTANCE_STATES:
        job.result = {k: event.get(k) for k in ("step", "val_loss", "weights_sha256")}
        job.save(update_fields=["result", "updated_at"])


def _abnormal(instance: Instance, job: Job, why: str) -> None:
    if not instance.awareness_abnormal:
        instance.awareness_abnormal = True
        orchestration.awareness_lost(job, instance, why)


def _listener_failed(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    if event.get("recovered") is False:
        _abnormal(instance, job, f"its listener failed for good ({event.get('error')})")


def _restore_failed(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    orchestration.restore_failed(job, instance, str(event.get("error") or "restore failed"))


def _exit(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    """The workload ended: finished ranks free their slot and the job succeeds with the last
    of them; a failure right after a restore is a failed restore (roll back); any other
    failure fails the job; a preempted rank migrates it."""
    reason = event.get("reason")
    if instance.state not in ACTIVE_INSTANCE_STATES or is_finished(job.state):
        return
    if reason == "finished":
        orchestration.end_instance(instance, InstanceState.RELEASED, revoke=False)
        orchestration.finish_job(job)
    elif reason == "failed" and orchestration.in_restore(job, instance):
        error = event.get("error") or f"exited with {event.get('returncode')} after the restore"
        orchestration.restore_failed(job, instance, str(error))
    elif reason == "failed" and job.state == JobState.RUNNING:
        error = event.get("error") or f"rank {instance.rank} exited with {event.get('returncode')}"
        orchestration.fail_job(job, str(error), failed=instance)
    else:
        orchestration.instance_gone(job, instance, reason="preempted")


HANDLERS: dict[str, Callable[[Instance, Job, dict[str, Any]], None]] = {
    "self_check": _self_check,
    "heartbeat": _heartbeat,
    "progress": _progress,
    "notice": _notice,
    "checkpoint": _checkpoint,
    "restore": _restore,
    "result": _result,
    "listener_failed": _listener_failed,
    "restore_failed": _restore_failed,
    "exit": _exit,
}


def record_agent_events(instance_id: int, events: list[dict[str, Any]]) -> int:
    """Apply a batch of events in `seq` order, each at most once; return the highest seq seen."""
    job_id = Instance.objects.values_list("job_id", flat=True).get(pk=instance_id)
    with transaction.atomic():
        # Lock order everywhere: the job, then its instances (as cancel and the migration do).
        job = lock_rows(Job.objects).get(pk=job_id)
        instance = lock_rows(Instance.objects).select_related("pool__region").get(pk=instance_id)
        for event in sorted(events, key=lambda e: e["seq"]):
            if event["seq"] <= instance.last_event_seq:
                continue
            handler = HANDLERS.get(event["type"])
            if handler is None:
                logger.info("instance %s: ignoring event type %r", instance.pk, event["type"])
            else:
                handler(instance, job, event)
            instance.last_event_seq = event["seq"]
        # State changes were saved where they happened; a stale copy must not undo them.
        instance.save(
            update_fields=["last_event_seq", "last_heartbeat", "self_check", "awareness_abnormal"]
        )
        return instance.last_event_seq


def record_log_lines(instance_id: int, lines: list[dict[str, Any]], dropped: int = 0) -> int:
    """Store a batch of workload output lines of one instance (and say how many were lost)."""
    instance = Instance.objects.get(pk=instance_id)
    now = timezone.now()
    rows = [
        LogLine(
            job_id=instance.job_id,
            instance=instance,
            rank=int(line.get("rank", instance.rank)),
            at=_when(line) if line.get("at") else now,
            line=str(line.get("line", ""))[:MAX_LINE_CHARS],
        )
        for line in lines
    ]
    if dropped:
        rows.append(
            LogLine(
                job_id=instance.job_id,
                instance=instance,
                rank=instance.rank,
                at=now,
                line=f"[baton: {dropped} line(s) dropped by the agent's bounded buffer]",
            )
        )
    LogLine.objects.bulk_create(rows)
    payload = {"lines": [{"rank": r.rank, "line": r.line} for r in rows]}
    broadcast(instance.job_id, "log.lines", payload)
    return len(rows)

"""What agents report, turned into state: heartbeats, notices, checkpoints, restores, results,
exits and log lines (the portal side of the agent API in docs/instance-side.md).

Events of one instance carry increasing `seq` numbers; a batch re-sent after a lost answer is
applied once. Each batch is one transaction under the instance's row lock.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.choices import JobState
from jobs.lifecycle import is_finished, set_state
from jobs.models import Job
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    CheckpointKind,
    CheckpointStatus,
    InstanceState,
    InterruptionLevel,
    TimelineKind,
)
from migration.events import broadcast, record_event
from migration.models import Checkpoint, Instance, InterruptionEvent, LogLine

logger = logging.getLogger(__name__)

MAX_LINE_CHARS = 4000


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_agent_token(instance: Instance) -> str:
    """A new secret for the instance's agent; only its hash is stored."""
    token = secrets.token_urlsafe(32)
    instance.agent_token_hash = token_hash(token)
    instance.save(update_fields=["agent_token_hash"])
    return token


def instance_for_token(token: str) -> Instance | None:
    return Instance.objects.filter(agent_token_hash=token_hash(token)).first()


def _when(event: dict[str, Any]) -> datetime:
    parsed = parse_datetime(str(event.get("at") or ""))
    if parsed is None:
        return timezone.now()
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


def _started(instance: Instance, job: Job, at: datetime) -> None:
    """First word from an agent: its instance runs; the job runs once every rank does."""
    if instance.state != InstanceState.PROVISIONING:
        return
    instance.state = InstanceState.RUNNING
    instance.started_at = at
    record_event(
        job,
        TimelineKind.INSTANCE_STARTED,
        {"instance": instance.pk, "rank": instance.rank, "pool": instance.pool_id},
    )
    others = Instance.objects.filter(job=job, state=InstanceState.PROVISIONING).exclude(
        pk=instance.pk
    )
    if job.state == JobState.STARTING and not others.exists():
        set_state(job, JobState.RUNNING)
        record_event(job, TimelineKind.RUNNING, {"pool": job.pool_id, "market": job.market})


def _self_check(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    instance.self_check = {k: v for k, v in event.items() if k not in {"seq", "type"}}
    if event.get("ok") is False:
        instance.awareness_abnormal = True
    _started(instance, job, _when(event))


def _heartbeat(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    instance.last_heartbeat = _when(event)
    if event.get("listener") not in (None, "ok"):
        instance.awareness_abnormal = True
    _started(instance, job, instance.last_heartbeat)
    _progress(instance, job, event)


def _progress(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    step = event.get("step")
    if instance.rank != 0 or not isinstance(step, int) or step < 0:
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
    kind = (
        TimelineKind.NOTICE_ADVANCE
        if level == InterruptionLevel.ADVANCE
        else TimelineKind.NOTICE_FINAL
    )
    record_event(
        job,
        kind,
        {
            "instance": instance.pk,
            "rank": instance.rank,
            "deadline": event.get("deadline"),
            "source": event.get("source"),
        },
    )


def _checkpoint(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    manifest = str(event.get("manifest") or "")
    kind = event.get("kind")
    if not manifest or kind not in CheckpointKind.values:
        logger.warning("instance %s sent an incomplete checkpoint report: %s", instance.pk, event)
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
    if kind == CheckpointKind.EMERGENCY:  # periodic ones are listed, not told (DESIGN §9)
        record_event(
            job,
            TimelineKind.CHECKPOINT_COMMITTED,
            {
                "checkpoint": checkpoint.pk,
                "step": checkpoint.step,
                "manifest": manifest,
                "bytes_new": checkpoint.bytes_new,
                "rank": instance.rank,
            },
        )


def _restore(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    record_event(
        job,
        TimelineKind.RESTORE_DONE,
        {
            "instance": instance.pk,
            "rank": instance.rank,
            "manifest": event.get("manifest"),
            "step": event.get("step"),
            "val_loss": event.get("val_loss"),
            "reference": event.get("reference"),
        },
    )


def _result(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    if instance.rank == 0:
        job.result = {k: event.get(k) for k in ("step", "val_loss", "weights_sha256")}
        job.save(update_fields=["result", "updated_at"])


def _listener_failed(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    if event.get("recovered") is False:
        instance.awareness_abnormal = True


def _exit(instance: Instance, job: Job, event: dict[str, Any]) -> None:
    """The workload ended: finished ranks release their slot; a failed rank fails the job."""
    reason = event.get("reason")
    if instance.state in ACTIVE_INSTANCE_STATES:
        instance.state = InstanceState.FAILED if reason == "failed" else InstanceState.RELEASED
        instance.ended_at = _when(event)
    if is_finished(job.state) or reason == "preempted":
        return  # a preempted rank is the migration's business
    if reason == "failed":
        Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).exclude(
            pk=instance.pk
        ).update(state=InstanceState.RELEASED, ended_at=timezone.now())
        error = event.get("error") or f"rank {instance.rank} exited with {event.get('returncode')}"
        set_state(job, JobState.FAILED, error=str(error)[:2000])
        record_event(job, TimelineKind.FAILED, {"rank": instance.rank, "error": error})
        return
    still_running = Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).exclude(
        pk=instance.pk
    )
    if (
        reason == "finished"
        and job.result
        and not still_running.exists()
        and job.state == JobState.RUNNING
    ):
        set_state(job, JobState.SUCCEEDED, step=job.result.get("step") or job.step)
        record_event(job, TimelineKind.SUCCEEDED, dict(job.result))


HANDLERS: dict[str, Callable[[Instance, Job, dict[str, Any]], None]] = {
    "self_check": _self_check,
    "heartbeat": _heartbeat,
    "progress": _progress,
    "notice": _notice,
    "checkpoint": _checkpoint,
    "restore": _restore,
    "result": _result,
    "listener_failed": _listener_failed,
    "exit": _exit,
}


def record_agent_events(instance_id: int, events: list[dict[str, Any]]) -> int:
    """Apply a batch of events in `seq` order, each at most once; return the highest seq seen."""
    with transaction.atomic():
        instance = (
            Instance.objects.select_for_update().select_related("pool__region").get(pk=instance_id)
        )
        job = Job.objects.select_for_update().get(pk=instance.job_id)
        for event in sorted(events, key=lambda e: e["seq"]):
            if event["seq"] <= instance.last_event_seq:
                continue
            handler = HANDLERS.get(event["type"])
            if handler is None:
                logger.info("instance %s: ignoring event type %r", instance.pk, event["type"])
            else:
                handler(instance, job, event)
            instance.last_event_seq = event["seq"]
        instance.save()
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

"""The migration of a job (DESIGN §4): from the notice to running again, as services.

Everything here runs inside the caller's transaction with the job's row locked (the agent API,
the reclaim, the sweeps), except `start_job`, which owns its transactions because it copies a
checkpoint and starts processes. Side effects on processes (launch, release) and tasks are
scheduled after commit, so a rolled-back decision never leaves a process behind.

A migration, as timeline events: notice_advance -> notice_final -> checkpoint_started ->
checkpoint_committed | checkpoint_missed -> released -> placement_decided -> replica_ready ->
instance_started -> restore_done -> validation_passed | (validation_failed -> rollback ->
restore_done ...) -> running. `Migration.timings` gets the seconds each step took.
"""

from __future__ import annotations

import logging
import math
import socket
import sys
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from jobs.choices import JobState
from jobs.lifecycle import is_finished, set_state
from jobs.models import Job
from jobs.workloads.catalog import TEMPLATES
from migration.agent_tokens import issue_agent_token
from migration.backends import AgentSpec, get_backend, instance_dir, provisioning_delay
from migration.checkpoint import ManifestRef
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    CheckpointKind,
    CheckpointStatus,
    InstanceState,
    Market,
    MigrationPhase,
    MigrationTrigger,
    TimelineKind,
)
from migration.events import record_event
from migration.imds import metadata_url
from migration.models import CapacityPool, Checkpoint, Instance, Migration
from migration.replication import (
    CopyOutcome,
    ReplicationFailed,
    copy_to_region,
    holders,
    verify_replica,
)
from migration.selectors import UNREACHABLE, checkpoint_rank, complete_checkpoints, open_migration
from migration.services import (
    AGENT_GRACE_S,
    end_instance,
    finish_migration,
    release_process,
    reserve_placement,
)
from migration.stores import region_store
from portal.enqueue import enqueue_on_commit
from portal.locks import lock_rows

logger = logging.getLogger(__name__)

# What a workload gets to finish its emergency checkpoint when Baton itself moves it (policy,
# awareness, manual): the agent's grace period, then the process group is killed.
PLANNED_STOP_GRACE_S = 20.0
# An agent's final events and log lines still land this long after its workload exited.
TOKEN_GRACE_S = 30.0


# -- reads ---------------------------------------------------------------------------------------


def _active(job: Job) -> QuerySet[Instance]:
    return Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES)


def _current_ranks(job: Job, migration: Migration | None) -> QuerySet[Instance]:
    """Active instances running the job now: not the ones placed for `migration`."""
    active = _active(job)
    return active.exclude(migration=migration) if migration is not None else active


def _has_event(migration: Migration, kind: str) -> bool:
    return migration.events.filter(kind=kind).exists()


def _replica_ready_for_placement(migration: Migration) -> bool:
    """Whether the checkpoint was made ready for the migration's latest placement (a rollback
    or a new attempt places the job again, maybe in another region)."""
    placed = migration.events.filter(kind=TimelineKind.PLACEMENT_DECIDED).order_by("-id").first()
    ready = migration.events.filter(kind=TimelineKind.REPLICA_READY)
    return (ready.filter(id__gt=placed.pk) if placed else ready).exists()


# -- launching ------------------------------------------------------------------------------------


def _free_port() -> int:
    """A port for the gang's rank 0 (torch.distributed's rendezvous)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def workload_command(job: Job, resuming: bool) -> tuple[list[str], str]:
    """The workload's command and the agent mode it runs in (sdk or directory)."""
    workload = job.workload
    template = TEMPLATES.get(workload.get("template", ""))
    if template is not None:
        return template.argv(job.total_steps, workload.get("params") or {}), (
            "sdk" if template.sdk else "directory"
        )
    command = [str(part) for part in workload["command"]]
    if resuming:
        command += [str(part) for part in workload.get("resume_args") or []]
    return command, "directory"


def agent_spec(instance: Instance, token: str, master_port: int) -> AgentSpec:
    """What the backend runs for one instance: the agent, its workload and DESIGN §5's
    environment."""
    job = instance.job
    folder = instance_dir(instance.pk)
    command, mode = workload_command(job, bool(instance.resume_manifest))
    every_seconds = job.checkpoint_every_seconds
    if every_seconds is None and job.checkpoint_every_steps is None:
        every_seconds = settings.BATON_DEFAULT_CHECKPOINT_SECONDS
    environ = {
        "BATON_JOB_ID": job.checkpoint_key,
        "BATON_RANK": str(instance.rank),
        "BATON_WORLD_SIZE": str(job.nodes),
        "BATON_MASTER_ADDR": "127.0.0.1",
        "BATON_MASTER_PORT": str(master_port),
        "BATON_CHECKPOINT_DIR": str(folder / "checkpoint"),
        # Two tiers: snapshots go to the instance's own disk first, then to its region's store.
        "BATON_LOCAL_STORE_URL": (folder / "local-store").as_uri(),
        **region_store(instance.pool.region.code, job.project.slug).environ(),
        "BATON_RESUME": instance.resume_manifest,
        "BATON_METADATA_URL": metadata_url(instance.pk),
        "BATON_PORTAL_URL": settings.BATON_PUBLIC_URL,
        "BATON_AGENT_TOKEN": token,
        "BATON_AGENT_MODE": mode,
        "BATON_AGENT_DIR": str(folder / "agent"),
        "BATON_AGENT_POLL_INTERVAL": str(settings.BATON_AGENT_POLL_SECONDS),
        "BATON_AGENT_HEARTBEAT_INTERVAL": str(settings.BATON_AGENT_HEARTBEAT_SECONDS),
        "BATON_AGENT_GRACE_PERIOD": str(PLANNED_STOP_GRACE_S),
        "BATON_INSTANCE_ID": str(instance.pk),
        # A command that ends with status 0 after a notice finished when it reached this.
        "BATON_AGENT_TOTAL_STEPS": str(job.total_steps),
    }
    if job.checkpoint_every_steps is not None:
        environ["BATON_CHECKPOINT_EVERY_STEPS"] = str(job.checkpoint_every_steps)
    if every_seconds is not None:
        environ["BATON_CHECKPOINT_EVERY_SECONDS"] = str(every_seconds)
    pattern = job.workload.get("progress_pattern")
    if pattern:
        environ["BATON_AGENT_PROGRESS_PATTERN"] = str(pattern)
    argv = [sys.executable, "-m", "migration.agent", "--", *command]
    return AgentSpec(argv=argv, environ=environ, delay_s=provisioning_delay(instance.pool))


def _replica_ready(job: Job, migration: Migration, copy: CopyOutcome) -> None:
    """The migration's checkpoint is ready in the target region: say where it came from, and
    have the replica there read back and hash-checked while the instances start."""
    checkpoint = migration.checkpoint
    assert checkpoint is not None
    if copy.source == copy.region:
        note = f"a ready replica was already in {copy.region}"
    else:
        ms = "" if copy.latency_ms is None else f", {copy.latency_ms:.0f} ms away"
        note = (
            f"no ready replica in {copy.region}: fetched from {copy.source}, the nearest region "
            f"holding one{ms}"
        )
    migration.phase = MigrationPhase.STARTING
    migration.save(update_fields=["phase"])
    record_event(
        job,
        TimelineKind.REPLICA_READY,
        {"checkpoint": checkpoint.pk, "step": checkpoint.step, **copy.as_event(), "note": note},
        migration=migration,
    )
    enqueue_on_commit(
        "migration.tasks.validate_replica_task", migration.pk, checkpoint.pk, copy.region
    )


def _placed(job: Job) -> list[Instance]:
    """The instances placed for the job and not launched yet."""
    return list(
        _active(job)
        .filter(launched_at__isnull=True, state=InstanceState.PROVISIONING)
        .select_related("pool__region")
    )


def _waiting_for_replica(job: Job) -> tuple[Migration, str] | None:
    """The migration of a starting job whose checkpoint is not yet ready for its latest
    placement, with the region it was placed in; None when nothing needs copying."""
    migration = open_migration(job)
    placed = _placed(job)
    if (
        job.state != JobState.STARTING
        or migration is None
        or migration.checkpoint_id is None
        or not placed
        or _replica_ready_for_placement(migration)
    ):
        return None
    migration = Migration.objects.select_related("checkpoint__job__project").get(pk=migration.pk)
    return migration, placed[0].pool.region.code


def start_job(job_id: int) -> int:
    """Start a placed job's instances. For a migration the checkpoint must be ready in the
    target region first: when a replica is there it is used at once, otherwise the copy is
    queued (`replication`) and the instances start after it. Safe to run twice: an instance is
    launched once. Returns how many instances it launched."""
    with transaction.atomic():
        job = lock_rows(Job.objects).select_related("project").get(pk=job_id)
        if job.state != JobState.STARTING:
            return 0
        waiting = _waiting_for_replica(job)
        if waiting is not None:
            migration, region = waiting
            assert migration.checkpoint is not None
            if region in holders(migration.checkpoint):
                _replica_ready(job, migration, CopyOutcome(region, region, 0.0, 0, 0, 0.0))
            else:
                migration.phase = MigrationPhase.REPLICATING
                migration.save(update_fields=["phase"])
                enqueue_on_commit("migration.tasks.replicate_for_start_task", job.pk)
                return 0
    return launch_instances(job_id)


def copy_for_start(job_id: int) -> int:
    """Copy a starting job's checkpoint to the region it was placed in (from the nearest
    region holding a ready copy), then start its instances. A checkpoint no region can copy
    fails the job."""
    job = Job.objects.select_related("project").get(pk=job_id)
    waiting = _waiting_for_replica(job)
    if waiting is None:
        return launch_instances(job_id)
    migration, region = waiting
    assert migration.checkpoint is not None
    try:
        copy = copy_to_region(migration.checkpoint, region)
    except ReplicationFailed as exc:  # that region's store is down: place the job elsewhere
        logger.warning("job %s: %s", job_id, exc)
        with transaction.atomic():
            job = lock_rows(Job.objects).get(pk=job_id)
            again = _waiting_for_replica(job)
            if again is not None and again[0].pk == migration.pk:
                _start_again(job, again[0], f"the checkpoint could not be copied: {exc}", region)
        return 0
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=job_id)
        again = _waiting_for_replica(job)
        if again is None or again[0].pk != migration.pk or again[1] != region:
            return 0  # placed elsewhere meanwhile: that placement copies for itself
        _replica_ready(job, again[0], copy)
    return launch_instances(job_id)


def launch_instances(job_id: int) -> int:
    """Issue tokens and launch every placed instance of a starting job not yet launched."""
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=job_id)
        if job.state != JobState.STARTING:
            return 0
        migration = open_migration(job)
        instances = list(
            lock_rows(_active(job))
            .filter(launched_at__isnull=True, state=InstanceState.PROVISIONING)
            .select_related("pool__region", "job__project")
        )
        checkpoint = migration.checkpoint if migration is not None else None
        base = ManifestRef.parse(checkpoint.manifest_key) if checkpoint is not None else None
        port = _free_port()
        now = timezone.now()
        specs: list[tuple[Instance, AgentSpec]] = []
        for instance in instances:
            instance.resume_manifest = base.for_rank(instance.rank).key if base else ""
            instance.launched_at = now
            token = issue_agent_token(instance)
            instance.save(update_fields=["resume_manifest", "launched_at"])
            specs.append((instance, agent_spec(instance, token, port)))
    # Committed first: a retried task finds them launched and never starts a second agent for
    # a rank; one that died before the launch below is caught by the start-timeout sweep.
    for instance, spec in specs:
        backend_id = get_backend(instance.pool.backend).launch(instance, spec)
        Instance.objects.filter(pk=instance.pk).update(backend_id=backend_id)
    return len(specs)


# -- notices and checkpoints ----------------------------------------------------------------------


def _begin(job: Job, trigger: str) -> Migration:
    """The open migration of the job, or a new one starting now."""
    migration = open_migration(job)
    if migration is None:
        migration = Migration.objects.create(job=job, trigger=trigger, from_pool_id=job.pool_id)
    return migration


def on_notice(job: Job, instance: Instance, level: str, deadline: str | None, source: str) -> None:
    """An agent saw a notice: advance -> early checkpoint and a pre-reserved target; final ->
    the job is migrating, every rank gets the notice, the emergency checkpoint starts."""
    if is_finished(job.state) or instance.state not in ACTIVE_INSTANCE_STATES:
        return
    migration = _begin(job, MigrationTrigger.INTERRUPTION)
    data: dict[str, Any] = {
        "instance": instance.pk,
        "rank": instance.rank,
        "deadline": deadline,
        "source": source,
    }
    if level == "advance":
        if _has_event(migration, TimelineKind.NOTICE_ADVANCE):
            return
        _broadcast_notice(job, migration, instance, final=False)
        data["checkpoint_requested"] = True
        data["target"] = _pre_reserve(job, migration)
        record_event(job, TimelineKind.NOTICE_ADVANCE, data, migration=migration)
        return
    if source == "imds":  # not a stop signal: Baton's own stops and cancels send those
        _spot_taken_back(instance, migration)
    if _has_event(migration, TimelineKind.NOTICE_FINAL):
        return
    _broadcast_notice(job, migration, instance, final=True, deadline=deadline)
    if job.state in (JobState.RUNNING, JobState.STARTING):
        set_state(job, JobState.MIGRATING)
    migration.phase = MigrationPhase.CHECKPOINTING
    migration.save(update_fields=["phase"])
    record_event(job, TimelineKind.NOTICE_FINAL, data, migration=migration)
    record_event(
        job,
        TimelineKind.CHECKPOINT_STARTED,
        {"kind": "emergency", "ranks": job.nodes, "deadline": deadline},
        migration=migration,
    )


def _spot_taken_back(instance: Instance, migration: Migration | None) -> None:
    """The market takes the instance back (the instance action in its metadata, or the reclaim
    that follows it), not Baton moving the job (a planned migration's stop also ends in notices
    and reclaims): if its pool is spot, the pool's spell of spot room starts again now, which a
    job behind its plan waits out before it leaves on-demand for this pool (decision 052)."""
    if migration is not None and migration.trigger != MigrationTrigger.INTERRUPTION:
        return
    CapacityPool.objects.filter(pk=instance.pool_id, market=Market.SPOT).update(
        last_preempted_at=timezone.now()
    )


def _broadcast_notice(
    job: Job,
    migration: Migration,
    source: Instance,
    final: bool,
    deadline: str | None = None,
) -> None:
    """A gang moves together: the other ranks' metadata endpoints show the same notice."""
    now = timezone.now()
    if final:
        reclaim = source.reclaim_at or (parse_datetime(deadline) if deadline else None)
        _final_notice_to_others(job, migration, source, reclaim or now + timedelta(seconds=120))
    else:
        others = _current_ranks(job, migration).exclude(pk=source.pk)
        others.filter(advance_notice_at__isnull=True).update(advance_notice_at=now)


def _final_notice_to_others(
    job: Job, migration: Migration, source: Instance | None, reclaim_at: datetime | None
) -> None:
    """The gang's other ranks get a final notice now (once) and are reclaimed at `reclaim_at`,
    or after their pool's final window."""
    now = timezone.now()
    others = _current_ranks(job, migration).filter(final_notice_at__isnull=True)
    if source is not None:
        others = others.exclude(pk=source.pk)
    for other in others.select_related("pool"):
        other.final_notice_at = now
        other.reclaim_at = reclaim_at or now + timedelta(seconds=other.pool.final_window_s)
        other.save(update_fields=["final_notice_at", "reclaim_at"])
        countdown = max(0.0, (other.reclaim_at - now).total_seconds())
        enqueue_on_commit("migration.tasks.reclaim_instance_task", other.pk, countdown=countdown)


def _pre_reserve(job: Job, migration: Migration) -> dict[str, Any] | None:
    """Reserve the gang's next home at the advance notice (named in the event), so the final
    notice finds capacity waiting. None when nothing fits now."""
    placed = reserve_placement(job, migration)
    if placed is None:
        return None
    pool, reason = placed
    migration.to_pool_id = pool.pk
    migration.save(update_fields=["to_pool"])
    newest = complete_checkpoints(job)
    if newest:  # the newest checkpoint goes to the target region now, not after the final notice
        enqueue_on_commit(
            "migration.tasks.replicate_checkpoint_task", newest[0].pk, pool.region.code
        )
    return {
        "pool": pool.pk,
        "instance_type": pool.instance_type,
        "region": pool.region.code,
        "reason": reason,
    }


def on_checkpoint(job: Job, instance: Instance, checkpoint: Checkpoint) -> None:
    """A committed checkpoint: the emergency one of every rank ends the checkpoint phase."""
    migration = open_migration(job)
    if (
        migration is None
        or checkpoint.kind != CheckpointKind.EMERGENCY
        or _has_event(migration, TimelineKind.CHECKPOINT_COMMITTED)
    ):
        return
    ranks = {
        checkpoint_rank(row)
        for row in Checkpoint.objects.filter(
            job=job,
            step=checkpoint.step,
            kind=CheckpointKind.EMERGENCY,
            status=CheckpointStatus.COMMITTED,
        )
    }
    if not set(range(job.nodes)) <= ranks:
        return
    first = complete_checkpoints(job)[0]
    migration.checkpoint = first
    migration.lost_steps = max(0, job.step - first.step)
    migration.save(update_fields=["checkpoint", "lost_steps"])
    record_event(
        job,
        TimelineKind.CHECKPOINT_COMMITTED,
        {
            "checkpoint": first.pk,
            "step": first.step,
            "manifest": first.manifest_key,
            "bytes_new": checkpoint.bytes_new,
            "bytes_total": checkpoint.bytes_total,
            "ranks": job.nodes,
        },
        migration=migration,
    )


# -- the old gang goes -----------------------------------------------------------------------------


def instance_gone(job: Job, instance: Instance, reason: str) -> None:
    """An instance of the job ended without finishing the job: preempted (its agent exited),
    reclaimed (its time came), lost (silent) or failed to start. The job migrates once every
    rank of its gang is gone."""
    failed = reason in ("lost", "start_failed")
    if reason == "reclaimed":
        _spot_taken_back(instance, open_migration(job))
    # An agent that exited still sends its last lines: its token goes with the sweep. What
    # the cloud takes (reclaimed) or what went silent is ended at once.
    end_instance(
        instance,
        InstanceState.FAILED if failed else InstanceState.RELEASED,
        revoke=reason != "preempted",
        grace_s=AGENT_GRACE_S if reason == "preempted" else 0.0,
    )
    if is_finished(job.state):
        return
    migration = open_migration(job)
    if (
        migration is not None
        and instance.migration_id == migration.pk
        and instance.launched_at is not None
    ):
        # An instance started for this migration went before the job ran again (reclaimed,
        # lost, never started): start this attempt again elsewhere, from the same checkpoint.
        _start_again(job, migration, f"rank {instance.rank} {reason} before the job ran again")
        return
    if migration is None:
        migration = Migration.objects.create(
            job=job, trigger=MigrationTrigger.INTERRUPTION, from_pool_id=job.pool_id
        )
    if job.state in (JobState.RUNNING, JobState.STARTING):
        set_state(job, JobState.MIGRATING)
    # A gang cannot go on without a rank: the others are told to checkpoint and go.
    _final_notice_to_others(job, migration, None, None)
    if not _current_ranks(job, migration).exists():
        _released(job, migration, reason)


def _start_again(job: Job, migration: Migration, why: str, avoid_region: str = "") -> None:
    """End the instances placed for the migration and place the job again; the checkpoint
    stays (nothing says it is bad). `avoid_region`: placement leaves that region out for the
    rest of this migration (its store cannot be reached)."""
    for other in _active(job).filter(migration=migration).select_related("pool"):
        end_instance(other, InstanceState.RELEASED)
    migration.phase = MigrationPhase.PLACING
    avoided = list((migration.validation or {}).get(UNREACHABLE, []))
    if avoid_region and avoid_region not in avoided:
        avoided.append(avoid_region)
    migration.validation = {"restarted": why, UNREACHABLE: avoided}
    migration.save(update_fields=["phase", "validation"])
    if job.state == JobState.STARTING:
        set_state(job, JobState.MIGRATING)
    logger.warning("job %s: %s; placing it again", job.pk, why)
    enqueue_on_commit("migration.tasks.place_job_task", job.pk)


def _released(job: Job, migration: Migration, reason: str) -> None:
    """Every rank is gone: settle the checkpoint (committed or missed), say `released`, and
    queue the placement (migrations are placed before new jobs)."""
    if _has_event(migration, TimelineKind.RELEASED):
        return
    if not _has_event(migration, TimelineKind.CHECKPOINT_COMMITTED):
        found = complete_checkpoints(job)
        last = found[0] if found else None
        migration.checkpoint = last
        migration.lost_steps = max(0, job.step - (last.step if last else 0))
        record_event(
            job,
            TimelineKind.CHECKPOINT_MISSED,
            {
                "checkpoint": last.pk if last else None,
                "step": last.step if last else 0,
                "kind": last.kind if last else None,
                "lost_steps": migration.lost_steps,
                "reason": "no emergency checkpoint of every rank before the instance went",
            },
            migration=migration,
        )
    if migration.trigger == MigrationTrigger.INTERRUPTION:
        job.interruptions += 1
    job.save(update_fields=["interruptions", "updated_at"])
    migration.phase = MigrationPhase.PLACING
    migration.save(update_fields=["checkpoint", "lost_steps", "phase"])
    gone = list(
        Instance.objects.filter(job=job, ended_at__gte=migration.started_at)
        .exclude(migration=migration)
        .values_list("pk", flat=True)
    )
    record_event(
        job,
        TimelineKind.RELEASED,
        {"instances": gone, "reason": reason, "from_pool": migration.from_pool_id},
        migration=migration,
    )
    enqueue_on_commit("migration.tasks.place_job_task", job.pk)


def start_planned_migration(job: Job, trigger: str, reason: str) -> Migration | None:
    """Move a running job on Baton's own initiative (policy, awareness, manual): every rank is
    asked to stop (SIGTERM: its agent takes it as a final notice with a grace period) and the
    job migrates as after an interruption."""
    if job.state != JobState.RUNNING or open_migration(job) is not None:
        return None
    migration = Migration.objects.create(job=job, trigger=trigger, from_pool_id=job.pool_id)
    set_state(job, JobState.MIGRATING)
    migration.phase = MigrationPhase.CHECKPOINTING
    migration.save(update_fields=["phase"])
    record_event(
        job, TimelineKind.NOTICE_FINAL, {"source": trigger, "reason": reason}, migration=migration
    )
    record_event(
        job,
        TimelineKind.CHECKPOINT_STARTED,
        {"kind": "emergency", "ranks": job.nodes, "grace_s": PLANNED_STOP_GRACE_S},
        migration=migration,
    )
    for instance in _current_ranks(job, migration).select_related("pool"):
        release_process(instance, grace_s=PLANNED_STOP_GRACE_S + 5)
    return migration


def awareness_lost(job: Job, instance: Instance, why: str) -> None:
    """An instance cannot hear notices: its job moves to on-demand and stays there."""
    if job.on_demand_only or is_finished(job.state):
        return
    job.on_demand_only = True
    job.save(update_fields=["on_demand_only", "updated_at"])
    if job.market == Market.SPOT:
        start_planned_migration(
            job,
            MigrationTrigger.AWARENESS_ABNORMAL,
            f"instance {instance.pk} (rank {instance.rank}) cannot hear notices: {why}",
        )


# -- the new gang starts ---------------------------------------------------------------------------


def on_started(job: Job, instance: Instance) -> None:
    """An agent's first report. The job runs once every rank has started and, after a
    migration from a checkpoint, every rank's restore has been validated."""
    migration = open_migration(job)
    record_event(
        job,
        TimelineKind.INSTANCE_STARTED,
        {"instance": instance.pk, "rank": instance.rank, "pool": instance.pool_id},
        migration=migration,
    )
    if job.state != JobState.STARTING:
        return
    if Instance.objects.filter(job=job, state=InstanceState.PROVISIONING).exists():
        return
    if migration is None or migration.checkpoint_id is None:
        _running(job, migration)
    else:
        migration.phase = MigrationPhase.RESTORING
        migration.save(update_fields=["phase"])


def on_restore(job: Job, instance: Instance, event: dict[str, Any]) -> None:
    """A rank restored its checkpoint and measured its validation loss: once every rank has,
    compare each with the reference recorded in the checkpoint."""
    migration = open_migration(job)
    if (
        migration is None
        or job.state != JobState.STARTING
        or instance.state not in ACTIVE_INSTANCE_STATES
        or instance.migration_id != migration.pk
    ):
        return
    report = {
        "rank": instance.rank,
        "manifest": event.get("manifest"),
        "step": event.get("step"),
        "val_loss": event.get("val_loss"),
        "reference": event.get("reference"),
    }
    validation = dict(migration.validation or {})
    ranks = dict(validation.get("ranks") or {})
    ranks[str(instance.rank)] = report
    validation["ranks"] = ranks
    migration.validation = validation
    migration.save(update_fields=["validation"])
    if len(ranks) < job.nodes:
        return
    record_event(
        job,
        TimelineKind.RESTORE_DONE,
        {
            "step": report["step"],
            "checkpoint": migration.checkpoint_id,
            "ranks": [ranks[str(r)] for r in range(job.nodes)],
        },
        migration=migration,
    )
    migration.phase = MigrationPhase.VALIDATING
    migration.save(update_fields=["phase"])
    _judge(job, migration)


def _judge(job: Job, migration: Migration) -> None:
    """Every rank restored: compare each restored loss with the checkpoint's reference (the
    numbers), with the replica's read-back if it is done (a restore hash-checks every chunk it
    reads in any case)."""
    validation = migration.validation or {}
    ranks = validation.get("ranks") or {}
    integrity = validation.get("integrity")
    failures = [r for r in ranks.values() if not _matches(r.get("val_loss"), r.get("reference"))]
    tolerance = settings.BATON_VALIDATION_TOLERANCE
    if failures:
        record_event(
            job,
            TimelineKind.VALIDATION_FAILED,
            {"ranks": failures, "tolerance": tolerance, "integrity": integrity},
            migration=migration,
        )
        rollback(job, migration, "the restored loss does not match the checkpoint's reference")
        return
    checked = all(r.get("reference") is not None for r in ranks.values())
    record_event(
        job,
        TimelineKind.VALIDATION_PASSED,
        {
            "tolerance": tolerance,
            "compared": checked,
            "integrity": integrity
            or {"ok": True, "note": "every chunk the restore read was hash-checked"},
            "note": "restored loss matches the reference"
            if checked
            else "no validation reference in the checkpoint: integrity (chunk hashes) only",
        },
        migration=migration,
    )
    _running(job, migration)


def validate_replica(migration_id: int, checkpoint_id: int, region: str) -> bool:
    """Read back and hash-check every chunk of the replica a migration restores from, while
    its instances start. A corrupt replica is a failed validation: roll back. Returns ok."""
    checkpoint = Checkpoint.objects.select_related("job__project").filter(pk=checkpoint_id).first()
    if checkpoint is None:
        return False
    result = verify_replica(checkpoint, region)
    with transaction.atomic():
        job = lock_rows(Job.objects).get(pk=checkpoint.job_id)
        migration = open_migration(job)
        if (
            migration is None
            or migration.pk != migration_id
            or migration.checkpoint_id != checkpoint_id
            or job.state != JobState.STARTING
        ):
            return result.ok  # judged or rolled back meanwhile
        validation = dict(migration.validation or {})
        validation["integrity"] = result.as_event()
        migration.validation = validation
        migration.save(update_fields=["validation"])
        if not result.ok:
            record_event(
                job, TimelineKind.VALIDATION_FAILED, {"integrity": result.as_event()}, migration
            )
            rollback(job, migration, f"the replica in {region} is corrupt: {result.error}")
    return result.ok


def _matches(val_loss: object, reference: object) -> bool:
    if reference is None:
        return True
    if not isinstance(val_loss, int | float) or not isinstance(reference, int | float):
        return False
    return math.isclose(
        float(val_loss), float(reference), rel_tol=settings.BATON_VALIDATION_TOLERANCE
    )


def _running(job: Job, migration: Migration | None) -> None:
    set_state(job, JobState.RUNNING)
    record_event(
        job, TimelineKind.RUNNING, {"pool": job.pool_id, "market": job.market}, migration=migration
    )
    if migration is not None:
        finish_migration(migration, MigrationPhase.DONE)


def rollback(job: Job, migration: Migration, why: str) -> None:
    """A restore failed: mark the checkpoint corrupt, end the new instances, and start again
    from the previous committed checkpoint (at most BATON_MAX_ROLLBACKS times)."""
    failed = migration.checkpoint
    for instance in _active(job).filter(migration=migration).select_related("pool"):
        end_instance(instance, InstanceState.FAILED)
    if migration.rollbacks >= settings.BATON_MAX_ROLLBACKS:
        fail_job(job, f"restore failed {migration.rollbacks + 1} times: {why}")
        return
    if failed is not None:
        Checkpoint.objects.filter(job=job, step=failed.step, kind=failed.kind).update(
            status=CheckpointStatus.CORRUPT
        )
    previous = complete_checkpoints(job, before_step=failed.step if failed else None)
    target = previous[0] if previous else None
    migration.rollbacks += 1
    migration.checkpoint = target
    migration.validation = {
        "rolled_back_from": failed.pk if failed else None,
        UNREACHABLE: (migration.validation or {}).get(UNREACHABLE, []),
    }
    migration.phase = MigrationPhase.PLACING
    migration.save(update_fields=["rollbacks", "checkpoint", "validation", "phase"])
    record_event(
        job,
        TimelineKind.ROLLBACK,
        {
            "reason": why,
            "from_checkpoint": failed.pk if failed else None,
            "from_step": failed.step if failed else None,
            "to_checkpoint": target.pk if target else None,
            "to_step": target.step if target else 0,
            "rollbacks": migration.rollbacks,
        },
        migration=migration,
    )
    if job.state == JobState.STARTING:
        set_state(job, JobState.MIGRATING)
    enqueue_on_commit("migration.tasks.place_job_task", job.pk)


def finish_job(job: Job) -> None:
    """A rank finished: the job succeeds once every rank has, with rank 0's result."""
    migration = open_migration(job)
    if not job.result or _current_ranks(job, migration).exists():
        return
    if migration is not None:  # a notice came as the job finished: nothing left to move
        for reserved in _active(job).filter(migration=migration):
            end_instance(reserved, InstanceState.RELEASED)
        finish_migration(migration, MigrationPhase.DONE)
    if job.state == JobState.STARTING:  # every rank finished before its restore was judged
        set_state(job, JobState.RUNNING)
    set_state(job, JobState.SUCCEEDED, step=job.result.get("step") or job.step)
    record_event(job, TimelineKind.SUCCEEDED, dict(job.result))


def fail_job(job: Job, error: str, failed: Instance | None = None) -> None:
    """The job cannot go on: the failed instance (if one) is `failed`, the others released."""
    if failed is not None:
        end_instance(failed, InstanceState.FAILED)
    for instance in _active(job).select_related("pool"):
        end_instance(instance, InstanceState.RELEASED)
    migration = open_migration(job)
    if migration is not None:
        finish_migration(migration, MigrationPhase.FAILED)
    set_state(job, JobState.FAILED, error=error[:2000])
    data: dict[str, Any] = {"error": error}
    if failed is not None:
        data["rank"] = failed.rank
    record_event(job, TimelineKind.FAILED, data)


def restore_failed(job: Job, instance: Instance, error: str) -> None:
    """A rank could not restore (or failed right after it): roll back, not fail the job."""
    if instance.state not in ACTIVE_INSTANCE_STATES:
        return  # ended by a rollback already under way
    migration = open_migration(job)
    if migration is None or migration.checkpoint_id is None:
        fail_job(job, f"rank {instance.rank}: {error}", failed=instance)
        return
    rollback(job, migration, f"rank {instance.rank}: {error}")


def in_restore(job: Job, instance: Instance) -> bool:
    """Whether a failure of this instance is a failed restore: it was started from a
    checkpoint by a migration that has not yet been validated."""
    migration = open_migration(job)
    return (
        migration is not None
        and instance.migration_id == migration.pk
        and bool(instance.resume_manifest)
        and job.state == JobState.STARTING
    )

"""Closed vocabularies of the capacity and migration domain (DESIGN §9: add, never rename)."""

from __future__ import annotations

from django.db import models


class Market(models.TextChoices):
    SPOT = "spot", "Spot"
    ON_DEMAND = "on_demand", "On-demand"


class Backend(models.TextChoices):
    LOCAL = "local", "Local processes"
    AWS = "aws", "AWS EC2"


class Interconnect(models.TextChoices):
    PCIE = "pcie", "PCIe"
    NVLINK = "nvlink", "NVLink"
    NVSWITCH = "nvswitch", "NVSwitch"


class RuleKind(models.TextChoices):
    LARGER_MEMORY = "larger_memory", "Larger memory (same generation)"
    CROSS_GENERATION = "cross_generation", "Cross generation (newer card)"
    MODEL_PARALLEL = "model_parallel", "Model parallel (N smaller cards for one)"


class InstanceState(models.TextChoices):
    PROVISIONING = "provisioning", "Provisioning"
    RUNNING = "running", "Running"
    DRAINING = "draining", "Draining"
    RELEASED = "released", "Released"
    FAILED = "failed", "Failed"


ACTIVE_INSTANCE_STATES = (
    InstanceState.PROVISIONING,
    InstanceState.RUNNING,
    InstanceState.DRAINING,
)


class InterruptionLevel(models.TextChoices):
    ADVANCE = "advance", "Advance notice"
    FINAL = "final", "Final notice"


class MigrationTrigger(models.TextChoices):
    INTERRUPTION = "interruption", "Interruption"
    AWARENESS_ABNORMAL = "awareness_abnormal", "Interruption awareness abnormal"
    POLICY = "policy", "Policy"
    MANUAL = "manual", "Manual"


class MigrationPhase(models.TextChoices):
    NOTICE = "notice", "Notice received"
    CHECKPOINTING = "checkpointing", "Checkpointing"
    RELEASED = "released", "Released"
    PLACING = "placing", "Placing"
    REPLICATING = "replicating", "Replicating"
    STARTING = "starting", "Starting"
    RESTORING = "restoring", "Restoring"
    VALIDATING = "validating", "Validating"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class CheckpointKind(models.TextChoices):
    PERIODIC = "periodic", "Periodic"
    EMERGENCY = "emergency", "Emergency"
    FINAL = "final", "Final"


class CheckpointStatus(models.TextChoices):
    WRITING = "writing", "Writing"
    COMMITTED = "committed", "Committed"
    CORRUPT = "corrupt", "Corrupt"


class ReplicaStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    COPYING = "copying", "Copying"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class TimelineKind(models.TextChoices):
    JOB_SUBMITTED = "job_submitted"
    PLACEMENT_DECIDED = "placement_decided"
    INSTANCE_STARTED = "instance_started"
    RUNNING = "running"
    NOTICE_ADVANCE = "notice_advance"
    NOTICE_FINAL = "notice_final"
    CHECKPOINT_STARTED = "checkpoint_started"
    CHECKPOINT_COMMITTED = "checkpoint_committed"
    CHECKPOINT_MISSED = "checkpoint_missed"
    RELEASED = "released"
    REPLICA_READY = "replica_ready"
    RESTORE_DONE = "restore_done"
    VALIDATION_PASSED = "validation_passed"
    VALIDATION_FAILED = "validation_failed"
    ROLLBACK = "rollback"
    WAITING = "waiting"
    FALLBACK_ON_DEMAND = "fallback_on_demand"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A migration without trouble, as its timeline events follow each other (DESIGN §4).
MIGRATION_TIMELINE = (
    TimelineKind.NOTICE_ADVANCE,
    TimelineKind.NOTICE_FINAL,
    TimelineKind.CHECKPOINT_STARTED,
    TimelineKind.CHECKPOINT_COMMITTED,
    TimelineKind.RELEASED,
    TimelineKind.PLACEMENT_DECIDED,
    TimelineKind.REPLICA_READY,
    TimelineKind.INSTANCE_STARTED,
    TimelineKind.RESTORE_DONE,
    TimelineKind.VALIDATION_PASSED,
    TimelineKind.RUNNING,
)

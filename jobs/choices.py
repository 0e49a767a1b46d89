"""Closed vocabularies of jobs (DESIGN §9: add, never rename)."""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    PENDING = "pending", "Pending"
    PLACING = "placing", "Placing"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    MIGRATING = "migrating", "Migrating"
    WAITING = "waiting", "Waiting for capacity"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_JOB_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class Tolerance(models.TextChoices):
    AGGRESSIVE = "aggressive", "Aggressive: cheapest spot"
    BALANCED = "balanced", "Balanced: lowest expected cost"
    CONSERVATIVE = "conservative", "Conservative: low-interruption spot or on-demand"

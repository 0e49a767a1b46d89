"""Projects and the jobs submitted to them (DESIGN §3)."""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

from jobs.choices import JobState, Tolerance
from migration.choices import Market


class Project(models.Model):
    """A namespace for jobs and their stored objects; its members see its jobs."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects")
    personal_owner = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="personal_project",
        help_text="Set on the project every user gets on first use.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


def new_checkpoint_salt() -> str:
    """The random part of a new job's checkpoint key (`Job.checkpoint_key`)."""
    return secrets.token_hex(4)


class JobQuerySet(models.QuerySet["Job"]):
    def visible_to(self, user: object) -> JobQuerySet:
        """Jobs of the projects `user` belongs to (staff see every job)."""
        if getattr(user, "is_staff", False):
            return self
        return self.filter(project__members=user)


class Job(models.Model):
    """A training job: what to run, on what hardware, and how much interruption to accept."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200, blank=True)
    workload = models.JSONField(help_text='{"template", "params"} or {"command", "mode"}')

    accelerator = models.ForeignKey(
        "migration.Accelerator", on_delete=models.PROTECT, related_name="jobs"
    )
    gpus_per_node = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    nodes = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    total_steps = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    expected_hours = models.FloatField(help_text="Work on the requested hardware, in hours.")
    checkpoint_gb = models.FloatField(help_text="Size of one full checkpoint.")
    checkpoint_every_steps = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_every_seconds = models.PositiveIntegerField(null=True, blank=True)

    tolerance = models.CharField(
        max_length=16, choices=Tolerance.choices, default=Tolerance.BALANCED
    )
    max_price_per_hour = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Cap on the price of the whole job (all nodes) per hour.",
    )
    deadline = models.DateTimeField(null=True, blank=True)
    max_interruptions = models.PositiveIntegerField(null=True, blank=True)
    max_wait_s = models.PositiveIntegerField(
        default=600, help_text="How long to wait for spot before falling back to on-demand."
    )
    allow_model_parallel = models.BooleanField(default=False)
    allow_on_demand_fallback = models.BooleanField(default=True)

    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    step = models.PositiveBigIntegerField(default=0)
    market = models.CharField(max_length=16, choices=Market.choices, blank=True)
    pool = models.ForeignKey(
        "migration.CapacityPool", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    interruptions = models.PositiveIntegerField(default=0)
    on_demand_only = models.BooleanField(
        default=False,
        help_text="Set when an instance's interruption awareness failed: the job stays on "
        "on-demand capacity from then on.",
    )
    cost_so_far = models.DecimalField(max_digits=12, decimal_places=4, default=Decimal("0"))
    on_demand_cost_so_far = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        default=Decimal("0"),
        help_text="What the same hours would have cost on on-demand capacity.",
    )
    estimate = models.JSONField(null=True, blank=True)
    checkpoint_storage = models.JSONField(
        default=dict,
        blank=True,
        help_text="Bytes its kept checkpoints take in each region's store, as last measured.",
    )
    checkpoint_salt = models.CharField(
        max_length=16,
        blank=True,
        default=new_checkpoint_salt,
        editable=False,
        help_text="Random part of the job's name in the checkpoint stores (empty on jobs "
        "submitted before it existed).",
    )
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    waiting_since = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        permissions = [("run_command", "Can run arbitrary command jobs on Baton's capacity")]
        indexes = [models.Index(fields=["state"]), models.Index(fields=["project", "-id"])]

    def __str__(self) -> str:
        return self.name or f"job {self.pk}"

    @property
    def checkpoint_key(self) -> str:
        """The job's name in the checkpoint stores (`BATON_JOB_ID`): its id and a random
        part, so that a job never finds another's checkpoints under its name when ids start
        again (a new database beside stores that outlived the old one) or when two portals
        share a store. Jobs submitted before the random part existed keep their bare id."""
        return f"{self.pk}-{self.checkpoint_salt}" if self.checkpoint_salt else str(self.pk)

    @property
    def savings_vs_on_demand(self) -> Decimal:
        return self.on_demand_cost_so_far - self.cost_so_far

"""Capacity, instances, interruptions, migrations, checkpoints and the timeline (DESIGN §3)."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    Backend,
    CheckpointKind,
    CheckpointStatus,
    InstanceState,
    Interconnect,
    InterruptionLevel,
    Market,
    MigrationPhase,
    MigrationTrigger,
    ReplicaStatus,
    RuleKind,
    TimelineKind,
)


class Region(models.Model):
    """A cloud region; each has its own checkpoint store."""

    code = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.code


class RegionLatency(models.Model):
    """Round-trip latency between two regions, used to find the nearest replica."""

    source = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="latencies")
    target = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="+")
    milliseconds = models.PositiveIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="unique_region_latency")
        ]
        verbose_name_plural = "region latencies"

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}: {self.milliseconds} ms"


class Accelerator(models.Model):
    """A GPU model, e.g. V100-16GB."""

    name = models.CharField(max_length=32, unique=True)
    generation = models.CharField(max_length=32)
    memory_gib = models.PositiveIntegerField()
    compute_capability = models.DecimalField(max_digits=3, decimal_places=1)
    interconnect = models.CharField(max_length=16, choices=Interconnect.choices)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class CompatibilityRule(models.Model):
    """One cell of the admin-managed compatibility matrix: `target_count` x `target` may run
    a workload written for one `source`. Exact matches need no rule."""

    source = models.ForeignKey(Accelerator, on_delete=models.CASCADE, related_name="rules")
    target = models.ForeignKey(Accelerator, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=20, choices=RuleKind.choices)
    target_count = models.PositiveSmallIntegerField(
        default=1,
        help_text="Cards of the target per source card: 1, or at least 2 for model parallel.",
    )
    operator_compatibility = models.TextField(
        blank=True, help_text="Which operators are known to behave the same on the target."
    )
    memory_mapping = models.TextField(
        blank=True, help_text="How the model's memory maps onto the target."
    )
    communication_adaptation = models.TextField(
        blank=True, help_text="Changes to the communication library (e.g. NCCL settings)."
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        ordering = ["source__name", "target__name", "target_count"]
        constraints = [
            models.UniqueConstraint(
                fields=["source", "target", "target_count"],
                name="unique_compatibility_rule",
                violation_error_message="This rule already exists in the matrix.",
            ),
            models.CheckConstraint(
                condition=~models.Q(source=models.F("target")),
                name="rule_not_to_itself",
                violation_error_message="A card needs no rule to run on itself.",
            ),
        ]

    def __str__(self) -> str:
        count = f"{self.target_count} x " if self.target_count != 1 else ""
        return f"{self.source} -> {count}{self.target} ({self.get_kind_display()})"

    def clean(self) -> None:
        """Reject rules the matrix cannot mean, with a message naming the field."""
        errors: dict[str, str] = {}
        source = self.source if self.source_id else None
        target = self.target if self.target_id else None
        if source and target and source.pk == target.pk:
            errors["target"] = "A card needs no rule to run on itself; pick another target."
        if self.kind == RuleKind.MODEL_PARALLEL and self.target_count < 2:
            errors["target_count"] = "Model parallel stands N >= 2 smaller cards in for one."
        elif self.kind != RuleKind.MODEL_PARALLEL and self.target_count != 1:
            errors["target_count"] = "Only model-parallel rules use more than one target card."
        if source and target and "target" not in errors:
            if self.kind == RuleKind.LARGER_MEMORY and (
                target.generation != source.generation or target.memory_gib <= source.memory_gib
            ):
                errors["target"] = (
                    f"Larger memory means the same generation ({source.generation}) "
                    f"with more than {source.memory_gib} GiB."
                )
            if self.kind == RuleKind.CROSS_GENERATION and (
                target.compute_capability <= source.compute_capability
            ):
                errors["target"] = (
                    f"Cross generation means a newer card (compute capability above "
                    f"{source.compute_capability})."
                )
            duplicate = CompatibilityRule.objects.filter(
                source=source, target=target, target_count=self.target_count
            ).exclude(pk=self.pk)
            if duplicate.exists():
                errors["target"] = f"A rule {source} -> {self.target_count} x {target} exists."
        if errors:
            raise ValidationError(errors)


class CapacityPoolQuerySet(models.QuerySet["CapacityPool"]):
    def with_mean_price(self) -> CapacityPoolQuerySet:
        """Annotate `mean_price_per_hour`: the mean of the pool's recorded spot prices."""
        from costs.models import PriceSample

        mean = (
            PriceSample.objects.filter(pool=models.OuterRef("pk"))
            .values("pool")
            .annotate(mean=models.Avg("price"))
            .values("mean")
        )
        return self.annotate(mean_price_per_hour=models.Subquery(mean))

    def with_free(self) -> CapacityPoolQuerySet:
        """Annotate `free`: capacity minus instances holding a slot (one query for any list)."""
        active = models.Count(
            "instances", filter=models.Q(instances__state__in=ACTIVE_INSTANCE_STATES)
        )
        annotated = self.annotate(used=active).annotate(
            free=models.F("capacity") - models.F("used")
        )
        # Meta.ordering is dropped from GROUP BY queries: say it again.
        return annotated.order_by(*POOL_ORDERING)


POOL_ORDERING = ["market", "price_per_hour", "id"]


class CapacityPool(models.Model):
    """Instances of one type in one zone and market, at one price."""

    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="pools")
    zone = models.CharField(max_length=32, blank=True, help_text="Empty for on-demand: any zone.")
    instance_type = models.CharField(max_length=32)
    accelerator = models.ForeignKey(Accelerator, on_delete=models.PROTECT, related_name="pools")
    gpus_per_instance = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)])
    market = models.CharField(max_length=16, choices=Market.choices)
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.LOCAL)
    price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(Decimal("0"))]
    )
    capacity = models.PositiveIntegerField(help_text="Instances this pool can hold at once.")
    interruption_rate_per_hour = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="Preemptions per instance-hour."
    )
    # Defaults are AWS's: rebalance recommendations come at no fixed lead time, the
    # instance-action notice two minutes before reclaim, and a new instance takes about a minute.
    advance_notice_s = models.PositiveIntegerField(default=0)
    final_window_s = models.PositiveIntegerField(default=120)
    # A few seconds: what the local backend waits before starting an agent, so a migration
    # shows a realistic provisioning phase; BATON_PROVISIONING_DELAY_S overrides every pool.
    provisioning_delay_s = models.FloatField(default=5.0, validators=[MinValueValidator(0.0)])
    enabled = models.BooleanField(default=True)
    # When the market last took back one of the pool's spot instances (the instance action in its
    # metadata, or the reclaim after it; not Baton's own moves): the spell of spot room that the
    # deadline rule weighs before a job returns to spot began then (decision 052). Null: none
    # seen, so no job is held back on its account.
    last_preempted_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = CapacityPoolQuerySet.as_manager()

    class Meta:
        ordering = POOL_ORDERING
        constraints = [
            models.UniqueConstraint(
                fields=["region", "zone", "instance_type", "market"], name="unique_capacity_pool"
            )
        ]

    def __str__(self) -> str:
        where = self.zone or self.region.code
        return f"{self.instance_type} {self.get_market_display()} in {where}"


class Instance(models.Model):
    """One machine of a pool running one rank of a job, with its agent."""

    pool = models.ForeignKey(CapacityPool, on_delete=models.PROTECT, related_name="instances")
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="instances")
    rank = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=InstanceState.choices, default=InstanceState.PROVISIONING
    )
    agent_token_hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    backend_id = models.CharField(max_length=128, blank=True, help_text="EC2 id or local pid.")
    self_check = models.JSONField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    awareness_abnormal = models.BooleanField(default=False)
    last_event_seq = models.PositiveBigIntegerField(
        default=0, help_text="Highest agent event applied (re-sent batches are applied once)."
    )
    migration = models.ForeignKey(
        "migration.Migration",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="instances",
        help_text="The migration this instance was placed (or pre-reserved) for.",
    )
    resume_manifest = models.CharField(
        max_length=512, blank=True, help_text="The checkpoint the instance was started from."
    )
    # The notices this instance's metadata endpoint serves (local backend; DESIGN §5 paths).
    advance_notice_at = models.DateTimeField(null=True, blank=True)
    final_notice_at = models.DateTimeField(null=True, blank=True)
    reclaim_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    launched_at = models.DateTimeField(
        null=True, blank=True, help_text="When the backend was asked to start its agent."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["pool", "state"]), models.Index(fields=["job", "rank"])]

    def __str__(self) -> str:
        return f"instance {self.pk} (job {self.job_id} rank {self.rank})"


class InterruptionEvent(models.Model):
    """A notice an instance received: advance (rebalance) or final (instance-action)."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="interruptions")
    level = models.CharField(max_length=16, choices=InterruptionLevel.choices)
    received_at = models.DateTimeField()
    deadline_at = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=32, help_text="imds, simulated, sigterm, ...")

    class Meta:
        ordering = ["received_at", "id"]

    def __str__(self) -> str:
        return f"{self.level} notice for instance {self.instance_id}"


class Migration(models.Model):
    """One move of a job (a whole gang) from one pool to another."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="migrations")
    trigger = models.CharField(max_length=24, choices=MigrationTrigger.choices)
    from_pool = models.ForeignKey(
        CapacityPool, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    to_pool = models.ForeignKey(
        CapacityPool, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    phase = models.CharField(
        max_length=16, choices=MigrationPhase.choices, default=MigrationPhase.NOTICE
    )
    lost_steps = models.PositiveIntegerField(default=0)
    rollbacks = models.PositiveSmallIntegerField(
        default=0, help_text="Restores that failed and fell back to an earlier checkpoint."
    )
    checkpoint = models.ForeignKey(
        "migration.Checkpoint", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    validation = models.JSONField(null=True, blank=True)
    timings = models.JSONField(default=dict, blank=True, help_text="Seconds spent in each phase.")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"migration {self.pk} of job {self.job_id} ({self.phase})"


class TimelineEvent(models.Model):
    """Append-only record of what happened to a job; the source of the live view."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="events")
    migration = models.ForeignKey(
        Migration, on_delete=models.SET_NULL, null=True, blank=True, related_name="events"
    )
    kind = models.CharField(max_length=24, choices=TimelineKind.choices)
    at = models.DateTimeField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"])]

    def __str__(self) -> str:
        return f"{self.kind} (job {self.job_id})"


class Checkpoint(models.Model):
    """A committed (or being written) checkpoint of a job, as its manifest describes it."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=16, choices=CheckpointKind.choices)
    status = models.CharField(
        max_length=16, choices=CheckpointStatus.choices, default=CheckpointStatus.WRITING
    )
    manifest_key = models.CharField(max_length=512)
    region = models.ForeignKey(
        Region,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Where it was first written.",
    )
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_new = models.PositiveBigIntegerField(default=0)
    validation_reference = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "manifest_key"], name="unique_checkpoint")
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step} ({self.kind}, {self.status})"


class CheckpointReplica(models.Model):
    """A copy of a checkpoint in one region's store."""

    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.CASCADE, related_name="replicas")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    status = models.CharField(
        max_length=16, choices=ReplicaStatus.choices, default=ReplicaStatus.PENDING
    )
    bytes = models.PositiveBigIntegerField(default=0)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["region__code"]
        constraints = [
            models.UniqueConstraint(fields=["checkpoint", "region"], name="unique_replica")
        ]

    def __str__(self) -> str:
        return f"{self.checkpoint} in {self.region_id} ({self.status})"


class LogLine(models.Model):
    """A line the workload printed, forwarded by the agent of one rank."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="log_lines")
    instance = models.ForeignKey(
        Instance, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    rank = models.PositiveSmallIntegerField(default=0)
    at = models.DateTimeField()
    line = models.TextField()

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["job", "id"]), models.Index(fields=["job", "rank", "id"])]

    def __str__(self) -> str:
        return f"job {self.job_id} rank {self.rank}: {self.line[:60]}"

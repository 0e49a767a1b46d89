"""Price and availability history, the ground truth of the estimator (DESIGN §3, §7)."""

from __future__ import annotations

from django.db import models


class PriceSample(models.Model):
    """The spot price of one pool at one moment."""

    pool = models.ForeignKey(
        "migration.CapacityPool", on_delete=models.CASCADE, related_name="price_samples"
    )
    at = models.DateTimeField()
    price = models.DecimalField(max_digits=10, decimal_places=4)
    source = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["pool", "at"])]
        constraints = [models.UniqueConstraint(fields=["pool", "at"], name="unique_price_sample")]

    def __str__(self) -> str:
        return f"{self.pool_id} at {self.at:%Y-%m-%d %H:%M}: {self.price}"


class AvailabilitySample(models.Model):
    """A run of consecutive trace ticks during which spot capacity of an accelerator in a
    region was (or was not) available: `ticks` ticks of `gap_seconds` from `at`.

    Runs, not single ticks: 45 days of 195-second ticks are 20,000 rows a zone, but only a few
    hundred changes of availability, and the rates the estimator needs are per run anyway.
    """

    region = models.ForeignKey("migration.Region", on_delete=models.CASCADE, related_name="+")
    accelerator = models.ForeignKey(
        "migration.Accelerator", on_delete=models.CASCADE, related_name="+"
    )
    trace = models.CharField(
        max_length=200, help_text="Dataset and name, e.g. aws-04-22-2023/us-east-1c_v100_1."
    )
    at = models.DateTimeField()
    ticks = models.PositiveIntegerField()
    gap_seconds = models.PositiveIntegerField()
    available = models.BooleanField()

    class Meta:
        ordering = ["trace", "at"]
        indexes = [models.Index(fields=["region", "accelerator", "trace", "at"])]
        constraints = [
            models.UniqueConstraint(fields=["trace", "at"], name="unique_availability_sample")
        ]

    def __str__(self) -> str:
        state = "up" if self.available else "down"
        return f"{self.trace} from {self.at:%Y-%m-%d %H:%M}: {state} for {self.ticks} tick(s)"


class RateSource(models.TextChoices):
    """Where a spot pool's interruption figures come from."""

    HISTORY = "history", "history of the pool's region and card"
    BORROWED = "borrowed", "borrowed from the most similar pools with history"
    DEFAULT = "default", "the configured default (no similar history)"


class SpotPoolHistory(models.Model):
    """What the stored history says about one spot pool, in the estimator's terms: derived by
    `costs.services.refresh_pool_figures` after every import, read by every estimate.

    `borrowed_from` lists the (card, region) histories the figures were pooled from when the
    pool has none of its own.
    """

    pool = models.OneToOneField(
        "migration.CapacityPool", on_delete=models.CASCADE, related_name="spot_history"
    )
    source = models.CharField(max_length=16, choices=RateSource.choices)
    borrowed_from = models.JSONField(default=list, blank=True)
    interruption_rate_per_hour = models.FloatField()
    mean_outage_hours = models.FloatField(default=0.0)
    uptime_cv = models.FloatField(default=1.0)
    outage_cv = models.FloatField(default=1.0)
    history_hours = models.FloatField(default=0.0, help_text="Hours of trace the figures rest on.")

    class Meta:
        verbose_name_plural = "spot pool histories"

    def __str__(self) -> str:
        return f"{self.pool_id}: {self.interruption_rate_per_hour:.3f}/h ({self.source})"

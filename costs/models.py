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
    """Whether spot capacity of an accelerator was available in a region during one tick."""

    region = models.ForeignKey("migration.Region", on_delete=models.CASCADE, related_name="+")
    accelerator = models.ForeignKey(
        "migration.Accelerator", on_delete=models.CASCADE, related_name="+"
    )
    trace = models.CharField(max_length=100, help_text="Trace name, e.g. us-east-1c_v100_1.")
    at = models.DateTimeField()
    gap_seconds = models.PositiveIntegerField()
    available = models.BooleanField()

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["region", "accelerator", "trace", "at"])]
        constraints = [
            models.UniqueConstraint(fields=["trace", "at"], name="unique_availability_sample")
        ]

    def __str__(self) -> str:
        return f"{self.trace} at {self.at:%Y-%m-%d %H:%M}: {'up' if self.available else 'down'}"

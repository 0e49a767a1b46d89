"""Read-only queries for the cost pages and charts."""

from __future__ import annotations

from collections import defaultdict

from costs.charts import PriceSeries
from costs.models import PriceSample
from migration.choices import Market
from migration.models import CapacityPool

MAX_SERIES = 12


def price_series(accelerator: str) -> list[PriceSeries]:
    """Recorded spot prices of the accelerator's pools, one series per pool."""
    samples = (
        PriceSample.objects.filter(pool__accelerator__name=accelerator)
        .select_related("pool")
        .order_by("pool_id", "at")
    )
    points: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for sample in samples:
        label = f"{sample.pool.instance_type} {sample.pool.zone}"
        points[label][0].append(sample.at)
        points[label][1].append(float(sample.price))
    return [
        PriceSeries(label, at, price) for label, (at, price) in list(points.items())[:MAX_SERIES]
    ]


def pool_rates(accelerator: str) -> tuple[list[str], list[float]]:
    """Interruption rate of every spot pool of the accelerator."""
    pools = CapacityPool.objects.filter(
        accelerator__name=accelerator, market=Market.SPOT, enabled=True
    ).order_by("region__code", "zone", "instance_type")
    rows = list(pools.values_list("instance_type", "zone", "interruption_rate_per_hour"))
    return [f"{t} {z}" for t, z, _ in rows], [rate for _, _, rate in rows]

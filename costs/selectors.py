"""Read-only queries for the cost pages and charts."""

from __future__ import annotations

from collections import defaultdict

from costs.charts import PriceSeries
from costs.models import PriceSample, SpotPoolHistory
from migration.choices import Market
from migration.models import CapacityPool, TimelineEvent

# Below this many final notices the measured share of missed emergency checkpoints says too
# little: the estimator keeps its default.
MIN_NOTICES_FOR_MISS_SHARE = 20

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


def spot_pool_history(pool_id: int) -> SpotPoolHistory | None:
    """The interruption figures stored for a spot pool, if any."""
    return SpotPoolHistory.objects.filter(pool_id=pool_id).first()


def emergency_miss_share(default: float, last: int = 500) -> float:
    """Share of the last final notices whose emergency checkpoint did not make it (a
    `checkpoint_missed` event), or `default` before enough of them are recorded."""
    kinds = list(
        TimelineEvent.objects.filter(kind__in=["notice_final", "checkpoint_missed"])
        .order_by("-id")
        .values_list("kind", flat=True)[:last]
    )
    notices = kinds.count("notice_final")
    if notices < MIN_NOTICES_FOR_MISS_SHARE:
        return default
    return min(1.0, kinds.count("checkpoint_missed") / notices)

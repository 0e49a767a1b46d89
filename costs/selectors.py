"""Read-only queries for the cost pages and charts."""

from __future__ import annotations

from collections import defaultdict
from functools import reduce
from operator import or_

from django.db.models import Q

from costs.charts import PriceSeries
from costs.models import AvailabilitySample, PriceSample, SpotPoolHistory
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


def stored_trace_names() -> list[str]:
    """The traces in history, by the name they were imported under (the nodes of a wide trace,
    stored as `name#k`, under one name)."""
    names = AvailabilitySample.objects.values_list("trace", flat=True).distinct()
    return sorted({name.split("#", 1)[0] for name in names})


def stored_trace_samples(name: str) -> list[AvailabilitySample]:
    """The runs of a stored trace (every node of a wide one), ordered by node, then time."""
    return list(
        AvailabilitySample.objects.filter(Q(trace=name) | Q(trace__startswith=f"{name}#"))
        .select_related("region", "accelerator")
        .order_by("trace", "at")
    )


def pool_trace_names(pool: CapacityPool) -> list[str]:
    """The stored traces behind a spot pool's figures: its region and card's own, else those
    of the histories it borrows from; longest first."""
    history = spot_pool_history(pool.pk)
    places = [(pool.region.code, pool.accelerator.name)]
    if history is not None and history.source == "borrowed":
        places = [tuple(label.split(" in ")[::-1]) for label in history.borrowed_from]
    rows = AvailabilitySample.objects.filter(
        reduce(or_, (Q(region__code=r, accelerator__name=a) for r, a in places))
    )
    ticks: dict[str, int] = defaultdict(int)
    for name, count in rows.values_list("trace", "ticks"):
        ticks[name.split("#", 1)[0]] += count
    return sorted(ticks, key=lambda name: (-ticks[name], name))


def rate_source(history: SpotPoolHistory | None, rate: float) -> tuple[str, list[str]]:
    """Where a spot pool's interruption rate comes from, and what it borrowed from: its history
    (`history`, `borrowed`, `default`) while the pool's rate is the derived one, else `pool`
    (set on the pool by hand)."""
    if history is not None and history.interruption_rate_per_hour == rate:
        return history.source, list(history.borrowed_from)
    return "pool", []

"""Read-only queries for the cost pages and charts."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Q

from costs.charts import PriceSeries
from costs.models import AvailabilitySample, PriceSample, SpotPoolHistory
from costs.traces import describe_trace_name
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


def _history_places(pool: CapacityPool, history: SpotPoolHistory | None) -> list[tuple[str, str]]:
    """The (region, card) histories behind a spot pool's figures: its own, else the borrowed."""
    if history is not None and history.source == "borrowed":
        return [
            (region, card)
            for card, region in (label.split(" in ") for label in history.borrowed_from)
        ]
    return [(pool.region.code, pool.accelerator.name)]


def _samples_of(places: list[tuple[str, str]]) -> Any:
    return AvailabilitySample.objects.filter(
        reduce(or_, (Q(region__code=r, accelerator__name=a) for r, a in places))
    )


def pool_trace_names(pool: CapacityPool) -> list[str]:
    """The stored traces behind a spot pool's figures: its region and card's own, else those
    of the histories it borrows from; longest first."""
    rows = _samples_of(_history_places(pool, spot_pool_history(pool.pk)))
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


@dataclass(frozen=True)
class StoredRuns:
    """One stored single-instance trace as runs, with the moment it starts."""

    name: str
    start: datetime
    gap_seconds: int
    runs: list[tuple[int, bool]]  # (ticks, available), in order


def candidate_pool_traces(
    pool_ids: list[int],
) -> tuple[dict[int, list[str]], dict[str, StoredRuns]]:
    """For the spot pools `pool_ids`: the stored traces behind each one's figures (its own
    zone's trace when one is stored, else every trace of its region and card or of the
    histories it borrows from), and those traces' runs. Two queries."""
    pools = list(
        CapacityPool.objects.filter(pk__in=pool_ids, market=Market.SPOT).select_related(
            "region", "accelerator", "spot_history"
        )
    )
    places = {pool.pk: _history_places(pool, getattr(pool, "spot_history", None)) for pool in pools}
    every = sorted({place for found in places.values() for place in found})
    if not every:
        return {}, {}
    stored: dict[str, StoredRuns] = {}
    by_place: dict[tuple[str, str], set[str]] = defaultdict(set)
    rows = (
        _samples_of(every)
        .filter(~Q(trace__contains="#"))  # the nodes of a wide trace: not one pool's spot
        .order_by("trace", "at")
        .values_list(
            "trace", "at", "ticks", "gap_seconds", "available", "region__code", "accelerator__name"
        )
    )
    for name, at, ticks, gap, available, region, card in rows:
        if name not in stored:
            stored[name] = StoredRuns(name, at, gap, [])
            by_place[(region, card)].add(name)
        stored[name].runs.append((ticks, available))
    behind: dict[int, list[str]] = {}
    for pool in pools:
        names = sorted({n for place in places[pool.pk] for n in by_place.get(place, ())})
        own = [n for n in names if describe_trace_name(n.rsplit("/", 1)[-1]).zone == pool.zone]
        if own or names:
            behind[pool.pk] = own or names
    return behind, stored

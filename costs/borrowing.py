"""Which history a spot pool's interruption figures come from. Pure: no Django.

A pool with trace history of its own region and card uses it. A pool without borrows from the
most similar histories, in this order (the first tier that has any is pooled):

1. the same card family in the same region (V100-32GB from V100-16GB),
2. the same card in other regions,
3. the same card family in other regions,
4. other cards in the same region.

A pool that shares neither its card family nor its region with any history gets the
configured default, and says so: a T4 in a region with no trace at all is not judged by V100s
on another continent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from costs.traces import AvailabilityStats, Trace, pooled_stats

HISTORY = "history"
BORROWED = "borrowed"
DEFAULT = "default"


def card_family(accelerator: str) -> str:
    """``V100-16GB`` -> ``V100``: cards that differ only in memory share a family."""
    return accelerator.split("-")[0].upper()


@dataclass(frozen=True)
class PoolFigures:
    """A spot pool's interruption figures and where they come from."""

    source: str
    borrowed_from: tuple[str, ...]
    stats: AvailabilityStats | None

    def describe_source(self) -> str:
        """``history``, ``borrowed from V100-16GB in us-east-1`` or ``default``."""
        if self.source == BORROWED:
            return f"borrowed from {', '.join(self.borrowed_from)}"
        return self.source


def _label(key: tuple[str, str]) -> str:
    region, accelerator = key
    return f"{accelerator} in {region}"


def figures_for(
    region: str, accelerator: str, history: Mapping[tuple[str, str], list[Trace]]
) -> PoolFigures:
    """The figures of a spot pool of ``accelerator`` in ``region`` from ``history`` (traces by
    (region, accelerator)); ``stats`` is None for the default."""
    own = history.get((region, accelerator))
    if own:
        return PoolFigures(HISTORY, (), pooled_stats(own))
    family = card_family(accelerator)
    tiers = [
        lambda r, a: r == region and card_family(a) == family,
        lambda r, a: r != region and a == accelerator,
        lambda r, a: r != region and card_family(a) == family,
        lambda r, a: r == region,
    ]
    for matches in tiers:
        keys = sorted(key for key, traces in history.items() if traces and matches(*key))
        if keys:
            traces = [trace for key in keys for trace in history[key]]
            return PoolFigures(BORROWED, tuple(_label(k) for k in keys), pooled_stats(traces))
    return PoolFigures(DEFAULT, (), None)

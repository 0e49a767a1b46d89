"""Spot availability traces: loading, interruption statistics, windows and scaling.

A trace is the JSON published with the NSDI'24 paper "Can't Be Late":
``{"metadata": {"gap_seconds": N}, "data": [0|1, ...], "prices"?: [...]}`` — one value per tick
of ``gap_seconds``; ``1`` means spot was unavailable (or the held instance was preempted) during
that tick, ``0`` that it was available. The file name carries the place and the hardware:
``us-east-1c_v100_1.json`` is zone ``us-east-1c`` of region ``us-east-1``, accelerator V100, one
node.

Public API (pure: numpy + stdlib, no Django):

- ``load_trace(path) -> Trace`` and ``load_traces(folder) -> list[Trace]``
- ``preemptions_per_hour(trace) -> float``: available -> unavailable transitions per hour of
  availability, the rate the portal seeds ``CapacityPool.interruption_rate_per_hour`` with.
- ``mean_time_between_interruptions_hours(trace) -> float`` (``inf`` when never interrupted)
- ``availability_stats(trace) -> AvailabilityStats``: rate, mean outage, spell dispersion and
  availability, the history the cost estimator takes (``EstimateInput`` fields of the same name).
- ``window(trace, start_hours, hours) -> Trace`` and ``windows(trace, hours, step_hours)``
- ``scale_trace(trace, factor) -> Trace``: the same sequence of ticks on a stretched (factor > 1)
  or compressed (factor < 1) clock, so a short trace can stand in for a longer job.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# The traces name the card by family only; the shared data says they were taken on p3.2xlarge,
# whose card the instance-type catalogue calls V100-16GB. Unknown families keep their token.
TRACE_ACCELERATORS: dict[str, str] = {"v100": "V100-16GB"}

_NAME = re.compile(r"^(?P<zone>(?P<region>[a-z]+-[a-z]+-\d+)[a-z]*)_(?P<acc>[a-z0-9]+)_(?P<n>\d+)$")


@dataclass(frozen=True, eq=False)
class Trace:
    """One availability trace of one zone and accelerator.

    ``unavailable[i]`` is True when spot was unavailable or preempted during tick ``i``, which
    covers ``[i * gap_seconds, (i + 1) * gap_seconds)`` from the start of the trace.
    ``prices`` is the spot price per tick in USD per instance-hour, when the file has them.
    """

    name: str
    region: str
    zone: str
    accelerator: str
    nodes: int
    gap_seconds: float
    unavailable: np.ndarray
    prices: np.ndarray | None = None

    @property
    def available(self) -> np.ndarray:
        """True where spot could be held during the tick."""
        return ~self.unavailable

    @property
    def tick_hours(self) -> float:
        """Length of one tick in hours."""
        return self.gap_seconds / 3600.0

    @property
    def ticks(self) -> int:
        """Number of ticks."""
        return int(self.unavailable.size)

    @property
    def hours(self) -> float:
        """Length of the whole trace in hours."""
        return self.ticks * self.tick_hours

    @property
    def availability(self) -> float:
        """Share of ticks on which spot was available."""
        return float(self.available.mean()) if self.ticks else 0.0

    def mean_price(self, default: float | None = None) -> float | None:
        """Mean spot price over the trace, or ``default`` when the file had none."""
        if self.prices is None or self.prices.size == 0:
            return default
        return float(self.prices.mean())


def parse_trace_name(name: str) -> tuple[str, str, str, int]:
    """Split ``us-east-1c_v100_1`` into (region, zone, accelerator, nodes).

    Raises ``ValueError`` on a name that does not follow the convention, so an import never
    files a trace under a made-up region.
    """
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"trace name {name!r} is not like 'us-east-1c_v100_1'")
    acc = match["acc"]
    return match["region"], match["zone"], TRACE_ACCELERATORS.get(acc, acc.upper()), int(match["n"])


def trace_from_dict(name: str, payload: dict) -> Trace:
    """Build a ``Trace`` from the decoded JSON of a trace file named ``name`` (no suffix)."""
    try:
        gap = float(payload["metadata"]["gap_seconds"])
        data = payload["data"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"trace {name!r} lacks metadata.gap_seconds or data") from exc
    if gap <= 0:
        raise ValueError(f"trace {name!r} has a non-positive gap_seconds ({gap})")
    unavailable = np.asarray(data, dtype=np.int8)
    if unavailable.ndim != 1 or not np.isin(unavailable, (0, 1)).all():
        raise ValueError(f"trace {name!r}: data must be a flat list of 0 and 1")
    prices = None
    if payload.get("prices") is not None:
        prices = np.asarray(payload["prices"], dtype=float)
        if prices.shape != unavailable.shape:
            raise ValueError(f"trace {name!r}: prices and data differ in length")
    region, zone, accelerator, nodes = parse_trace_name(name)
    return Trace(
        name=name,
        region=region,
        zone=zone,
        accelerator=accelerator,
        nodes=nodes,
        gap_seconds=gap,
        unavailable=unavailable.astype(bool),
        prices=prices,
    )


def load_trace(path: str | Path) -> Trace:
    """Load one trace file; the name of the file gives region, zone and accelerator."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        payload = json.load(handle)
    return trace_from_dict(path.stem, payload)


def load_traces(folder: str | Path) -> list[Trace]:
    """Load every ``*.json`` trace under ``folder`` (recursively), sorted by path."""
    return [load_trace(p) for p in sorted(Path(folder).rglob("*.json"))]


def preemption_count(trace: Trace) -> int:
    """Number of available -> unavailable transitions (each one ends a spot run)."""
    u = trace.unavailable
    return int(np.count_nonzero(~u[:-1] & u[1:]))


def available_hours(trace: Trace) -> float:
    """Hours during which spot was available."""
    return float(np.count_nonzero(trace.available)) * trace.tick_hours


def preemptions_per_hour(trace: Trace) -> float:
    """Interruptions per hour of spot held: transitions over hours of availability.

    Per hour *held*, not per wall-clock hour, because that is what a running job experiences:
    a zone that is mostly unavailable but stable when it is up interrupts rarely. A trace with
    no available tick has no measurable rate; it reports 0.0 and the caller should look at
    ``Trace.availability``.
    """
    held = available_hours(trace)
    return preemption_count(trace) / held if held > 0 else 0.0


def mean_time_between_interruptions_hours(trace: Trace) -> float:
    """Mean hours of spot held between two interruptions (``inf`` when there were none)."""
    count = preemption_count(trace)
    return available_hours(trace) / count if count else math.inf


def spell_hours(mask: np.ndarray, tick_hours: float) -> np.ndarray:
    """Lengths in hours of the runs of True in ``mask`` (runs cut by the trace's ends included)."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return (np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)) * tick_hours


@dataclass(frozen=True)
class AvailabilityStats:
    """What a trace says about a pool, in the estimator's terms.

    ``uptime_cv`` and ``outage_cv`` are the coefficients of variation of the lengths of available
    and unavailable spells (1 for exponential spells; the shared traces measure 1.3 to 2.6: many
    short spells and a few very long ones).
    """

    interruption_rate_per_hour: float
    mean_outage_hours: float
    uptime_cv: float
    outage_cv: float
    availability: float
    interruptions: int
    hours: float


# Fewer spells than this say little about their spread: assume exponential spells (cv 1).
MIN_SPELLS_FOR_CV = 5


def _cv(values: np.ndarray) -> float:
    if values.size < MIN_SPELLS_FOR_CV or values.mean() <= 0:
        return 1.0
    return max(0.1, float(values.std() / values.mean()))


def availability_stats(trace: Trace) -> AvailabilityStats:
    """Interruption rate, outage length and their dispersion measured on ``trace``."""
    up = spell_hours(trace.available, trace.tick_hours)
    down = spell_hours(trace.unavailable, trace.tick_hours)
    return AvailabilityStats(
        interruption_rate_per_hour=preemptions_per_hour(trace),
        mean_outage_hours=float(down.mean()) if down.size else 0.0,
        uptime_cv=_cv(up),
        outage_cv=_cv(down),
        availability=trace.availability,
        interruptions=preemption_count(trace),
        hours=trace.hours,
    )


def window(trace: Trace, start_hours: float, hours: float) -> Trace:
    """The part of ``trace`` from ``start_hours`` lasting ``hours`` (clipped to the trace)."""
    if start_hours < 0 or hours < 0:
        raise ValueError("window start and length must not be negative")
    first = round(start_hours / trace.tick_hours)
    last = min(trace.ticks, first + math.ceil(hours / trace.tick_hours - 1e-9))
    prices = trace.prices[first:last] if trace.prices is not None else None
    return replace(
        trace,
        name=f"{trace.name}@{start_hours:g}h",
        unavailable=trace.unavailable[first:last],
        prices=prices,
    )


def windows(trace: Trace, hours: float, step_hours: float) -> Iterator[Trace]:
    """Every full window of ``hours`` starting each ``step_hours`` from the start of ``trace``."""
    if hours <= 0 or step_hours <= 0:
        raise ValueError("window length and step must be positive")
    start = 0.0
    while start + hours <= trace.hours + 1e-9:
        yield window(trace, start, hours)
        start += step_hours


def scale_trace(trace: Trace, factor: float) -> Trace:
    """The same ticks on a clock ``factor`` times slower (each tick lasts ``factor`` x longer).

    A 7-day trace scaled by 2 covers 14 days with half the interruption rate per hour; scaled by
    0.5 it covers 3.5 days with twice the rate. Scaling the job instead (work, deadline and
    restart divided by ``factor``) gives the same replay, which is how the benchmark uses it.
    """
    if factor <= 0:
        raise ValueError("scale factor must be positive")
    return replace(trace, name=f"{trace.name}x{factor:g}", gap_seconds=trace.gap_seconds * factor)

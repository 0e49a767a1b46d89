"""Spot availability traces: loading, interruption statistics, windows and scaling.

A trace is the JSON of the shared format (published with the NSDI'24 paper "Can't Be Late"):
``{"metadata": {"gap_seconds": N}, "data": [...], "prices"?: [...]}`` — one value per tick of
``gap_seconds``. On a single-node trace a value is ``1`` when spot was unavailable (or the held
instance was preempted) during that tick and ``0`` when it was available; on a trace of N nodes
it is how many of the N nodes could not be had (0..N). A job of n nodes has spot during a tick
when at least n of the trace's nodes could be had.

Any file name is accepted. When the name follows a known pattern it also says where the trace
was taken: AWS ``us-east-1c_v100_1`` (zone ``us-east-1c`` of region ``us-east-1``, V100, one
node) or GCP ``us-central1-a_k80_4`` / ``us-central1-a_c3-88`` (zone ``us-central1-a`` of
region ``us-central1``); otherwise region, zone and accelerator are None. The number of nodes
comes from the name, else ``metadata.nodes``, else the largest value (at least 1).

Public API (pure: numpy + stdlib, no Django):

- ``load_trace(path) -> Trace`` and ``load_traces(folder) -> list[Trace]``; ``trace_from_dict``
  raises ``ValueError`` with a one-line message naming the problem.
- ``Trace.for_job(nodes)``: the trace as a job of ``nodes`` nodes sees it (one value per tick:
  could the whole gang be had); ``Trace.node_traces()``: one single-instance trace per node.
- ``preemptions_per_hour(trace) -> float``: available -> unavailable transitions per hour of
  availability, the rate the portal seeds ``CapacityPool.interruption_rate_per_hour`` with.
- ``mean_time_between_interruptions_hours(trace) -> float`` (``inf`` when never interrupted)
- ``availability_stats(trace) -> AvailabilityStats`` and ``pooled_stats(traces)``: rate, mean
  outage, spell dispersion and availability, the history the cost estimator takes
  (``EstimateInput`` fields of the same name).
- ``joint_availability(traces, starts_hours) -> Trace``: spot for a job that may take any of
  several pools (available while at least one is), on the span all the traces cover, and
  ``interruption_waits``: how long such a job waits for spot after each interruption.
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
TRACE_ACCELERATORS: dict[str, str] = {
    "v100": "V100-16GB",
    "t4": "T4",
    "k80": "K80",
    "a10g": "A10G",
    "a100": "A100-40GB",
}

# AWS: us-east-1c_v100_1 (the zone letter may be missing: a region's trace).
_AWS_NAME = re.compile(
    r"^(?P<zone>(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)[a-z]*)_(?P<acc>[a-z0-9]+)(?:_(?P<n>\d+))?$"
)
# GCP: us-central1-a_k80_4, us-central1-a_c3-88 (the card or machine token may hold dashes).
_GCP_NAME = re.compile(
    r"^(?P<zone>(?P<region>[a-z]+-[a-z]+\d+)-[a-z])_(?P<acc>[a-z0-9][a-z0-9-]*?)(?:_(?P<n>\d+))?$"
)
# How far back the estimator and the policies look: the most recent week of each trace
# (decision 020: recent history predicts the next days better than all of it).
RECENT_HISTORY_HOURS = 168.0
# Past this many ticks a file is not a trace anyone recorded (a year of 1-second ticks).
MAX_TRACE_TICKS = 40_000_000


@dataclass(frozen=True)
class TraceName:
    """What a trace's file name says; None where the name does not follow a known pattern."""

    region: str | None = None
    zone: str | None = None
    accelerator: str | None = None
    nodes: int | None = None


def describe_trace_name(name: str) -> TraceName:
    """Region, zone, accelerator and nodes from an AWS or GCP style name, else all None."""
    for pattern in (_AWS_NAME, _GCP_NAME):
        match = pattern.match(name.lower())
        if match is not None:
            acc = match["acc"]
            return TraceName(
                region=match["region"],
                zone=match["zone"],
                accelerator=TRACE_ACCELERATORS.get(acc, acc.upper()),
                nodes=int(match["n"]) if match["n"] else None,
            )
    return TraceName()


@dataclass(frozen=True, eq=False)
class Trace:
    """One availability trace of one place and accelerator (either may be unknown: None).

    ``unavailable[i]`` is True when not a single node could be had during tick ``i``, which
    covers ``[i * gap_seconds, (i + 1) * gap_seconds)`` from the start of the trace: what a job
    of one node sees. ``lost_nodes`` holds the count per tick on a trace of several nodes
    (None on a single-node one). ``prices`` is the spot price per tick in USD per
    instance-hour, when the file has them.
    """

    name: str
    region: str | None
    zone: str | None
    accelerator: str | None
    nodes: int
    gap_seconds: float
    unavailable: np.ndarray
    prices: np.ndarray | None = None
    lost_nodes: np.ndarray | None = None

    @property
    def label(self) -> str:
        """The zone when the name says it, else the name."""
        return self.zone or self.name

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

    def _lost(self) -> np.ndarray:
        if self.lost_nodes is not None:
            return self.lost_nodes
        return self.unavailable.astype(np.int64) * self.nodes

    def for_job(self, nodes: int) -> Trace:
        """The trace as a job of ``nodes`` nodes sees it: spot only while that many can be had.

        Raises ``ValueError`` when the trace has fewer nodes than the job needs.
        """
        if nodes < 1:
            raise ValueError(f"a job needs at least one node, not {nodes}")
        if nodes > self.nodes:
            raise ValueError(
                f"trace {self.name!r} follows {self.nodes} node(s); a job of {nodes} cannot "
                "be judged on it"
            )
        if nodes == 1 and self.lost_nodes is None:
            return self
        unavailable = self.nodes - self._lost() < nodes
        return replace(self, unavailable=unavailable, lost_nodes=None, nodes=nodes)

    def node_traces(self) -> list[Trace]:
        """One single-instance trace per node: node k is lost while at least k nodes are.

        Their interruptions add up to every node lost, so rates pooled over them are per
        instance-hour, whatever the trace's width.
        """
        if self.nodes == 1 and self.lost_nodes is None:
            return [self]
        lost = self._lost()
        return [
            replace(self, name=f"{self.name}#{k}", unavailable=lost >= k, lost_nodes=None, nodes=1)
            for k in range(1, self.nodes + 1)
        ]


def parse_trace_name(name: str) -> tuple[str, str, str, int]:
    """Split ``us-east-1c_v100_1`` (or a GCP name) into (region, zone, accelerator, nodes).

    Raises ``ValueError`` on a name that follows no known pattern, for callers that must match
    a trace to a place (the market simulator's bare folders); loading a trace needs no pattern.
    """
    said = describe_trace_name(name)
    if said.region is None or said.zone is None or said.accelerator is None:
        raise ValueError(
            f"trace name {name!r} is not like 'us-east-1c_v100_1' or 'us-central1-a_k80_1'"
        )
    return said.region, said.zone, said.accelerator, said.nodes or 1


def _whole_counts(name: str, data: object) -> np.ndarray:
    """The data values as whole numbers >= 0, or a one-line error naming the first bad one."""
    if not isinstance(data, list):
        raise ValueError(
            f"trace {name!r}: data must be a list of numbers, not {type(data).__name__}"
        )
    if not data:
        raise ValueError(f"trace {name!r}: data is empty")
    if len(data) > MAX_TRACE_TICKS:
        raise ValueError(f"trace {name!r}: {len(data)} ticks, more than {MAX_TRACE_TICKS:,}")
    try:
        raw = np.asarray(data)
    except ValueError:  # ragged nesting
        raw = np.asarray(data, dtype=object)
    if raw.ndim != 1 or raw.dtype.kind not in "biuf":
        bad = next(
            (i, v) for i, v in enumerate(data) if isinstance(v, str | list | dict) or v is None
        )
        raise ValueError(
            f"trace {name!r}: value {bad[1]!r} at tick {bad[0]} is not a whole number of "
            "unavailable nodes (0, 1, ... N)"
        )
    values = raw.astype(float)
    wrong = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
    if wrong.size:
        i = int(wrong[0])
        raise ValueError(
            f"trace {name!r}: value {data[i]!r} at tick {i} is not a whole number of "
            "unavailable nodes (0, 1, ... N)"
        )
    return values.astype(np.int64)


def _node_count(name: str, payload: dict, said: TraceName, counts: np.ndarray) -> int:
    declared = payload["metadata"].get("nodes")
    if said.nodes is not None:
        nodes = said.nodes
    elif declared is not None:
        if isinstance(declared, bool) or not isinstance(declared, int) or declared < 1:
            raise ValueError(f"trace {name!r}: metadata.nodes must be a whole number >= 1")
        nodes = declared
    else:
        nodes = max(1, int(counts.max()))
    if nodes < 1:
        raise ValueError(f"trace {name!r}: a trace follows at least one node")
    too_many = np.flatnonzero(counts > nodes)
    if too_many.size:
        i = int(too_many[0])
        raise ValueError(
            f"trace {name!r}: value {int(counts[i])} at tick {i} is more than the trace's "
            f"{nodes} node(s)"
        )
    return nodes


def trace_from_dict(name: str, payload: object) -> Trace:
    """Build a ``Trace`` from the decoded JSON of a trace file named ``name`` (no suffix).

    Raises ``ValueError`` with one line naming the problem when it is not a trace.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"trace {name!r}: not a JSON object with metadata and data")
    try:
        gap = float(payload["metadata"]["gap_seconds"])
        data = payload["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"trace {name!r} lacks a numeric metadata.gap_seconds or data") from exc
    if not math.isfinite(gap) or gap <= 0:
        raise ValueError(f"trace {name!r} has a gap_seconds that is not a positive number ({gap})")
    counts = _whole_counts(name, data)
    said = describe_trace_name(name)
    nodes = _node_count(name, payload, said, counts)
    prices = None
    if payload.get("prices") is not None:
        try:
            prices = np.asarray(payload["prices"], dtype=float)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"trace {name!r}: prices must be a list of numbers") from exc
        if prices.shape != counts.shape:
            raise ValueError(f"trace {name!r}: prices and data differ in length")
        if not np.isfinite(prices).all() or (prices < 0).any():
            raise ValueError(f"trace {name!r}: prices must be finite and not negative")
    return Trace(
        name=name,
        region=said.region,
        zone=said.zone,
        accelerator=said.accelerator,
        nodes=nodes,
        gap_seconds=gap,
        unavailable=counts >= nodes,
        prices=prices,
        lost_nodes=counts if nodes > 1 else None,
    )


def load_trace(path: str | Path) -> Trace:
    """Load one trace file; its name may say region, zone and accelerator.

    Raises ``ValueError`` (one line, naming the file and the problem) when the file is not a
    trace in the shared format, ``OSError`` when it cannot be read.
    """
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        try:
            payload = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"{path.name} is not JSON ({str(exc).splitlines()[0]})") from None
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


def pooled_stats(traces: list[Trace]) -> AvailabilityStats | None:
    """``availability_stats`` of several traces taken together (a region's zones, the nodes of
    a wide trace): interruptions over hours held, spells pooled for the outage and the spreads.
    None when no trace has a tick."""
    traces = [t for t in traces if t.ticks]
    if not traces:
        return None
    ups = [spell_hours(t.available, t.tick_hours) for t in traces]
    downs = [spell_hours(t.unavailable, t.tick_hours) for t in traces]
    up, down = np.concatenate(ups), np.concatenate(downs)
    count = sum(preemption_count(t) for t in traces)
    held = sum(available_hours(t) for t in traces)
    hours = sum(t.hours for t in traces)
    return AvailabilityStats(
        interruption_rate_per_hour=count / held if held > 0 else 0.0,
        mean_outage_hours=float(down.mean()) if down.size else 0.0,
        uptime_cv=_cv(up),
        outage_cv=_cv(down),
        availability=held / hours if hours > 0 else 0.0,
        interruptions=count,
        hours=hours,
    )


def _aligned(traces: list[Trace], starts_hours: list[float]) -> list[np.ndarray] | None:
    """Each trace's unavailable ticks (a job of one node) on the span all of them cover."""
    if not traces or len(traces) != len(starts_hours):
        raise ValueError("one start per trace, and at least one trace")
    gap = traces[0].gap_seconds
    if any(t.gap_seconds != gap for t in traces):
        raise ValueError("traces on different ticks cannot be laid on one clock")
    offsets = [round(start * 3600.0 / gap) for start in starts_hours]
    first = max(offsets)
    last = min(offset + t.ticks for offset, t in zip(offsets, traces, strict=True))
    if last - first < 1:
        return None
    return [
        t.for_job(1).unavailable[first - offset : last - offset]
        for offset, t in zip(offsets, traces, strict=True)
    ]


def joint_availability(traces: list[Trace], starts_hours: list[float]) -> Trace | None:
    """Spot as a job free to take any of several pools sees it: available during a tick when
    at least one of ``traces`` is (a job of one node). ``starts_hours`` lays the traces on one
    clock (the hour each one starts, from any common origin); the answer covers the span all of
    them cover. The traces must share their tick (``ValueError`` otherwise); None when they do
    not overlap by a whole tick.
    """
    aligned = _aligned(traces, starts_hours)
    if aligned is None:
        return None
    return Trace(
        name=" | ".join(t.name for t in traces),
        region=None,
        zone=None,
        accelerator=None,
        nodes=1,
        gap_seconds=traces[0].gap_seconds,
        unavailable=np.logical_and.reduce(aligned),
    )


def interruption_waits(traces: list[Trace], starts_hours: list[float]) -> np.ndarray | None:
    """Hours a job free to take any of several pools waits for spot after each interruption:
    at every drop of one trace, nothing when another trace has spot in that tick, else until
    one has (the joint outage that begins there). Same clock and span as
    ``joint_availability``; None when the traces do not overlap."""
    aligned = _aligned(traces, starts_hours)
    if aligned is None:
        return None
    joint = np.logical_and.reduce(aligned)
    edges = np.diff(np.concatenate(([0], joint.astype(np.int8), [0])))
    run_from = np.zeros(joint.size)
    begins = np.flatnonzero(edges == 1)
    run_from[begins] = (np.flatnonzero(edges == -1) - begins) * traces[0].tick_hours
    drops = np.concatenate([np.flatnonzero(~u[:-1] & u[1:]) + 1 for u in aligned])
    # A drop while every other pool is away too begins a joint outage (the dropping pool had
    # spot the tick before), so its wait is that outage's whole length.
    return run_from[drops]


def spread(values: np.ndarray) -> float:
    """Coefficient of variation of spell lengths (1, as exponential, for fewer than
    ``MIN_SPELLS_FOR_CV`` of them)."""
    return _cv(values)


def recent(trace: Trace, hours: float = RECENT_HISTORY_HOURS) -> Trace:
    """The last ``hours`` of ``trace`` (all of it when shorter), whole ticks from the end."""
    first = max(0, trace.ticks - math.ceil(hours / trace.tick_hours - 1e-9))
    return window(trace, first * trace.tick_hours, trace.hours)


def window(trace: Trace, start_hours: float, hours: float) -> Trace:
    """The part of ``trace`` from ``start_hours`` lasting ``hours`` (clipped to the trace)."""
    if start_hours < 0 or hours < 0:
        raise ValueError("window start and length must not be negative")
    first = round(start_hours / trace.tick_hours)
    last = min(trace.ticks, first + math.ceil(hours / trace.tick_hours - 1e-9))
    prices = trace.prices[first:last] if trace.prices is not None else None
    lost = trace.lost_nodes[first:last] if trace.lost_nodes is not None else None
    return replace(
        trace,
        name=f"{trace.name}@{start_hours:g}h",
        unavailable=trace.unavailable[first:last],
        prices=prices,
        lost_nodes=lost,
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

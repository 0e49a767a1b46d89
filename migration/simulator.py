"""The spot market simulator (pure): which running spot instances the market reclaims in one
tick. `migration.market_tick` drives it from beat; it is off unless a time scale is set.

A tick covers ``wall_seconds`` of real time since the previous one. The time scale turns that
into simulated time (``wall_seconds * time_scale`` simulated seconds: 3600 makes a wall second
an hour of market), so a demo sees in minutes the preemptions of a day. A scale of 0 is no
simulated time at all: nothing is ever preempted.

Each spot pool behaves in one of two ways:

- Poisson (no trace): every running instance is preempted within the ``h`` simulated hours it
  was exposed during the tick with probability ``1 - exp(-rate * h)``, ``rate`` being the pool's
  interruption rate per instance-hour. Draws come from the ``random.Random`` passed in, one per
  exposed instance in instance-id order, so a seeded generator repeats a run exactly.
- Trace replay: the pool replays a trace in the shared format (one value per tick of
  ``gap_seconds``: 0 = available, N = N nodes unavailable; the 1-node traces use 0/1) on the
  simulator's clock, the simulated hours since it was switched on, wrapping around at the
  trace's end. Every tick boundary where more nodes are unavailable than in the tick before
  preempts that many instances of the pool (one for a 0 -> 1 drop of a 1-node trace), lowest
  instance id first. An outage going on, or ending, preempts nothing; nor does a drop that came
  before an instance started running.

An instance is exposed only for the part of the tick it was running (since ``running_since``),
so one placed a moment ago is not charged a whole tick of market.

A preemption is the two-level notice with the pool's own windows, ``advance_notice_s`` then
``final_window_s``. They are not compressed by the time scale: the scale makes preemptions
come more often, but the checkpoint still has to fit into the real window the pool promises.

An instance already under notice (``under_notice``) is never preempted again, and a trace's
drop passes it by for the next one; within a tick an instance is preempted at most once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ReplayTrace:
    """A trace to replay: ``unavailable[i]`` nodes were unavailable during tick ``i``, which
    covers ``[i * gap_seconds, (i + 1) * gap_seconds)`` of the trace."""

    name: str
    gap_seconds: float
    unavailable: tuple[int, ...]
    # Tick indices whose value rises above the one before (the trace repeats, so tick 0
    # follows the last tick), with the number of nodes lost there.
    rises: tuple[tuple[int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.gap_seconds <= 0:
            raise ValueError(f"trace {self.name!r} has a non-positive gap_seconds")
        if not self.unavailable:
            raise ValueError(f"trace {self.name!r} has no ticks")
        values = self.unavailable
        rises = tuple(
            (i, values[i] - values[i - 1]) for i in range(len(values)) if values[i] > values[i - 1]
        )
        object.__setattr__(self, "rises", rises)

    @property
    def tick_hours(self) -> float:
        return self.gap_seconds / SECONDS_PER_HOUR

    @property
    def ticks(self) -> int:
        return len(self.unavailable)

    @property
    def hours(self) -> float:
        return self.ticks * self.tick_hours


def replay_trace_from_dict(name: str, payload: Mapping[str, Any]) -> ReplayTrace:
    """A ``ReplayTrace`` from the decoded JSON of a trace file in the shared format, whose
    values may count unavailable nodes (0..N) as well as be 0/1. Raises ``ValueError``."""
    try:
        gap = float(payload["metadata"]["gap_seconds"])
        data = payload["data"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"trace {name!r} lacks a numeric metadata.gap_seconds or data") from exc
    if not isinstance(data, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in data
    ):
        raise ValueError(f"trace {name!r}: data must be a flat list of whole numbers >= 0")
    return ReplayTrace(name=name, gap_seconds=gap, unavailable=tuple(data))


@dataclass(frozen=True)
class SpotPool:
    """A spot pool as the market sees it; with a trace it replays the trace, else Poisson."""

    id: int
    interruption_rate_per_hour: float
    advance_notice_s: float
    final_window_s: float
    trace: ReplayTrace | None = None


@dataclass(frozen=True)
class RunningInstance:
    """A running spot instance. ``running_since`` None: running for the whole tick."""

    id: int
    pool_id: int
    running_since: datetime | None = None
    under_notice: bool = False


@dataclass(frozen=True)
class MarketTick:
    """One tick: ``wall_seconds`` of real time up to ``now``, at ``time_scale`` simulated
    seconds per wall second, starting at ``clock_hours`` of the simulator's clock."""

    now: datetime
    wall_seconds: float
    time_scale: float
    clock_hours: float = 0.0

    @property
    def elapsed_hours(self) -> float:
        return simulated_hours(self.wall_seconds, self.time_scale)

    @property
    def end_hours(self) -> float:
        """The clock at the end of the tick: the next tick's ``clock_hours``."""
        return self.clock_hours + self.elapsed_hours


@dataclass(frozen=True)
class Preemption:
    """Start the two-level notice on an instance now, with these windows (real seconds)."""

    instance_id: int
    advance_notice_s: float
    final_window_s: float
    reason: str


def simulated_hours(wall_seconds: float, time_scale: float) -> float:
    """Simulated hours in ``wall_seconds`` at ``time_scale`` (0 or less: none)."""
    if wall_seconds <= 0 or time_scale <= 0:
        return 0.0
    return wall_seconds * time_scale / SECONDS_PER_HOUR


def exposure_hours(instance: RunningInstance, tick: MarketTick) -> float:
    """Simulated hours of the tick during which ``instance`` was running (the tick's end)."""
    wall = tick.wall_seconds
    if instance.running_since is not None:
        wall = min(wall, (tick.now - instance.running_since).total_seconds())
    return simulated_hours(wall, tick.time_scale)


def trace_drops(
    trace: ReplayTrace, start_hours: float, end_hours: float
) -> Iterator[tuple[float, int]]:
    """``(at_hours, nodes_lost)`` for every tick boundary in ``(start_hours, end_hours]`` of
    the clock where the trace loses nodes, in time order; the trace repeats from its start.

    Half-open on the left so that consecutive ticks, whose end and start are the same number,
    see every boundary exactly once.
    """
    if end_hours <= start_hours or not trace.rises:
        return
    first = math.floor(start_hours / trace.tick_hours) + 1
    last = math.floor(end_hours / trace.tick_hours)
    n = trace.ticks
    for cycle in range(first // n, last // n + 1):
        base = cycle * n
        for index, lost in trace.rises:
            boundary = base + index
            if boundary < first:
                continue
            if boundary > last:
                break
            yield boundary * trace.tick_hours, lost


def market_preemptions(
    pools: Sequence[SpotPool],
    instances: Sequence[RunningInstance],
    tick: MarketTick,
    rng: random.Random,
) -> list[Preemption]:
    """The preemptions to start at the end of ``tick``, in instance-id order. Instances of
    pools not in ``pools`` (on-demand ones, say) are left alone."""
    by_pool: dict[int, list[RunningInstance]] = {}
    for instance in sorted(instances, key=lambda i: i.id):
        if not instance.under_notice:
            by_pool.setdefault(instance.pool_id, []).append(instance)
    found: list[Preemption] = []
    for pool in sorted(pools, key=lambda p: p.id):
        members = by_pool.get(pool.id, [])
        if not members or tick.elapsed_hours <= 0:
            continue
        if pool.trace is None:
            found.extend(_poisson(pool, members, tick, rng))
        else:
            found.extend(_replay(pool, pool.trace, members, tick))
    return sorted(found, key=lambda p: p.instance_id)


def _poisson(
    pool: SpotPool, members: list[RunningInstance], tick: MarketTick, rng: random.Random
) -> Iterator[Preemption]:
    rate = pool.interruption_rate_per_hour
    if rate <= 0:
        return
    for instance in members:
        hours = exposure_hours(instance, tick)
        if hours <= 0:
            continue
        if rng.random() < 1.0 - math.exp(-rate * hours):
            yield Preemption(
                instance.id,
                pool.advance_notice_s,
                pool.final_window_s,
                f"Poisson preemption at {rate:g} per instance-hour",
            )


def _replay(
    pool: SpotPool, trace: ReplayTrace, members: list[RunningInstance], tick: MarketTick
) -> Iterator[Preemption]:
    # When each instance's exposure starts on the clock: a drop before it does not touch it.
    since = {i.id: _exposed_from(i, tick) for i in members}
    left = list(members)
    for at_hours, lost in trace_drops(trace, tick.clock_hours, tick.end_hours):
        hit = [i for i in left if since[i.id] < at_hours][:lost]
        for instance in hit:
            left.remove(instance)
            yield Preemption(
                instance.id,
                pool.advance_notice_s,
                pool.final_window_s,
                f"trace {trace.name}: {lost} node(s) lost at hour "
                f"{at_hours % trace.hours:.2f} of the replay",
            )
        if not left:
            return


def _exposed_from(instance: RunningInstance, tick: MarketTick) -> float:
    """The clock reading from which ``instance`` was exposed during ``tick``."""
    hours = exposure_hours(instance, tick)
    # Running throughout: every drop of the tick counts, with no rounding at its start.
    return -math.inf if hours >= tick.elapsed_hours else tick.end_hours - hours

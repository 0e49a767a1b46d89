"""The spot market simulator (pure): which running spot instances a market would reclaim in
an interval of simulated time. Driven by `migration.market_tick` on beat; off unless a time
scale is set.

Two ways a pool's market behaves:
- Poisson: each instance is reclaimed within an interval of `h` simulated hours with
  probability `1 - exp(-rate * h)`, the pool's interruption rate per instance-hour;
- a replayed trace (the shared format: one value per tick, non-zero = spot unavailable): every
  instance of the pool is reclaimed when the trace goes from available to unavailable inside
  the interval (capacity vanishing takes the whole zone), on a clock that wraps around the
  trace.

A reclaim is a two-level notice with the pool's own windows (advance notice, final window):
the time scale compresses how often preemptions come, not the window a checkpoint must fit.
Instances already under notice are not passed in, so none is preempted twice.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SimulatedPool:
    id: int
    interruption_rate_per_hour: float
    advance_notice_s: float
    final_window_s: float
    unavailable: tuple[bool, ...] = ()  # a replayed trace, one value per tick
    tick_hours: float = 1.0


@dataclass(frozen=True)
class Preemption:
    instance_id: int
    advance_notice_s: float
    final_window_s: float
    reason: str


def availability_drops(pool: SimulatedPool, start_hours: float, end_hours: float) -> int:
    """How many times the pool's trace goes from available to unavailable in
    [start_hours, end_hours) of simulated time (the trace repeats)."""
    ticks = len(pool.unavailable)
    if ticks < 2 or end_hours <= start_hours:
        return 0
    first = math.floor(start_hours / pool.tick_hours)
    last = math.floor(end_hours / pool.tick_hours)
    drops = 0
    for tick in range(first + 1, last + 1):
        now, before = pool.unavailable[tick % ticks], pool.unavailable[(tick - 1) % ticks]
        drops += int(now and not before)
    return drops


def preemptions(
    pools: Sequence[SimulatedPool],
    running: Sequence[tuple[int, int]],
    start_hours: float,
    end_hours: float,
    rng: random.Random,
) -> list[Preemption]:
    """The reclaims of the interval [start_hours, end_hours) for `running` (instance id, pool
    id) pairs of instances not already under notice, in instance order."""
    hours = max(0.0, end_hours - start_hours)
    by_pool = {pool.id: pool for pool in pools}
    found = []
    for instance_id, pool_id in sorted(running):
        pool = by_pool.get(pool_id)
        if pool is None or hours == 0:
            continue
        if pool.unavailable:
            hit = availability_drops(pool, start_hours, end_hours) > 0
            reason = "the replayed trace lost spot capacity"
        else:
            chance = 1 - math.exp(-pool.interruption_rate_per_hour * hours)
            hit = rng.random() < chance
            reason = f"Poisson at {pool.interruption_rate_per_hour:g} per hour"
        if hit:
            found.append(
                Preemption(instance_id, pool.advance_notice_s, pool.final_window_s, reason)
            )
    return found

"""What-if replay for users: a job's shape and tolerance over a chosen trace, with the policy
against greedy, always-on-demand and the omniscient optimum, the decisions over time and the
regret in dollars. Pure (numpy + the pure cost modules, no Django).

``replay_what_if(WhatIfJob, trace) -> WhatIfResult``; ``WhatIfResult.to_dict()`` is the body of
``POST /api/replays/``.

Work per request is bounded: the omniscient optimum is a dynamic programme over ticks x slack
units (decision 022), so a fine trace under a long deadline is coarsened, ticks merged
``ticks_merged`` to one (a merged tick is unavailable when any of its ticks was: never kinder
to spot than the trace), until the programme has at most ``MAX_DP_CELLS`` cells and the replay
at most ``MAX_REPLAY_TICKS`` ticks; the answer says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from costs.policies import TOLERANCES
from costs.replay import (
    Grid,
    ReplayComparison,
    ReplayJob,
    ReplayLog,
    make_greedy_policy,
    make_tolerance_policy,
    on_demand_policy,
    optimal_outcome,
    replay,
)
from costs.traces import RECENT_HISTORY_HOURS, Trace, availability_stats, window

# About half a second of the optimum's programme on an idle core (10.5 million cells: 0.44 s),
# a few thousand decisions of the policy: the whole request stays within two seconds.
MAX_DP_CELLS = 12_000_000
MAX_REPLAY_TICKS = 20_000
# Below this much trace before the window, the policy believes the rate of the whole trace.
MIN_HISTORY_HOURS = 24.0


class ReplayRefused(ValueError):
    """A what-if that cannot be replayed as asked, with the field it concerns (for a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class WhatIfJob:
    """The job replayed and what its policy believes; hours from the window's start."""

    job: ReplayJob
    tolerance: str
    nodes: int = 1
    start_hours: float = 0.0
    max_wait_hours: float | None = None
    max_interruptions: int | None = None

    def __post_init__(self) -> None:
        if self.tolerance not in TOLERANCES:
            raise ReplayRefused("tolerance", f"must be one of {', '.join(TOLERANCES)}")
        if self.job.deadline_hours < self.job.task_hours:
            raise ReplayRefused("deadline_hours", "must be at least task_hours")


@dataclass(frozen=True)
class WhatIfResult:
    """The replay of the policy next to the three references on one window of a trace."""

    trace: Trace
    window: Trace
    request: WhatIfJob
    comparison: ReplayComparison
    policy_log: ReplayLog
    greedy_log: ReplayLog
    believed_rate: float
    believed_from: str
    ticks_merged: int

    @property
    def regret(self) -> float:
        """What the policy paid above the omniscient optimum, in dollars."""
        return self.comparison.policy.cost - self.comparison.optimal.cost

    def to_dict(self) -> dict[str, object]:
        """The body of ``POST /api/replays/``."""
        tick = self.window.tick_hours
        job = self.request.job
        return {
            "trace": {
                "name": self.trace.name,
                "region": self.trace.region,
                "zone": self.trace.zone,
                "accelerator": self.trace.accelerator,
                "nodes": self.trace.nodes,
                "gap_seconds": self.trace.gap_seconds,
                "hours": round(self.trace.hours, 3),
                "window_start_hours": self.request.start_hours,
                "window_availability": round(self.window.availability, 4),
                "ticks_merged": self.ticks_merged,
            },
            "job": {
                "task_hours": job.task_hours,
                "deadline_hours": job.deadline_hours,
                "restart_overhead_hours": job.restart_overhead_hours,
                "spot_price": job.spot_price,
                "on_demand_price": job.on_demand_price,
                "tolerance": self.request.tolerance,
                "nodes": self.request.nodes,
            },
            "interruption_rate_per_hour": round(self.believed_rate, 4),
            "interruption_rate_from": self.believed_from,
            **self.comparison.to_dict(),
            "regret": round(self.regret, 4),
            "regret_vs_greedy": round(self.comparison.policy.cost - self.comparison.greedy.cost, 4),
            "decisions": {
                "policy": self.policy_log.segments(tick),
                "greedy": self.greedy_log.segments(tick),
            },
            "preemptions_at_hours": {
                "policy": [round(t * tick, 6) for t in self.policy_log.preempted_at],
                "greedy": [round(t * tick, 6) for t in self.greedy_log.preempted_at],
            },
            "spot_unavailable": _unavailable_spans(self.window),
        }


def _unavailable_spans(trace: Trace) -> list[list[float]]:
    """``[[start_hours, end_hours], ...]`` where the window had no spot for the gang."""
    mask = trace.unavailable.astype(np.int8)
    edges = np.diff(np.concatenate(([0], mask, [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    tick = trace.tick_hours
    return [[round(s * tick, 6), round(e * tick, 6)] for s, e in zip(starts, ends, strict=True)]


def coarsen(trace: Trace, factor: int) -> Trace:
    """``factor`` ticks merged into one, unavailable when any of them was (and the most nodes
    lost of them); prices averaged."""
    if factor == 1:
        return trace
    n = trace.ticks // factor * factor
    lost = trace.lost_nodes
    prices = trace.prices
    return replace(
        trace,
        name=f"{trace.name}/{factor}",
        gap_seconds=trace.gap_seconds * factor,
        unavailable=np.asarray(trace.unavailable[:n].reshape(-1, factor).any(axis=1)),
        lost_nodes=None if lost is None else lost[:n].reshape(-1, factor).max(axis=1),
        prices=None if prices is None else prices[:n].reshape(-1, factor).mean(axis=1),
    )


def work_of(gap_seconds: float, job: ReplayJob) -> tuple[int, int]:
    """(cells of the optimum's programme, ticks a replay may take) on ticks of ``gap_seconds``."""
    grid = Grid.of(gap_seconds, job)
    ticks = math.ceil(grid.deadline_ticks)
    slack = max(0, math.floor(grid.deadline_ticks * grid.units_per_tick - grid.work_units))
    horizon = ticks + math.ceil((grid.work_units + grid.overhead_units) / grid.units_per_tick)
    return ticks * (slack + 1), horizon


def merge_factor(gap_seconds: float, job: ReplayJob) -> int:
    """The fewest ticks to merge so the replay stays within the bounds; raises
    ``ReplayRefused`` when even merging would leave fewer than eight ticks to the deadline."""
    factor = 1
    while True:
        cells, ticks = work_of(gap_seconds * factor, job)
        if cells <= MAX_DP_CELLS and ticks <= MAX_REPLAY_TICKS:
            return factor
        factor = max(factor + 1, math.ceil(factor * 1.25))
        if job.deadline_hours / (gap_seconds * factor / 3600) < 8:
            raise ReplayRefused(
                "deadline_hours",
                "too long for this trace to be replayed within the bounds of one request",
            )


def believed_rate(trace: Trace, start_hours: float) -> tuple[float, str]:
    """The interruption rate the policy believes: measured on up to a week of the trace before
    the window, or on the whole trace when less than a day precedes it."""
    if start_hours >= MIN_HISTORY_HOURS:
        since = max(0.0, start_hours - RECENT_HISTORY_HOURS)
        before = window(trace, since, start_hours - since)
        rate = availability_stats(before).interruption_rate_per_hour
        return rate, f"the {start_hours - since:g} h of the trace before the window"
    return availability_stats(trace).interruption_rate_per_hour, "the whole trace"


def replay_what_if(request: WhatIfJob, trace: Trace) -> WhatIfResult:
    """Replay ``request`` over ``trace`` from ``request.start_hours``."""
    try:
        seen = trace.for_job(request.nodes)
    except ValueError as exc:
        raise ReplayRefused("nodes", str(exc)) from None
    if request.start_hours >= seen.hours:
        raise ReplayRefused(
            "start_hours", f"the trace is {seen.hours:g} h long; the window must start in it"
        )
    rate, source = believed_rate(seen, request.start_hours)
    job = request.job
    factor = merge_factor(seen.gap_seconds, job)
    part = coarsen(window(seen, request.start_hours, seen.hours), factor)
    # A gang is interrupted when any of its nodes is: the rate the policy weighs is per gang.
    policy = make_tolerance_policy(
        job,
        request.tolerance,
        rate * request.nodes,
        max_wait_hours=request.max_wait_hours,
        max_interruptions=request.max_interruptions,
    )
    policy_log, greedy_log = ReplayLog(), ReplayLog()
    args = (part.unavailable, part.gap_seconds, job)
    comparison = ReplayComparison(
        policy=replay(*args, policy, part.prices, log=policy_log),
        on_demand=replay(*args, on_demand_policy, part.prices),
        greedy=replay(*args, make_greedy_policy(job), part.prices, log=greedy_log),
        optimal=optimal_outcome(*args, part.prices),
    )
    return WhatIfResult(
        trace=trace,
        window=part,
        request=request,
        comparison=comparison,
        policy_log=policy_log,
        greedy_log=greedy_log,
        believed_rate=rate,
        believed_from=source,
        ticks_merged=factor,
    )

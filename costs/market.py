"""The market model shared by the policies, the estimator and the replay: the deadline rule.

One rule decides, for a job with a deadline, whether the next stretch of time is spent on spot,
on on-demand, or waiting for spot. It is written over numpy arrays so the estimator's Monte Carlo
applies it to a thousand simulated jobs at once, and the scalar policies call the very same code,
so what the estimator predicts is what placement does.

The rule spends the deadline's slack (time to deadline minus remaining work) evenly over the
job's life instead of first-come-first-served ("uniform progress", after the NSDI'24 paper
"Can't Be Late"):

1. Safety net: when, after the next decision step, the slack would no longer cover
   ``safety_restarts`` restarts, run on on-demand. On on-demand the slack stays constant, so
   this is for good.
2. Spot whenever spot is available; the job stays on it until it is preempted. A job on
   on-demand moves back to spot as soon as spot is available again (the slack allows it, or
   rule 1 would hold it) -- unless it is behind its plan and spot has been available for less
   than ``RETURN_AFTER_RESTARTS`` restarts: a round trip to spot and back costs two restarts of
   slack, and a job behind its plan has already spent its slack faster than planned, so it
   waits on on-demand until the spell has lasted long enough to be likely to pay them back.
3. Spot unavailable: a job already on on-demand stays there until spot is back (leaving it to
   wait would pay a restart twice); an idle job behind its plan starts on-demand to catch up; an
   idle job on or ahead of its plan waits for spot.

The plan is uniform progress: with ``planned_rate = total work / total time to deadline`` the job
is behind when ``remaining work > planned_rate * hours to deadline``. With ``planned_rate = 0``
rule 3 never starts on-demand and only the safety net is left: with ``safety_restarts = 1`` that
is the greedy reference (spot until the slack runs out, then on-demand for good).

Why these rules and not others is in docs/decisions/021-deadline-policy.md: on 423 windows of the
shared traces (48 h of work, 52 h deadline, 0.1 h restarts) this rule costs 1.04x the omniscient
optimum against 1.22x for greedy; the paper's hysteresis (stay on on-demand until ahead of plan)
and idling from on-demand both measured worse.
"""

from __future__ import annotations

import math

import numpy as np

WAIT = 0
SPOT = 1
ON_DEMAND = 2

MARKET_SPOT = "spot"
MARKET_ON_DEMAND = "on_demand"
MARKETS = (MARKET_SPOT, MARKET_ON_DEMAND)
CODE_OF_MARKET: dict[str | None, int] = {None: WAIT, MARKET_SPOT: SPOT, MARKET_ON_DEMAND: ON_DEMAND}
MARKET_OF_CODE: dict[int, str | None] = {v: k for k, v in CODE_OF_MARKET.items()}

# Slack kept back for restarts before the job commits to on-demand: one to move to on-demand
# after a preemption, one as a margin for a restart that runs long.
SAFETY_RESTARTS = 2.0
# A job on on-demand that is behind its plan returns to spot only after spot has been available
# this many restarts without a break (decision 052: chosen on the tuning half of the traces; at
# V100 prices a spell must last about 0.39 h, 3.9 restarts of 0.1 h, to pay back the two restarts
# of a round trip and the slack they take, and the shared traces' spells that outlive 0.3 h last
# 0.7-5 h more on average).
RETURN_AFTER_RESTARTS = 3.0
# Float slack in hour comparisons, so a threshold reached exactly counts as reached.
EPSILON_HOURS = 1e-9


def _spot_progress(
    market_now: np.ndarray | int,
    restart_left_hours: np.ndarray | float,
    restart_hours: np.ndarray | float,
    step_hours: float,
) -> np.ndarray | float:
    """Work a step on spot would do: a held run finishes its restart, a new run pays a whole one."""
    overhead = np.where(np.asarray(market_now) == SPOT, restart_left_hours, restart_hours)
    return np.maximum(step_hours - overhead, 0.0)


def deadline_action(
    remaining_work_hours: np.ndarray | float,
    hours_to_deadline: np.ndarray | float,
    planned_rate: np.ndarray | float,
    restart_hours: np.ndarray | float,
    market_now: np.ndarray | int,
    spot_available: np.ndarray | bool,
    step_hours: float = 0.0,
    safety_restarts: float = SAFETY_RESTARTS,
    restart_left_hours: np.ndarray | float = 0.0,
    spot_up_hours: np.ndarray | float = np.inf,
) -> np.ndarray:
    """What a deadline job should do next: ``WAIT``, ``SPOT`` or ``ON_DEMAND`` (element-wise).

    ``market_now`` is the market code the job holds (``WAIT`` when idle or just preempted) and
    ``restart_left_hours`` what is left of its current start's overhead. ``step_hours`` is how
    long the decision holds before the next one (a replay tick; 0 in continuous time): the safety
    net asks whether, *after* that step, on-demand could still finish with the kept restarts, so
    a step on spot counts the work it does. ``spot_up_hours`` is how long spot has been available
    without a break (``inf`` when unknown: a job on on-demand is then never held back).
    ``deadline_action_scalar`` is the same rule for one job, without numpy's per-call cost.
    """
    rem = np.asarray(remaining_work_hours, dtype=float)
    left = np.asarray(hours_to_deadline, dtype=float) - step_hours
    rate = np.asarray(planned_rate, dtype=float)
    restart = np.asarray(restart_hours, dtype=float)
    now = np.asarray(market_now)
    spot = np.asarray(spot_available, dtype=bool)
    reserve = safety_restarts * restart - EPSILON_HOURS

    spot_ok = left >= rem - _spot_progress(now, restart_left_hours, restart, step_hours) + reserve
    wait_ok = left >= rem + reserve
    behind_plan = (rate > 0) & (rem > rate * left + EPSILON_HOURS)
    outage = np.where(wait_ok & (now != ON_DEMAND) & ~behind_plan, WAIT, ON_DEMAND)
    held_back = (
        (now == ON_DEMAND)
        & behind_plan
        & ~spot_held_long_enough(np.asarray(spot_up_hours, dtype=float), restart)
    )
    return np.where(spot, np.where(spot_ok & ~held_back, SPOT, ON_DEMAND), outage)


def deadline_action_scalar(
    remaining_work_hours: float,
    hours_to_deadline: float,
    planned_rate: float,
    restart_hours: float,
    market_now: int,
    spot_available: bool,
    step_hours: float = 0.0,
    safety_restarts: float = SAFETY_RESTARTS,
    restart_left_hours: float = 0.0,
    spot_up_hours: float = math.inf,
) -> int:
    """``deadline_action`` for one job (the policies call this once per decision)."""
    left = hours_to_deadline - step_hours
    reserve = safety_restarts * restart_hours - EPSILON_HOURS
    behind_plan = planned_rate > 0 and remaining_work_hours > planned_rate * left + EPSILON_HOURS
    if spot_available:
        overhead = restart_left_hours if market_now == SPOT else restart_hours
        progress = max(step_hours - overhead, 0.0)
        if left < remaining_work_hours - progress + reserve:
            return ON_DEMAND
        if (
            market_now == ON_DEMAND
            and behind_plan
            and not spot_held_long_enough(spot_up_hours, restart_hours)
        ):
            return ON_DEMAND
        return SPOT
    if left < remaining_work_hours + reserve or market_now == ON_DEMAND:
        return ON_DEMAND
    if behind_plan:
        return ON_DEMAND
    return WAIT


def spot_held_long_enough(
    spot_up_hours: np.ndarray | float,
    restart_hours: np.ndarray | float,
) -> np.ndarray | bool:
    """Whether spot has been available long enough (``return_after_hours``) for a job on
    on-demand that is behind its plan to return to it."""
    return spot_up_hours >= return_after_hours(restart_hours) - EPSILON_HOURS


def return_after_hours(restart_hours: np.ndarray | float) -> np.ndarray | float:
    """How long spot must have been available, without a break, before a job on on-demand
    that is behind its plan returns to it: ``RETURN_AFTER_RESTARTS`` restarts (read at call
    time, so the benchmark can replace it)."""
    return RETURN_AFTER_RESTARTS * restart_hours


def safety_net_reached(
    remaining_work_hours: float,
    hours_to_deadline: float,
    restart_hours: float,
    step_hours: float = 0.0,
    safety_restarts: float = SAFETY_RESTARTS,
    spot_progress_hours: float = 0.0,
) -> bool:
    """True when the slack no longer covers the kept restarts: on-demand to the end.

    ``spot_progress_hours`` is the work a step on spot would do (0 when spot is unavailable).
    """
    return (
        hours_to_deadline - step_hours
        < remaining_work_hours
        - spot_progress_hours
        + safety_restarts * restart_hours
        - EPSILON_HOURS
    )


def planned_rate(total_work_hours: float, total_hours_to_deadline: float | None) -> float:
    """The uniform-progress rate of a job: work per hour of its whole window (0 without one)."""
    if total_hours_to_deadline is None or total_hours_to_deadline <= 0:
        return 0.0
    return min(1.0, total_work_hours / total_hours_to_deadline)

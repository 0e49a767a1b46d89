"""Tolerance and deadline policies: spot or on-demand, and why (DESIGN §6).

Pure (stdlib + the pure cost modules, no Django). Placement builds a ``MarketSituation`` for the
job and the candidate pools it found, calls ``decide_market`` and gets a ``MarketDecision``;
nothing else in Baton decides between spot and on-demand::

    from costs.policies import MarketSituation, decide_market

    decision = decide_market(
        MarketSituation(
            tolerance=job.tolerance,                       # aggressive | balanced | conservative
            remaining_work_hours=hours_left,
            spot_available=best_spot_pool is not None,
            spot_price_per_hour=spot_price,                # whole gang, substitute's price if any
            on_demand_price_per_hour=od_price,
            interruption_rate_per_hour=best_spot_rate,     # of the spot pool placement would use
            current_market=job.market or None,             # "spot" | "on_demand" | None
            restart_overhead_hours=measured_migration_hours,
            hours_to_deadline=(job.deadline - now).total_seconds() / 3600 if job.deadline else None,
            total_work_hours=job.expected_hours,           # the plan: work over the whole window
            total_hours_to_deadline=(job.deadline - job.created_at).total_seconds() / 3600,
            interruptions=job_interruptions, max_interruptions=job.max_interruptions,
            waited_for_spot_hours=waited, max_wait_hours=job.max_wait_s / 3600,
            allow_on_demand=job.allow_on_demand_fallback,
        )
    )
    decision.market   # "spot" or "on_demand"
    decision.wait     # True: spot chosen but none free now -> the job waits (state `waiting`)
    decision.reason   # plain words for the `placement_decided` event
    decision.rule     # short tag: safety_net, behind_plan, max_wait, cheaper_on_demand, ...

For conservative jobs placement should offer only pools for which ``spot_pool_allowed`` is True
(the best of them goes into the situation). Call ``decide_market`` again at every placement,
after every interruption, while the job waits for spot, and on a regular tick while it runs on
on-demand (so it moves back to spot when spot returns and the slack allows).

Tolerances:

- aggressive: the cheapest spot; on-demand only when no spot appears within the job's max wait,
  or when the deadline rule requires it (it keeps one restart of slack in reserve).
- balanced: minimum expected cost to finish (``costs.estimator.expected_cost_to_finish``):
  on-demand when it is cheaper in expectation; otherwise spot under the deadline rule, which
  keeps two restarts of slack.
- conservative: only low-interruption spot (at most ``CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR``,
  one interruption per two hours held); on-demand when no such spot exists, when the job has
  reached its limit of interruptions, or when its deadline is at risk (three restarts of slack).

The deadline rule is ``costs.market.deadline_action``: spot while available and the slack covers
the remaining work plus the kept restarts; on-demand when the slack is gone (for good) or, with
spot unavailable, when the job falls behind its uniform-progress plan; back to spot as soon as
spot returns and the slack allows -- for a job behind its plan, once spot has been available for
``costs.market.RETURN_AFTER_RESTARTS`` restarts (``spot_available_hours``; not held back when
unknown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costs.estimator import DEFAULT_MIGRATION_OVERHEAD_HOURS, expected_cost_to_finish
from costs.market import (
    CODE_OF_MARKET,
    MARKET_ON_DEMAND,
    MARKET_SPOT,
    ON_DEMAND,
    SPOT,
    deadline_action_scalar,
    planned_rate,
    return_after_hours,
    safety_net_reached,
)

AGGRESSIVE = "aggressive"
BALANCED = "balanced"
CONSERVATIVE = "conservative"
TOLERANCES = (AGGRESSIVE, BALANCED, CONSERVATIVE)

# "Low-interruption" for conservative jobs: at most one interruption per two hours held. Over
# their whole length the shared V100 traces of us-east-1a (0.28/h), us-east-1d (0.49/h) and the
# us-east-1c preemption trace (0.34/h) qualify; the us-west-2 zones (0.9-1.2/h) never do.
CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR = 0.5
# Restarts' worth of slack each tolerance keeps before its deadline forces on-demand.
SAFETY_RESTARTS = {AGGRESSIVE: 1.0, BALANCED: 2.0, CONSERVATIVE: 3.0}


@dataclass(frozen=True)
class MarketSituation:
    """A job at a decision point and the best candidate spot and on-demand pools.

    Hours are hours; prices are for the whole job per hour. ``total_work_hours`` and
    ``total_hours_to_deadline`` (both from submission) set the uniform-progress plan; without
    them the plan starts now. ``decision_step_hours`` is how long the decision holds before the
    next one (the replay's tick; placement's re-evaluation period), which the safety net reserves;
    ``restart_left_hours`` what remains of the current start's overhead (0 at placement).
    ``spot_available_hours`` is how long spot has been available without a break (None when
    unknown: a job on on-demand behind its plan is then not held back from spot).
    """

    tolerance: str
    remaining_work_hours: float
    spot_available: bool
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    interruption_rate_per_hour: float
    current_market: str | None = None
    restart_overhead_hours: float = DEFAULT_MIGRATION_OVERHEAD_HOURS
    hours_to_deadline: float | None = None
    total_work_hours: float | None = None
    total_hours_to_deadline: float | None = None
    interruptions: int = 0
    max_interruptions: int | None = None
    waited_for_spot_hours: float = 0.0
    max_wait_hours: float | None = None
    allow_on_demand: bool = True
    lost_hours_per_interruption: float = 0.0
    decision_step_hours: float = 0.0
    restart_left_hours: float = 0.0
    spot_available_hours: float | None = None

    def __post_init__(self) -> None:
        if self.tolerance not in TOLERANCES:
            raise ValueError(f"unknown tolerance {self.tolerance!r}; expected one of {TOLERANCES}")
        if self.current_market not in (None, MARKET_SPOT, MARKET_ON_DEMAND):
            raise ValueError(f"unknown market {self.current_market!r}")
        if self.remaining_work_hours < 0 or self.restart_overhead_hours < 0:
            raise ValueError("remaining work and restart overhead must not be negative")


@dataclass(frozen=True)
class MarketDecision:
    """Where the job should run next and why.

    ``wait`` is True when the decision is spot but no spot is free now: the job waits for it.
    ``rule`` names the rule that decided, for tests, metrics and the timeline event's data.
    """

    market: str
    reason: str
    wait: bool = False
    rule: str = ""


def spot_pool_allowed(tolerance: str, interruption_rate_per_hour: float) -> bool:
    """Whether a spot pool with this interruption rate may be offered to the tolerance."""
    if tolerance == CONSERVATIVE:
        return interruption_rate_per_hour <= CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR
    return True


def _h(hours: float) -> str:
    return f"{hours * 60:.0f} min" if abs(hours) < 1 else f"{hours:.1f} h"


def _spot_or_wait(
    s: MarketSituation, reason_spot: str, reason_wait: str, rule: str
) -> MarketDecision:
    if s.spot_available:
        return MarketDecision(MARKET_SPOT, reason_spot, rule=rule)
    return MarketDecision(MARKET_SPOT, reason_wait, wait=True, rule=rule + "_wait")


def _max_wait_over(s: MarketSituation) -> bool:
    return (
        not s.spot_available
        and s.max_wait_hours is not None
        and s.waited_for_spot_hours >= s.max_wait_hours
    )


def _gates(s: MarketSituation) -> MarketDecision | None:
    """Tolerance rules that send the job to on-demand whatever its deadline."""
    if s.tolerance == CONSERVATIVE:
        if not spot_pool_allowed(s.tolerance, s.interruption_rate_per_hour):
            return MarketDecision(
                MARKET_ON_DEMAND,
                f"No low-interruption spot: the best pool is interrupted "
                f"{s.interruption_rate_per_hour:.2f} times per hour, above the conservative "
                f"limit of {CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR:g}.",
                rule="conservative_rate",
            )
        if s.max_interruptions is not None and s.interruptions >= s.max_interruptions:
            return MarketDecision(
                MARKET_ON_DEMAND,
                f"The job has been interrupted {s.interruptions} times, its limit is "
                f"{s.max_interruptions}: it stays on on-demand.",
                rule="interruption_limit",
            )
    if s.tolerance == BALANCED:
        spot, od = expected_cost_to_finish(
            s.remaining_work_hours,
            s.spot_price_per_hour,
            s.on_demand_price_per_hour,
            s.interruption_rate_per_hour,
            s.restart_overhead_hours,
            s.current_market,
            s.lost_hours_per_interruption,
        )
        if od <= spot:
            spot_words = "never finishing" if math.isinf(spot) else f"${spot:,.2f}"
            return MarketDecision(
                MARKET_ON_DEMAND,
                f"On-demand is expected to cost ${od:,.2f} to finish, spot {spot_words} once "
                f"its {s.interruption_rate_per_hour:.2f} interruptions per hour are counted.",
                rule="cheaper_on_demand",
            )
    return None


def _with_deadline(s: MarketSituation) -> MarketDecision:
    assert s.hours_to_deadline is not None
    total = s.total_work_hours if s.total_work_hours is not None else s.remaining_work_hours
    window = s.total_hours_to_deadline if s.total_hours_to_deadline is not None else None
    rate = planned_rate(total, window) if window is not None else 0.0
    safety = SAFETY_RESTARTS[s.tolerance]
    slack = s.hours_to_deadline - s.remaining_work_hours
    code = deadline_action_scalar(
        s.remaining_work_hours,
        s.hours_to_deadline,
        rate,
        s.restart_overhead_hours,
        CODE_OF_MARKET[s.current_market],
        s.spot_available,
        step_hours=s.decision_step_hours,
        safety_restarts=safety,
        restart_left_hours=s.restart_left_hours,
        spot_up_hours=math.inf if s.spot_available_hours is None else s.spot_available_hours,
    )
    if code == ON_DEMAND:
        overhead = (
            s.restart_left_hours if s.current_market == MARKET_SPOT else s.restart_overhead_hours
        )
        progress = max(s.decision_step_hours - overhead, 0.0) if s.spot_available else 0.0
        if safety_net_reached(
            s.remaining_work_hours,
            s.hours_to_deadline,
            s.restart_overhead_hours,
            s.decision_step_hours,
            safety,
            progress,
        ):
            return MarketDecision(
                MARKET_ON_DEMAND,
                f"Deadline at risk: {_h(slack)} of slack no longer covers "
                f"{safety:g} restarts of {_h(s.restart_overhead_hours)}; on-demand to the end.",
                rule="safety_net",
            )
        behind = s.remaining_work_hours - rate * s.hours_to_deadline
        if s.current_market == MARKET_ON_DEMAND and s.spot_available:
            held = s.spot_available_hours or 0.0
            return MarketDecision(
                MARKET_ON_DEMAND,
                f"Spot is back, but only for {_h(held)}, and the job is {_h(behind)} behind its "
                f"plan: it stays on on-demand until spot has held for "
                f"{_h(float(return_after_hours(s.restart_overhead_hours)))}, as a shorter spell "
                "would not pay back the two restarts of going to spot and back.",
                rule="spot_too_recent",
            )
        if s.current_market == MARKET_ON_DEMAND:
            return MarketDecision(
                MARKET_ON_DEMAND,
                "Spot is still unavailable: the job stays on on-demand until it returns.",
                rule="stay_on_demand",
            )
        return MarketDecision(
            MARKET_ON_DEMAND,
            f"Spot is unavailable and the job is {_h(behind)} behind its plan to finish by "
            "the deadline: on-demand to catch up, back to spot when it returns.",
            rule="behind_plan",
        )
    if code == SPOT:
        return MarketDecision(
            MARKET_SPOT,
            f"Spot is available and {_h(slack)} of slack covers the remaining "
            f"{_h(s.remaining_work_hours)} of work plus restarts.",
            rule="spot_with_slack",
        )
    if _max_wait_over(s):
        return MarketDecision(
            MARKET_ON_DEMAND,
            f"No spot appeared within the job's max wait of {_h(s.max_wait_hours or 0.0)}.",
            rule="max_wait",
        )
    ahead = rate * s.hours_to_deadline - s.remaining_work_hours if rate > 0 else slack
    return MarketDecision(
        MARKET_SPOT,
        f"Spot is unavailable; the job is {_h(ahead)} ahead of its plan, so it waits for spot.",
        wait=True,
        rule="wait_for_spot",
    )


def decide_market(situation: MarketSituation) -> MarketDecision:
    """Spot or on-demand for the job in ``situation``, with the reason in plain words."""
    s = situation
    if s.remaining_work_hours <= 0:
        return MarketDecision(
            s.current_market or MARKET_SPOT, "No work left to place.", rule="nothing_left"
        )
    if not s.allow_on_demand:
        return _spot_or_wait(
            s,
            "Spot is available (the job does not allow on-demand).",
            "No spot is free; the job does not allow on-demand, so it waits for spot.",
            "spot_only",
        )
    gate = _gates(s)
    if gate is not None:
        return gate
    if s.hours_to_deadline is not None:
        return _with_deadline(s)
    if s.spot_available:
        return MarketDecision(MARKET_SPOT, "Spot is available and cheaper.", rule="spot")
    if _max_wait_over(s):
        return MarketDecision(
            MARKET_ON_DEMAND,
            f"No spot appeared within the job's max wait of {_h(s.max_wait_hours or 0.0)}.",
            rule="max_wait",
        )
    if s.current_market == MARKET_ON_DEMAND:
        return MarketDecision(
            MARKET_ON_DEMAND,
            "Spot is still unavailable: the job stays on on-demand until it returns.",
            rule="stay_on_demand",
        )
    return MarketDecision(
        MARKET_SPOT,
        "No spot is free right now; the job waits for spot.",
        wait=True,
        rule="wait_for_spot",
    )

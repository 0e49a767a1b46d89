"""decide_market: the tolerance rules and the deadline rule, one situation at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costs.market import (
    ON_DEMAND,
    RETURN_AFTER_RESTARTS,
    SPOT,
    WAIT,
    deadline_action,
    deadline_action_scalar,
)
from costs.policies import (
    CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR,
    MarketSituation,
    decide_market,
    spot_pool_allowed,
)


def _situation(**overrides: object) -> MarketSituation:
    fields: dict[str, object] = {
        "tolerance": "balanced",
        "remaining_work_hours": 10.0,
        "spot_available": True,
        "spot_price_per_hour": 0.918,
        "on_demand_price_per_hour": 3.06,
        "interruption_rate_per_hour": 0.3,
        "restart_overhead_hours": 0.1,
    }
    fields.update(overrides)
    return MarketSituation(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("tolerance", ["aggressive", "balanced", "conservative"])
def test_every_tolerance_takes_cheap_calm_spot(tolerance: str) -> None:
    decision = decide_market(_situation(tolerance=tolerance))
    assert (decision.market, decision.wait) == ("spot", False)
    assert decision.reason


def test_aggressive_waits_for_spot_until_the_max_wait() -> None:
    waiting = _situation(
        tolerance="aggressive", spot_available=False, waited_for_spot_hours=0.2, max_wait_hours=0.5
    )
    assert decide_market(waiting).wait
    over = _situation(
        tolerance="aggressive", spot_available=False, waited_for_spot_hours=0.5, max_wait_hours=0.5
    )
    decision = decide_market(over)
    assert (decision.market, decision.rule) == ("on_demand", "max_wait")
    assert "max wait" in decision.reason


def test_aggressive_without_a_max_wait_waits_for_spot_for_ever() -> None:
    decision = decide_market(
        _situation(tolerance="aggressive", spot_available=False, waited_for_spot_hours=1000)
    )
    assert (decision.market, decision.wait) == ("spot", True)


def test_a_job_on_on_demand_moves_back_to_spot_when_it_returns() -> None:
    decision = decide_market(_situation(tolerance="aggressive", current_market="on_demand"))
    assert decision.market == "spot"


def test_balanced_takes_on_demand_when_it_is_cheaper_in_expectation() -> None:
    # Spot at 2.9 USD/h interrupted twice an hour with 0.5 h restarts costs
    # 2.9 x e^(2 x 0.5) = 7.9 USD per hour of work: more than on-demand's 3.06.
    decision = decide_market(
        _situation(
            spot_price_per_hour=2.9, interruption_rate_per_hour=2.0, restart_overhead_hours=0.5
        )
    )
    assert (decision.market, decision.rule) == ("on_demand", "cheaper_on_demand")
    assert "$" in decision.reason


def test_aggressive_ignores_expected_cost_and_takes_spot() -> None:
    decision = decide_market(
        _situation(
            tolerance="aggressive",
            spot_price_per_hour=2.9,
            interruption_rate_per_hour=2.0,
            restart_overhead_hours=0.5,
        )
    )
    assert decision.market == "spot"


def test_conservative_refuses_spot_that_is_interrupted_often() -> None:
    rate = CONSERVATIVE_MAX_INTERRUPTIONS_PER_HOUR + 0.01
    decision = decide_market(_situation(tolerance="conservative", interruption_rate_per_hour=rate))
    assert (decision.market, decision.rule) == ("on_demand", "conservative_rate")
    assert not spot_pool_allowed("conservative", rate)
    assert spot_pool_allowed("balanced", rate)


def test_conservative_leaves_spot_at_the_interruption_limit() -> None:
    below = _situation(tolerance="conservative", interruptions=2, max_interruptions=3)
    assert decide_market(below).market == "spot"
    at = _situation(tolerance="conservative", interruptions=3, max_interruptions=3)
    decision = decide_market(at)
    assert (decision.market, decision.rule) == ("on_demand", "interruption_limit")


def test_the_deadline_keeps_spot_while_the_slack_covers_work_and_restarts() -> None:
    # 10 h of work, 10.5 h left, 0.1 h restarts: balanced keeps 2 restarts, so 0.5 h is enough.
    decision = decide_market(_situation(hours_to_deadline=10.5))
    assert (decision.market, decision.rule) == ("spot", "spot_with_slack")


def test_the_deadline_at_risk_moves_the_job_to_on_demand() -> None:
    decision = decide_market(_situation(hours_to_deadline=10.15))
    assert (decision.market, decision.rule) == ("on_demand", "safety_net")
    assert "Deadline at risk" in decision.reason


def test_conservative_keeps_more_slack_than_aggressive() -> None:
    # 0.25 h of slack: enough for aggressive (one 0.1 h restart) and balanced (two), not for
    # conservative (three).
    for tolerance, market in [
        ("aggressive", "spot"),
        ("balanced", "spot"),
        ("conservative", "on_demand"),
    ]:
        situation = _situation(tolerance=tolerance, hours_to_deadline=10.25)
        assert decide_market(situation).market == market


def test_an_idle_job_behind_its_plan_starts_on_demand_when_spot_is_away() -> None:
    # Plan: 20 h of work in 25 h (0.8 per hour). With 15 h left it should have at most 12 h
    # of work left; it has 13 h: behind.
    decision = decide_market(
        _situation(
            spot_available=False,
            remaining_work_hours=13,
            hours_to_deadline=15,
            total_work_hours=20,
            total_hours_to_deadline=25,
        )
    )
    assert (decision.market, decision.rule) == ("on_demand", "behind_plan")


def test_an_idle_job_ahead_of_its_plan_waits_for_spot() -> None:
    decision = decide_market(
        _situation(
            spot_available=False,
            remaining_work_hours=11,
            hours_to_deadline=15,
            total_work_hours=20,
            total_hours_to_deadline=25,
        )
    )
    assert (decision.market, decision.wait, decision.rule) == ("spot", True, "wait_for_spot")


def test_a_job_on_on_demand_stays_there_while_spot_is_away() -> None:
    decision = decide_market(
        _situation(
            spot_available=False,
            current_market="on_demand",
            remaining_work_hours=5,
            hours_to_deadline=15,
            total_work_hours=20,
            total_hours_to_deadline=25,
        )
    )
    assert (decision.market, decision.rule) == ("on_demand", "stay_on_demand")


def _on_demand_with_spot_back(**overrides: object) -> MarketSituation:
    # 20 h of work in 25 h: the plan is 0.8 h of work an hour. 15 h before the deadline the
    # plan has 12 h of work left; the job has 13 h left, so it is 1 h behind its plan.
    fields: dict[str, object] = {
        "current_market": "on_demand",
        "remaining_work_hours": 13,
        "hours_to_deadline": 15,
        "total_work_hours": 20,
        "total_hours_to_deadline": 25,
    }
    fields.update(overrides)
    return _situation(**fields)


def test_a_job_behind_its_plan_stays_on_on_demand_while_spot_is_only_just_back() -> None:
    gate = RETURN_AFTER_RESTARTS * 0.1
    decision = decide_market(_on_demand_with_spot_back(spot_available_hours=gate / 2))
    assert (decision.market, decision.rule) == ("on_demand", "spot_too_recent")
    assert "behind its plan" in decision.reason
    decision = decide_market(_on_demand_with_spot_back(spot_available_hours=gate))
    assert (decision.market, decision.rule) == ("spot", "spot_with_slack")


def test_a_job_on_or_ahead_of_its_plan_returns_to_spot_at_once() -> None:
    decision = decide_market(
        _on_demand_with_spot_back(remaining_work_hours=11, spot_available_hours=0.0)
    )
    assert (decision.market, decision.rule) == ("spot", "spot_with_slack")


def test_when_nobody_knows_how_long_spot_has_been_back_the_job_returns_at_once() -> None:
    decision = decide_market(_on_demand_with_spot_back(spot_available_hours=None))
    assert (decision.market, decision.rule) == ("spot", "spot_with_slack")


def test_the_wait_for_a_lasting_spell_scales_with_the_restart() -> None:
    # Two restarts of 0.5 h pass for a 0.1 h restart's gate but not for a 0.5 h one.
    assert deadline_action_scalar(13, 15, 0.8, 0.1, ON_DEMAND, True, spot_up_hours=1.0) == SPOT
    assert deadline_action_scalar(13, 15, 0.8, 0.5, ON_DEMAND, True, spot_up_hours=1.0) == ON_DEMAND


def test_a_job_that_forbids_on_demand_waits_even_near_its_deadline() -> None:
    decision = decide_market(
        _situation(spot_available=False, hours_to_deadline=10.01, allow_on_demand=False)
    )
    assert (decision.market, decision.wait) == ("spot", True)


def test_an_unknown_tolerance_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tolerance"):
        _situation(tolerance="reckless")


@settings(max_examples=200, deadline=None)
@given(
    rem=st.floats(0, 50),
    left=st.floats(0, 60),
    rate=st.floats(0, 1),
    restart=st.floats(0, 1),
    now=st.sampled_from([WAIT, SPOT, ON_DEMAND]),
    spot=st.booleans(),
    step=st.sampled_from([0.0, 0.01, 0.5]),
    restart_left=st.floats(0, 1),
    safety=st.sampled_from([1.0, 2.0, 3.0]),
    spot_up=st.one_of(st.floats(0, 5), st.just(math.inf)),
)
def test_the_vectorised_deadline_rule_agrees_with_the_scalar_one(
    rem: float,
    left: float,
    rate: float,
    restart: float,
    now: int,
    spot: bool,
    step: float,
    restart_left: float,
    safety: float,
    spot_up: float,
) -> None:
    scalar = deadline_action_scalar(
        rem, left, rate, restart, now, spot, step, safety, restart_left, spot_up
    )
    vector = deadline_action(
        np.array([rem]),
        np.array([left]),
        rate,
        restart,
        np.array([now]),
        np.array([spot]),
        step,
        safety,
        np.array([restart_left]),
        np.array([spot_up]),
    )
    assert int(vector[0]) == scalar


def test_without_a_plan_the_rule_waits_until_the_slack_runs_out() -> None:
    # Greedy: no plan (rate 0), one restart kept. 5 h left, 3 h of work, 1 h restart.
    assert deadline_action_scalar(3, 5, 0.0, 1, WAIT, False, safety_restarts=1) == WAIT
    assert deadline_action_scalar(3, 3.9, 0.0, 1, WAIT, False, safety_restarts=1) == ON_DEMAND
    # On on-demand with the slack gone, spot coming back changes nothing.
    assert deadline_action_scalar(3, 3.9, 0.0, 1, ON_DEMAND, True, safety_restarts=1) == ON_DEMAND

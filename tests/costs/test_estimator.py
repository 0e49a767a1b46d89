"""The cost-benefit estimator: properties of the model and the API shape."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costs.estimator import (
    EstimateInput,
    EstimateRefused,
    checkpoint_interval_seconds,
    estimate,
    expected_cost_to_finish,
    expected_spot_cost_at_interval,
    interval_grid_seconds,
    spot_cost_curve,
    young_daly_interval_seconds,
)
from costs.market import return_after_hours


def finite(value: float | None) -> float:
    """A figure the estimator gives as None when the job would never finish on spot."""
    assert value is not None, "expected a finite figure"
    return value


def _input(**overrides: object) -> EstimateInput:
    fields: dict[str, object] = {
        "work_hours": 10.0,
        "spot_price_per_hour": 0.918,
        "on_demand_price_per_hour": 3.06,
        "interruption_rate_per_hour": 0.5,
        "checkpoint_gb": 5.0,
        "migration_overhead_hours": 0.1,
        "samples": 400,
    }
    fields.update(overrides)
    return EstimateInput(**fields)  # type: ignore[arg-type]


@settings(max_examples=15, deadline=None)
@given(
    rate=st.floats(0.0, 1.5),
    step=st.floats(0.15, 1.0),
    outage=st.sampled_from([0.0, 0.5, 2.0]),
    deadline=st.sampled_from([None, 14.0]),
)
def test_expected_spot_cost_grows_with_the_interruption_rate(
    rate: float, step: float, outage: float, deadline: float | None
) -> None:
    calm = estimate(
        _input(interruption_rate_per_hour=rate, mean_outage_hours=outage, deadline_hours=deadline)
    )
    busy = estimate(
        _input(
            interruption_rate_per_hour=rate + step,
            mean_outage_hours=outage,
            deadline_hours=deadline,
        )
    )
    assert finite(busy.spot.expected_cost) > finite(calm.spot.expected_cost)


@pytest.mark.parametrize("outage", [0.5, 2.0])
def test_a_rate_too_small_to_end_a_spell_costs_what_no_interruptions_cost(outage: float) -> None:
    # A rate below one interruption in ENDLESS_HOURS gives spells that never end; the jobs
    # must then start on spot, not all in an outage (the deadline rule sent them to on-demand).
    def spot(rate: float) -> Any:
        return estimate(
            _input(interruption_rate_per_hour=rate, mean_outage_hours=outage, deadline_hours=14.0)
        ).spot

    tiny, none = spot(1e-9), spot(0.0)
    assert tiny.expected_on_demand_hours == none.expected_on_demand_hours == 0.0
    assert finite(tiny.expected_cost) == pytest.approx(finite(none.expected_cost))
    assert finite(tiny.expected_cost) < finite(spot(0.01).expected_cost)


@settings(max_examples=15, deadline=None)
@given(rate=st.floats(0.0, 3.0), work=st.floats(0.5, 100), checkpoint=st.floats(0, 200))
def test_on_demand_cost_does_not_depend_on_the_interruption_rate(
    rate: float, work: float, checkpoint: float
) -> None:
    base = estimate(_input(work_hours=work, checkpoint_gb=checkpoint, samples=50))
    other = estimate(
        _input(
            work_hours=work, checkpoint_gb=checkpoint, interruption_rate_per_hour=rate, samples=50
        )
    )
    assert other.on_demand == base.on_demand


@settings(max_examples=15, deadline=None)
@given(
    work=st.floats(0.1, 200),
    price=st.floats(0.05, 10),
    deadline_slack=st.sampled_from([None, 0.0, 5.0]),
)
def test_with_no_interruptions_spot_cost_is_spot_price_times_work(
    work: float, price: float, deadline_slack: float | None
) -> None:
    deadline = None if deadline_slack is None else work + 1 + deadline_slack
    result = estimate(
        _input(
            work_hours=work,
            spot_price_per_hour=price,
            interruption_rate_per_hour=0.0,
            checkpoint_gb=0.0,
            migration_overhead_hours=0.0,
            deadline_hours=deadline,
            spot_available_now=True,
            samples=50,
        )
    )
    assert result.spot.expected_cost == pytest.approx(price * work)
    assert result.spot.expected_interruptions == 0
    assert result.spot.p90_hours == pytest.approx(work)


def test_each_start_adds_the_restart_to_the_bill() -> None:
    result = estimate(
        _input(interruption_rate_per_hour=0.0, checkpoint_gb=0.0, spot_available_now=True)
    )
    assert result.spot.expected_cost == pytest.approx(0.918 * 10.1)
    assert result.on_demand.expected_cost == pytest.approx(3.06 * 10.1)
    assert result.on_demand.expected_hours == pytest.approx(10.1)


@pytest.mark.parametrize("rate, restart", [(0.8, 0.1), (2.0, 0.5), (5.0, 0.5)])
def test_the_monte_carlo_agrees_with_the_closed_form_without_a_deadline(
    rate: float, restart: float
) -> None:
    inp = _input(
        work_hours=8,
        interruption_rate_per_hour=rate,
        migration_overhead_hours=restart,
        checkpoint_gb=0.0,
        samples=2000,
    )
    spot, on_demand = expected_cost_to_finish(8, 0.918, 3.06, rate, restart)
    result = estimate(inp)
    assert result.spot.expected_cost == pytest.approx(spot, rel=0.03)
    assert result.on_demand.expected_cost == pytest.approx(on_demand)


def test_the_estimate_serialises_to_the_api_shape() -> None:
    payload: dict[str, Any] = estimate(_input(deadline_hours=14)).to_dict()
    json.dumps(payload)
    assert set(payload) >= {
        "spot",
        "on_demand",
        "recommendation",
        "checkpoint_interval_s",
        "reasons",
    }
    for side in ("spot", "on_demand"):
        assert set(payload[side]) >= {
            "expected_cost",
            "expected_hours",
            "p90_hours",
            "expected_interruptions",
            "expected_lost_hours",
        }
    assert payload["recommendation"] in ("spot", "on_demand")
    assert payload["reasons"] and all(isinstance(r, str) and r for r in payload["reasons"])


def test_the_same_seed_gives_the_same_estimate_and_another_seed_a_close_one() -> None:
    inp = _input(mean_outage_hours=1.0, uptime_cv=2.0, outage_cv=2.0, deadline_hours=14)
    assert estimate(inp) == estimate(inp)
    other = estimate(EstimateInput(**{**inp.__dict__, "seed": 7}))
    assert other.spot.expected_cost == pytest.approx(estimate(inp).spot.expected_cost, rel=0.05)


def test_p90_time_is_at_least_the_expected_time_when_spot_waits_for_capacity() -> None:
    result = estimate(_input(mean_outage_hours=2.0))
    assert finite(result.spot.p90_hours) >= finite(result.spot.expected_hours) > 10.0


def test_young_daly_interval_for_a_one_minute_save_and_an_hour_between_interruptions() -> None:
    # sqrt(2 x 60 x 3600) x (1 + sqrt(60 / 7200) / 3 + 60 / 64800) - 60
    expected = math.sqrt(2 * 60 * 3600) * (1 + math.sqrt(60 / 7200) / 3 + 60 / 64800) - 60
    assert young_daly_interval_seconds(60, 3600) == pytest.approx(expected)
    assert young_daly_interval_seconds(0, 3600) == 60.0
    assert young_daly_interval_seconds(60, math.inf) == 6 * 3600.0


def test_a_checkpoint_too_big_for_the_notice_loses_work_on_every_interruption() -> None:
    sure = estimate(_input(checkpoint_gb=5.0, emergency_miss_share=0.0))
    small = estimate(_input(checkpoint_gb=5.0))
    big = estimate(_input(checkpoint_gb=500.0))
    assert sure.spot.expected_lost_hours == 0
    assert 0 < small.spot.expected_lost_hours < big.spot.expected_lost_hours
    assert any("more than the 120 s notice" in reason for reason in big.reasons)


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the emergency checkpoint fits; a few miss
        {"checkpoint_gb": 500.0},  # it never fits: every interruption loses work
        {"interruption_rate_per_hour": 2.0, "checkpoint_gb": 50.0},
        {"interruption_rate_per_hour": 0.0},
    ],
)
def test_the_recommended_interval_is_the_lowest_point_of_the_cost_curve(
    overrides: dict[str, float],
) -> None:
    inp = _input(**overrides)
    grid = interval_grid_seconds()
    curve = spot_cost_curve(inp, grid)
    best = checkpoint_interval_seconds(inp)
    assert best in grid
    assert spot_cost_curve(inp, np.array([best]))[0] == pytest.approx(curve.min())
    # Checkpointing every minute, or every six hours, is never cheaper in the model.
    assert curve[0] >= curve.min() and curve[-1] >= curve.min()


def test_without_interruptions_the_interval_is_as_long_as_allowed() -> None:
    assert checkpoint_interval_seconds(_input(interruption_rate_per_hour=0.0)) == 6 * 3600


def test_when_every_interruption_loses_work_the_curve_agrees_with_young_daly() -> None:
    inp = _input(checkpoint_gb=500.0, interruption_rate_per_hour=1.0, migration_overhead_hours=0)
    daly = young_daly_interval_seconds(inp.save_seconds, 3600.0)
    assert checkpoint_interval_seconds(inp) == pytest.approx(daly, rel=0.12)


def test_the_monte_carlo_cost_is_lowest_near_the_recommended_interval() -> None:
    inp = _input(checkpoint_gb=200.0, interruption_rate_per_hour=1.0, samples=2000)
    best = checkpoint_interval_seconds(inp)
    at_best = expected_spot_cost_at_interval(inp, best)
    assert at_best <= expected_spot_cost_at_interval(inp, best / 4)
    assert at_best <= expected_spot_cost_at_interval(inp, best * 4)


def test_the_estimate_says_where_its_rate_comes_from() -> None:
    borrowed = estimate(
        _input(
            interruption_rate_source="borrowed",
            interruption_rate_borrowed_from=("V100-16GB in us-east-1",),
        )
    )
    assert borrowed.to_dict()["interruption_rate_source"] == "borrowed"
    assert borrowed.to_dict()["interruption_rate_borrowed_from"] == ["V100-16GB in us-east-1"]
    assert "borrowed from V100-16GB in us-east-1" in borrowed.reasons[0]
    default = estimate(_input(interruption_rate_source="default"))
    assert "a guess, not a measurement" in default.reasons[0]
    measured = estimate(_input(interruption_rate_source="history", history_hours=168.0))
    assert "measured over 168 h" in measured.reasons[0]


@pytest.mark.parametrize(
    "field, value",
    [
        ("work_hours", 1e308),
        ("work_hours", math.inf),
        ("checkpoint_gb", 1e308),
        ("checkpoint_gb", math.nan),
        ("deadline_hours", math.inf),
        ("deadline_hours", math.nan),
        ("max_wait_hours", math.nan),
        ("samples", 10**9),
    ],
)
def test_it_refuses_what_would_not_end_or_not_be_finite(field: str, value: float) -> None:
    with pytest.raises(EstimateRefused) as refused:
        _input(**{field: value})
    assert refused.value.field == field


def test_it_refuses_a_job_whose_simulation_would_run_long() -> None:
    with pytest.raises(EstimateRefused, match="interruptions to simulate") as refused:
        _input(work_hours=5000.0, interruption_rate_per_hour=3.0)
    assert refused.value.field == "work_hours"


def test_the_biggest_job_it_takes_is_estimated_quickly() -> None:
    import time

    # Just under the bound of simulated interruptions, with a deadline and long outages.
    inp = _input(
        work_hours=2400.0,
        interruption_rate_per_hour=1.0,
        deadline_hours=3000.0,
        mean_outage_hours=2.0,
        uptime_cv=2.0,
        outage_cv=2.0,
        samples=1000,
    )
    began = time.perf_counter()
    result = estimate(inp)
    assert time.perf_counter() - began < 2.0
    assert math.isfinite(json.loads(json.dumps(result.to_dict()))["on_demand"]["expected_cost"])


def test_a_deadline_on_spot_is_met_by_moving_to_on_demand_in_time() -> None:
    result = estimate(
        _input(
            work_hours=20,
            deadline_hours=22,
            interruption_rate_per_hour=1.0,
            mean_outage_hours=3.0,
            outage_cv=2.0,
            # The deadline rule keeps slack for restarts, not for work lost by a missed
            # emergency checkpoint: with none missed it always makes it.
            emergency_miss_share=0.0,
        )
    )
    assert result.spot.deadline_met_probability == 1.0
    assert finite(result.spot.p90_hours) <= 22
    assert result.spot.expected_on_demand_hours > 0


def test_the_monte_carlo_holds_a_job_behind_its_plan_on_on_demand_until_spot_lasts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 h of work in 22 h, 0.2 h restarts; spot is away now, comes back within about 1.5 h
    # and then stays. The job starts on-demand at once (behind its plan) and is still behind
    # when spot returns, so under the rule placement applies it stays on on-demand until spot
    # has held for the gate (0.6 h) -- the simulated on-demand time shows exactly that wait.
    inp = _input(
        work_hours=20,
        deadline_hours=22,
        migration_overhead_hours=0.2,
        interruption_rate_per_hour=0.001,
        mean_outage_hours=1.5,
        outage_cv=0.1,
        spot_available_now=False,
        checkpoint_gb=0.0,
        emergency_miss_share=0.0,
    )
    held = estimate(inp).spot
    monkeypatch.setattr("costs.market.RETURN_AFTER_RESTARTS", 0.0)
    at_once = estimate(inp).spot
    assert held.deadline_met_probability == at_once.deadline_met_probability == 1.0
    monkeypatch.undo()
    gate = float(return_after_hours(0.2))
    assert held.expected_on_demand_hours - at_once.expected_on_demand_hours == pytest.approx(
        gate, abs=0.05
    )


def test_it_recommends_on_demand_when_spot_would_never_finish() -> None:
    # exp(10 x 0.5) = 148 held hours per hour of work: hopeless.
    result = estimate(_input(interruption_rate_per_hour=10.0, migration_overhead_hours=0.5))
    assert result.spot.expected_cost is None
    assert result.spot.p90_hours is None
    assert result.recommendation == "on_demand"


def test_it_recommends_on_demand_when_it_is_cheaper() -> None:
    result = estimate(_input(spot_price_per_hour=3.0, interruption_rate_per_hour=1.0))
    assert result.recommendation == "on_demand"


def test_it_recommends_spot_when_it_saves_money() -> None:
    result = estimate(_input())
    assert result.recommendation == "spot"
    assert any("less" in reason for reason in result.reasons)


def test_without_a_deadline_the_max_wait_buys_on_demand_time() -> None:
    result = estimate(_input(mean_outage_hours=5.0, max_wait_hours=0.5, spot_available_now=False))
    assert result.spot.expected_on_demand_hours > 0


@pytest.mark.parametrize(
    "field, value",
    [("work_hours", -1.0), ("interruption_rate_per_hour", math.nan), ("deadline_hours", 0.0)],
)
def test_it_refuses_nonsense_input(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        _input(**{field: value})

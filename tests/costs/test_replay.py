"""Replays of small hand-made traces, and the optimum against brute force and the references."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costs.market import RETURN_AFTER_RESTARTS
from costs.replay import (
    Grid,
    ReplayJob,
    ReplayLog,
    brute_force_optimal,
    compare,
    make_greedy_policy,
    make_tolerance_policy,
    on_demand_policy,
    optimal_outcome,
    replay,
    spot_only_policy,
)

HOUR = 3600.0


def _trace(values: str) -> np.ndarray:
    """'0' = spot available in that tick, '1' = unavailable."""
    return np.array([c == "1" for c in values])


def test_a_restart_is_charged_at_the_first_start_and_after_each_preemption() -> None:
    # Hourly ticks, 1 h restarts, 2 h of work, spot 1 USD/h: tick 0 restart, tick 1 work,
    # tick 2 preempted (free), tick 3 restart, tick 4 work -> finished at 5 h for 4 USD.
    job = ReplayJob(task_hours=2, deadline_hours=10, restart_overhead_hours=1, spot_price=1)
    outcome = replay(_trace("00100000"), HOUR, job, spot_only_policy)
    assert outcome.cost == pytest.approx(4.0)
    assert outcome.finish_hours == pytest.approx(5.0)
    assert outcome.preemptions == 1
    assert outcome.restarts == 2
    assert outcome.deadline_met


def test_a_job_pays_only_the_used_part_of_its_last_tick() -> None:
    # 1.5 h of work and a 0.5 h restart on on-demand at 3 USD/h: 2 h, 6 USD, done at 2.0 h.
    job = ReplayJob(task_hours=1.5, deadline_hours=3, restart_overhead_hours=0.5, on_demand_price=3)
    outcome = replay(_trace("000"), HOUR, job, on_demand_policy)
    assert outcome.cost == pytest.approx(6.0)
    assert outcome.finish_hours == pytest.approx(2.0)


def test_the_unit_makes_a_fractional_overhead_exact() -> None:
    # 0.1 h on 195 s ticks is 24/13 of a tick: 13 units of 15 s per tick.
    grid = Grid.of(195, ReplayJob(task_hours=48, deadline_hours=52, restart_overhead_hours=0.1))
    assert (grid.units_per_tick, grid.overhead_units, grid.work_units) == (13, 24, 11520)


def test_hand_worked_trace_where_greedy_waits_too_long() -> None:
    # Hourly ticks 0 0 1 1 0 0 0 0; 4 h of work, 8 h deadline, 1 h restarts; spot 1, od 3 USD/h.
    # On-demand: restart + 4 h = 5 ticks x 3 = 15 USD, done at 5 h.
    # Greedy: spot restart (t0) and 1 h of work (t1); preempted t2, waits t2 and t3 (slack
    #   6-1 >= 3+1, then 5-1 >= 3+1); at t4 4-1 < 3+1: on-demand for good, restart + 3 h ->
    #   done at 8 h, 2 + 4 x 3 = 14 USD.
    # Optimum: spot t0-t1, waits out t2-t3, spot again t4 (restart) t5-t7: 6 USD, done at 8 h.
    # Balanced (plan 0.5 h of work per hour, two restarts of slack): spot t0-t1; preempted at
    #   t2 with 3 h left and 3 > 0.5 x (6 - 1): behind plan, on-demand (restart t2, work t3);
    #   at t4 the slack 4 - 1 < 2 + 2 restarts: stays on-demand, done at 6 h: 2 + 4 x 3 = 14.
    trace = _trace("00110000")
    job = ReplayJob(task_hours=4, deadline_hours=8, restart_overhead_hours=1, spot_price=1)
    job = ReplayJob(**{**job.__dict__, "on_demand_price": 3})
    result = compare(trace, HOUR, job, make_tolerance_policy(job, "balanced", 0.1))
    assert (result.on_demand.cost, result.on_demand.finish_hours) == pytest.approx((15, 5))
    assert (result.greedy.cost, result.greedy.finish_hours) == pytest.approx((14, 8))
    assert result.greedy.preemptions == 1
    assert (result.optimal.cost, result.optimal.finish_hours) == pytest.approx((6, 8))
    assert (result.policy.cost, result.policy.finish_hours) == pytest.approx((14, 6))
    assert all(o.deadline_met for o in (result.policy, result.greedy, result.optimal))


def test_hand_worked_trace_where_the_plan_pays_for_on_demand_greedy_avoids() -> None:
    # Hourly ticks 1 1 0 0 0 0; 4 h of work, 6 h deadline, no restart cost; spot 1, od 3.
    # Greedy waits t0 and t1 (5 >= 4, 4 >= 4) and runs spot t2-t5: 4 USD, done at 6 h.
    # Balanced's plan is 4/6 h per hour: at t0 4 > 2/3 x 5, behind -> on-demand t0 and t1
    # (spot still away), spot t2-t3: 2 x 3 + 2 = 8 USD, done at 4 h. The optimum is greedy's.
    trace = _trace("110000")
    job = ReplayJob(
        task_hours=4, deadline_hours=6, restart_overhead_hours=0, spot_price=1, on_demand_price=3
    )
    result = compare(trace, HOUR, job, make_tolerance_policy(job, "balanced", 0.1))
    assert (result.greedy.cost, result.greedy.finish_hours) == pytest.approx((4, 6))
    assert (result.policy.cost, result.policy.finish_hours) == pytest.approx((8, 4))
    assert result.optimal.cost == pytest.approx(4)


def test_hand_worked_fractional_restart_optimum() -> None:
    # Hourly ticks 0 1 0; 1 h of work, 3 h deadline, 0.5 h restarts; spot 1, od 3.
    # Optimum: spot t0 (0.5 restart + 0.5 work), preempted t1, spot t2 (0.5 + 0.5): 2 USD, 3 h.
    # Greedy: the same first tick; at t1 it waits (2 - 1 >= 0.5 + 0.5); at t2 1 - 1 < 1: it
    # starts on-demand although spot is back: 1 + 3 = 4 USD. On-demand: 1.5 h x 3 = 4.5 USD.
    trace = _trace("010")
    job = ReplayJob(
        task_hours=1, deadline_hours=3, restart_overhead_hours=0.5, spot_price=1, on_demand_price=3
    )
    optimum = optimal_outcome(trace, HOUR, job)
    assert (optimum.cost, optimum.finish_hours, optimum.preemptions) == pytest.approx((2, 3, 1))
    assert replay(trace, HOUR, job, make_greedy_policy(job)).cost == pytest.approx(4)
    assert replay(trace, HOUR, job, on_demand_policy).cost == pytest.approx(4.5)


def test_a_job_behind_its_plan_does_not_flap_between_markets_on_short_spells(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three-minute ticks, 0.1 h restarts, 10 h of work in 11.5 h. For the first 3 h spot comes
    # and goes every two ticks: each spell is as short as the restart, so a return to spot only
    # spends slack. Then spot stays. Going back to every spell spends the slack before spot
    # settles, and the safety net keeps the job on on-demand to the end; held back, the job
    # keeps its slack for the spot that lasts.
    gap = 180.0
    trace = _trace("11" + "0011" * 15 + "0" * 400)
    job = ReplayJob(task_hours=10, deadline_hours=11.5, restart_overhead_hours=0.1)
    held = replay(trace, gap, job, make_tolerance_policy(job, "balanced", 0.5))
    monkeypatch.setattr("costs.market.RETURN_AFTER_RESTARTS", 0.0)
    flapping = replay(trace, gap, job, make_tolerance_policy(job, "balanced", 0.5))
    assert held.deadline_met and flapping.deadline_met
    assert held.restarts is not None and flapping.restarts is not None
    assert held.restarts * 2 <= flapping.restarts
    assert held.cost < 0.6 * flapping.cost


def test_a_lasting_spell_brings_a_job_behind_its_plan_back_to_spot() -> None:
    # 20 h of work in 22 h, 0.2 h restarts, three-minute ticks. Spot is away for 1.5 h: the job
    # falls behind its plan at once and starts on-demand (0.25 h behind, caught up only after
    # 2.7 h). Spot then stays: the job returns once spot has held for the gate's ticks.
    gap = 180.0
    trace = _trace("1" * 30 + "0" * 500)
    job = ReplayJob(task_hours=20, deadline_hours=22, restart_overhead_hours=0.2)
    log = ReplayLog()
    outcome = replay(trace, gap, job, make_tolerance_policy(job, "balanced", 0.5), log=log)
    assert outcome.deadline_met
    assert log.states[1:30] == ["on_demand"] * 29
    gate_ticks = round(RETURN_AFTER_RESTARTS * 0.2 * HOUR / gap)
    assert log.states.index("spot") == 30 + gate_ticks


def test_past_the_end_of_the_trace_spot_is_unavailable() -> None:
    job = ReplayJob(task_hours=3, deadline_hours=10, restart_overhead_hours=0)
    outcome = replay(_trace("00"), HOUR, job, spot_only_policy)
    assert outcome.finish_hours is None
    assert not outcome.deadline_met


def test_the_optimum_falls_back_to_on_demand_when_no_plan_meets_the_deadline() -> None:
    job = ReplayJob(task_hours=3, deadline_hours=2, restart_overhead_hours=0.5)
    outcome = optimal_outcome(_trace("0000"), HOUR, job)
    assert not outcome.deadline_met
    assert outcome.finish_hours == pytest.approx(3.5)


def test_the_replay_json_has_the_four_fields_for_every_plan() -> None:
    job = ReplayJob(task_hours=2, deadline_hours=4, restart_overhead_hours=0.5)
    result = compare(_trace("0100"), HOUR, job, make_tolerance_policy(job, "aggressive", 0.2))
    payload: dict[str, Any] = result.to_dict()
    assert set(payload) == {"policy", "on_demand", "greedy", "optimal"}
    for plan in payload.values():
        assert {"cost", "finish_hours", "deadline_met", "preemptions"} <= set(plan)


def test_an_unknown_policy_is_refused() -> None:
    job = ReplayJob(task_hours=2, deadline_hours=4, restart_overhead_hours=0.5)
    with pytest.raises(ValueError, match="unknown policy"):
        make_tolerance_policy(job, "reckless", 0.2)


small_jobs = st.builds(
    ReplayJob,
    task_hours=st.sampled_from([0.5, 1, 1.5, 2, 3, 4]),
    deadline_hours=st.sampled_from([1, 2, 3, 4, 5, 6]),
    restart_overhead_hours=st.sampled_from([0, 0.25, 0.5, 1, 1.5]),
    spot_price=st.sampled_from([0.5, 1.0]),
    on_demand_price=st.sampled_from([2.0, 3.0]),
)
small_traces = st.lists(st.booleans(), min_size=1, max_size=6).map(np.array)


@settings(max_examples=40, deadline=None)
@given(trace=small_traces, job=small_jobs)
def test_the_optimum_matches_brute_force_on_small_traces(trace: np.ndarray, job: ReplayJob) -> None:
    dp = optimal_outcome(trace, HOUR, job)
    brute = brute_force_optimal(trace, HOUR, job)
    if brute is None:
        assert not dp.deadline_met
    else:
        assert dp.deadline_met
        assert dp.cost == pytest.approx(brute.cost)
        assert dp.finish_hours == pytest.approx(brute.finish_hours)


traces = st.lists(st.booleans(), min_size=4, max_size=60).map(np.array)
jobs = st.builds(
    ReplayJob,
    task_hours=st.floats(0.5, 30).map(lambda h: round(h, 2)),
    deadline_hours=st.floats(1, 60).map(lambda h: round(h, 2)),
    restart_overhead_hours=st.sampled_from([0, 0.1, 0.25, 0.5, 1.0]),
    spot_price=st.floats(0.1, 2),
    on_demand_price=st.floats(2, 5),
)


@settings(max_examples=60, deadline=None)
@given(trace=traces, job=jobs, gap=st.sampled_from([1800.0, 3600.0]))
def test_the_optimum_is_never_above_greedy_or_on_demand(
    trace: np.ndarray, job: ReplayJob, gap: float
) -> None:
    optimum = optimal_outcome(trace, gap, job)
    for reference in (make_greedy_policy(job), on_demand_policy):
        outcome = replay(trace, gap, job, reference)
        if outcome.deadline_met:
            assert optimum.deadline_met
            assert optimum.cost <= outcome.cost + 1e-9


@settings(max_examples=60, deadline=None)
@given(
    trace=traces,
    job=jobs,
    tolerance=st.sampled_from(["aggressive", "balanced", "conservative"]),
    rate=st.floats(0, 2),
    gap=st.sampled_from([900.0, 3600.0]),
)
def test_a_policy_with_a_deadline_meets_it_whenever_on_demand_alone_could(
    trace: np.ndarray, job: ReplayJob, tolerance: str, rate: float, gap: float
) -> None:
    if not replay(trace, gap, job, on_demand_policy).deadline_met:
        return
    outcome = replay(trace, gap, job, make_tolerance_policy(job, tolerance, rate))
    assert outcome.deadline_met
    greedy = replay(trace, gap, job, make_greedy_policy(job))
    assert greedy.deadline_met

"""The market simulator: Poisson preemptions at each pool's rate, trace replay at availability
drops, the pool's own windows, nothing preempted twice; and the beat tick that drives it, off
unless a time scale is set."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from costs.traces import load_trace, preemption_count
from migration.simulator import (
    MarketTick,
    Preemption,
    ReplayTrace,
    RunningInstance,
    SpotPool,
    market_preemptions,
    replay_trace_from_dict,
    trace_drops,
)

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUR = 3600.0


def tick(hours: float, clock: float = 0.0, scale: float = HOUR) -> MarketTick:
    """A tick of `hours` simulated hours (one wall second per hour at the default scale)."""
    wall = hours * HOUR / scale
    return MarketTick(now=T0, wall_seconds=wall, time_scale=scale, clock_hours=clock)


def trace(*values: int, gap_s: float = HOUR) -> ReplayTrace:
    return ReplayTrace(name="hand", gap_seconds=gap_s, unavailable=values)


def spot(rate: float = 0.0, **kw: Any) -> SpotPool:
    kw.setdefault("id", 1)
    kw.setdefault("advance_notice_s", 5)
    kw.setdefault("final_window_s", 20)
    return SpotPool(interruption_rate_per_hour=rate, **kw)


def instances(*ids: int, pool: int = 1, **kw: Any) -> list[RunningInstance]:
    return [RunningInstance(id=i, pool_id=pool, **kw) for i in ids]


def preempted(found: list[Preemption]) -> list[int]:
    return [p.instance_id for p in found]


# --- Poisson -------------------------------------------------------------------------------


def test_poisson_preemptions_match_the_pools_rate_over_many_ticks() -> None:
    rate, dt, ticks, fleet = 0.9, 0.01, 2000, 100
    rng = random.Random(20260101)
    pool = spot(rate)
    hits = 0
    for n in range(ticks):
        # A preempted instance is replaced at once, so the fleet stays the same size.
        hits += len(market_preemptions([pool], instances(*range(fleet)), tick(dt, n * dt), rng))

    p = 1 - math.exp(-rate * dt)
    expected = fleet * ticks * p
    sigma = math.sqrt(fleet * ticks * p * (1 - p))
    assert abs(hits - expected) < 4 * sigma
    assert hits / (fleet * ticks * dt) == pytest.approx(rate, rel=0.1)


def test_a_pool_with_a_zero_rate_never_preempts() -> None:
    rng = random.Random(1)

    assert market_preemptions([spot(0.0)], instances(*range(50)), tick(10_000), rng) == []


def test_a_time_scale_of_zero_never_preempts() -> None:
    rng = random.Random(1)
    pools = [spot(1e9, id=1), spot(0.0, id=2, trace=trace(0, 1, 0, 1))]
    fleet = instances(1, 2, pool=1) + instances(3, 4, pool=2)
    off = MarketTick(now=T0, wall_seconds=3600.0, time_scale=0.0, clock_hours=0.5)

    assert off.elapsed_hours == 0 and off.end_hours == 0.5
    assert market_preemptions(pools, fleet, off, rng) == []


def test_an_instance_under_notice_is_not_preempted_twice() -> None:
    rng = random.Random(1)
    fleet = [RunningInstance(1, 1, under_notice=True), RunningInstance(2, 1)]

    assert preempted(market_preemptions([spot(1e9)], fleet, tick(1), rng)) == [2]
    # A trace's drop passes the instance under notice by for the next one.
    replay = spot(trace=trace(0, 1))
    assert preempted(market_preemptions([replay], fleet, tick(1), rng)) == [2]


def test_an_instance_is_exposed_only_since_it_started_running() -> None:
    rng = random.Random(1)
    now = T0
    just_started = RunningInstance(1, 1, running_since=now)
    one_second_in = RunningInstance(2, 1, running_since=now - timedelta(seconds=1))
    an_hour_in = RunningInstance(3, 1, running_since=now - timedelta(hours=1))
    fleet = [just_started, one_second_in, an_hour_in]
    # Ten wall seconds at one simulated hour a second; the pool's drop is 5 h before the end.
    replay = spot(trace=trace(0, 0, 0, 0, 0, 1, 1, 1, 1, 1))

    assert preempted(market_preemptions([spot(1e9)], fleet, tick(10), rng)) == [2, 3]
    assert preempted(market_preemptions([replay], fleet, tick(10), rng)) == [3]


def test_a_seeded_generator_repeats_a_run() -> None:
    fleet = instances(*range(100))

    def run(seed: int) -> list[int]:
        return preempted(market_preemptions([spot(0.5)], fleet, tick(1), random.Random(seed)))

    assert run(3) == run(3)
    assert run(3) != run(4)


# --- trace replay --------------------------------------------------------------------------


def test_a_replayed_trace_preempts_exactly_at_availability_drops() -> None:
    # Hourly ticks: up, up, down, down, up, down; the trace then starts again (up).
    replay = trace(0, 0, 1, 1, 0, 1)
    pool = spot(1e9, trace=replay)  # a trace replaces the Poisson rate
    at = []
    for n in range(24):  # twelve hours in half-hour ticks, a fresh instance every time
        found = market_preemptions([pool], instances(n), tick(0.5, n * 0.5), random.Random())
        at += [(n + 1) * 0.5 for _ in found]

    assert at == [2.0, 5.0, 8.0, 11.0]
    assert list(trace_drops(replay, 0, 12)) == [(2.0, 1), (5.0, 1), (8.0, 1), (11.0, 1)]


def test_the_replay_wraps_around_the_end_of_the_trace() -> None:
    # Down in its last tick's successor: the drop is where the trace starts again.
    wrapping = trace(1, 0, 0)

    assert list(trace_drops(wrapping, 0, 2.9)) == []
    assert list(trace_drops(wrapping, 2.9, 3.0)) == [(3.0, 1)]
    assert list(trace_drops(wrapping, 0, 9)) == [(3.0, 1), (6.0, 1), (9.0, 1)]


def test_a_one_node_drop_preempts_one_instance_of_the_pool() -> None:
    pool = spot(trace=trace(0, 1))

    found = market_preemptions([pool], instances(7, 3, 5), tick(1), random.Random())

    assert preempted(found) == [3]
    assert "trace hand: 1 node(s) lost at hour 1.00" in found[0].reason


def test_a_multi_node_trace_preempts_as_many_instances_as_nodes_lost() -> None:
    # Nodes unavailable per tick: 0, 2, 3, 1, 3 -> 2 lost at hour 1, 1 at hour 2, 2 at hour 4.
    pool = spot(trace=trace(0, 2, 3, 1, 3))
    left = instances(9, 1, 7, 3, 5, 11)
    per_hour = []
    for hour in range(5):
        found = preempted(market_preemptions([pool], left, tick(1, hour), random.Random()))
        per_hour.append(found)
        left = [i for i in left if i.id not in found]

    assert per_hour == [[1, 3], [5], [], [7, 9], []]  # 3 -> 0 where it starts again: none
    # One tick over the whole trace: the same instances, lowest id first, none twice.
    everyone = instances(9, 1, 7, 3, 5)
    all_at_once = market_preemptions([pool], everyone, tick(4), random.Random())
    assert preempted(all_at_once) == [1, 3, 5, 7, 9]


def test_a_preemption_carries_the_pools_own_windows_whatever_the_time_scale() -> None:
    pools = [
        spot(1e9, id=1, advance_notice_s=90, final_window_s=30),
        spot(id=2, advance_notice_s=0, final_window_s=120, trace=trace(0, 1)),
    ]
    fleet = instances(1, pool=1) + instances(2, pool=2)
    for scale in (1.0, 3600.0, 86_400.0):
        found = market_preemptions(pools, fleet, tick(1, scale=scale), random.Random())

        assert [(p.instance_id, p.advance_notice_s, p.final_window_s) for p in found] == [
            (1, 90, 30),
            (2, 0, 120),
        ]


def test_instances_of_pools_not_given_are_left_alone() -> None:
    fleet = instances(1, pool=1) + instances(2, pool=99)

    assert preempted(market_preemptions([spot(1e9)], fleet, tick(1), random.Random())) == [1]


def test_a_shared_trace_replays_its_own_preemptions() -> None:
    path = next((ROOT / "data/spot-traces/preemption/1-node").rglob("*.json"))
    shared = load_trace(path)
    replay = replay_trace_from_dict(path.stem, json.loads(path.read_text()))
    # Over one pass from the start, the replay drops where the trace does, plus the wrap.
    wrap = int(shared.unavailable[0] and not shared.unavailable[-1])

    drops = list(trace_drops(replay, 0, replay.hours))

    assert len(drops) == preemption_count(shared) + wrap > 0
    assert replay.tick_hours == shared.tick_hours


@pytest.mark.parametrize(
    "payload",
    [
        {"data": [0, 1]},
        {"metadata": {"gap_seconds": 0}, "data": [0, 1]},
        {"metadata": {"gap_seconds": 60}, "data": []},
        {"metadata": {"gap_seconds": 60}, "data": [0, -1]},
        {"metadata": {"gap_seconds": 60}, "data": [0, 0.5]},
        {"metadata": {"gap_seconds": 60}, "data": [[0, 1]]},
    ],
)
def test_a_malformed_trace_is_refused(payload: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="trace 'bad'"):
        replay_trace_from_dict("bad", payload)


# --- the beat tick -------------------------------------------------------------------------


@pytest.fixture
def market(settings: Any) -> Iterator[Any]:
    """A market with a fresh state in Redis, switched on at one simulated hour a second."""
    from migration import market_tick

    store = market_tick.redis_client(settings.REDIS_URL)
    store.delete(market_tick.state_key())
    settings.BATON_MARKET_TIME_SCALE = HOUR
    settings.BATON_MARKET_SEED = 1
    yield settings
    store.delete(market_tick.state_key())


@pytest.fixture
def interrupts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the interrupts instead of sending them (the orchestrator has its own tests)."""
    from migration import market_tick

    calls: list[dict[str, Any]] = []

    def interrupt_instance(instance_id: int, **kw: Any) -> None:
        calls.append({"instance": instance_id, **kw})

    monkeypatch.setattr(market_tick, "interrupt_instance", interrupt_instance)
    return calls


@pytest.fixture
def fleet(catalogue: dict[str, Any], alice: Any) -> dict[str, Any]:
    """Instances of one job in several states and markets; every pool preempts at once."""
    from migration.models import CapacityPool, Instance
    from tests.conftest import submit

    job = submit(alice, catalogue)
    pools = catalogue["pools"]
    CapacityPool.objects.update(interruption_rate_per_hour=1e9, advance_notice_s=15)
    started = T0 - timedelta(hours=1)

    def make(pool: str, state: str = "running", **kw: Any) -> Any:
        return Instance.objects.create(
            pool=pools[pool], job=job, rank=len(made), state=state, started_at=started, **kw
        )

    made: dict[str, Any] = {}
    made["spot"] = make("t4_spot")
    made["spot_west"] = make("t4_spot_west")
    made["on_demand"] = make("t4_od")
    made["provisioning"] = make("a10g_spot", state="provisioning")
    made["draining"] = make("a10g_spot", state="draining")
    made["under_notice"] = make("v100_spot", final_notice_at=T0)
    return made


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.django_db
def test_the_market_is_off_by_default(
    fleet: dict[str, Any], interrupts: list[dict[str, Any]], django_assert_num_queries: Any
) -> None:
    from django.conf import settings

    from migration import market_tick

    assert settings.BATON_MARKET_TIME_SCALE == 0
    with django_assert_num_queries(0):
        assert market_tick.run_market_tick(at(0)) == []
        assert market_tick.run_market_tick(at(3600)) == []
    assert interrupts == []


@pytest.mark.django_db
def test_a_switched_on_market_interrupts_running_spot_instances_only(
    market: Any,
    fleet: dict[str, Any],
    interrupts: list[dict[str, Any]],
    django_assert_max_num_queries: Any,
) -> None:
    from migration import market_tick

    assert market_tick.run_market_tick(at(0)) == []  # the first tick starts the clock
    with django_assert_max_num_queries(2):
        interrupted = market_tick.run_market_tick(at(1))

    spot, west = fleet["spot"], fleet["spot_west"]
    assert interrupted == [spot.pk, west.pk]
    assert interrupts == [
        {"instance": i.pk, "advance_notice_s": 15, "final_window_s": 120, "source": "simulated"}
        for i in (spot, west)
    ]


@pytest.mark.django_db
def test_an_instance_the_tick_interrupted_is_not_interrupted_again(
    market: Any, fleet: dict[str, Any]
) -> None:
    from migration import market_tick
    from migration.models import Instance

    Instance.objects.exclude(pk=fleet["spot"].pk).update(state="released")
    market_tick.run_market_tick(at(0))

    assert market_tick.run_market_tick(at(1)) == [fleet["spot"].pk]  # the real interrupt

    spot = Instance.objects.get(pk=fleet["spot"].pk)
    assert spot.advance_notice_at is not None and spot.final_notice_at is not None
    assert market_tick.run_market_tick(at(2)) == []


@pytest.mark.django_db
def test_an_instance_gone_meanwhile_is_skipped(
    market: Any, fleet: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from migration import market_tick
    from migration.interruptions import InstanceNotRunning

    def interrupt_instance(instance_id: int, **kw: Any) -> None:
        if instance_id == fleet["spot"].pk:
            raise InstanceNotRunning("released meanwhile")

    monkeypatch.setattr(market_tick, "interrupt_instance", interrupt_instance)
    market_tick.run_market_tick(at(0))

    assert market_tick.run_market_tick(at(1)) == [fleet["spot_west"].pk]


@pytest.mark.django_db
def test_a_long_pause_counts_as_a_few_ticks_and_the_clock_carries_on(
    market: Any, fleet: dict[str, Any], interrupts: list[dict[str, Any]]
) -> None:
    from migration import market_tick

    market.BATON_MARKET_TICK_SECONDS = 2.0
    store = market_tick.redis_client(market.REDIS_URL)

    def state() -> Any:
        raw = store.get(market_tick.state_key())
        assert raw is not None
        return json.loads(raw)

    market_tick.run_market_tick(at(0))
    market_tick.run_market_tick(at(3600))  # an hour stopped: ten wall seconds of market

    assert state() == {"wall": at(3600).timestamp(), "clock_hours": 10.0}
    market_tick.run_market_tick(at(3599))  # a clock going back moves nothing
    assert state()["clock_hours"] == 10.0


@pytest.mark.django_db
def test_a_pool_mapped_to_a_trace_replays_it(
    market: Any,
    fleet: dict[str, Any],
    interrupts: list[dict[str, Any]],
    tmp_path: Path,
    catalogue: dict[str, Any],
) -> None:
    from migration import market_tick
    from migration.models import Instance

    # Half-hour ticks, down from the second: one drop half an hour into the replay.
    replay = tmp_path / "hand.json"
    replay.write_text(json.dumps({"metadata": {"gap_seconds": 1800}, "data": [0, 1, 1, 1]}))
    pool = catalogue["pools"]["t4_spot"]
    second = Instance.objects.create(
        pool=pool, job=fleet["spot"].job, rank=9, state="running", started_at=at(-60)
    )
    market.BATON_MARKET_TRACES = [(str(pool.pk), replay)]
    market_tick.run_market_tick(at(0))

    interrupted = market_tick.run_market_tick(at(1))

    # One node lost: one instance of the replaying pool; the other pool is still Poisson.
    assert interrupted == sorted([fleet["spot"].pk, fleet["spot_west"].pk])
    assert second.pk not in interrupted
    # Down all along from there: no drop, and no Poisson draw for the replaying pool.
    assert market_tick.run_market_tick(at(2)) == [fleet["spot_west"].pk]


def test_traces_are_matched_to_pools_by_key_zone_and_region(tmp_path: Path) -> None:
    from migration.market_tick import traces_for_pools

    body = json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1]})
    for name in ["us-east-1a_v100_1", "us-east-1b_v100_1", "us-west-2a_v100_1", "odd name"]:
        (tmp_path / f"{name}.json").write_text(body)
    own = tmp_path / "own.json"
    own.write_text(body)

    def row(pk: int, zone: str, kind: str = "p3.2xlarge", region: str = "us-east-1") -> Any:
        return {
            "id": pk,
            "zone": zone,
            "instance_type": kind,
            "region__code": region,
            "accelerator__name": "V100-16GB",
        }

    pools = [
        row(1, "use1-az1"),
        row(2, "use1-az2"),
        row(3, "use1-az3"),
        row(4, "us-east-1b"),
        row(5, "usw2-az1", region="us-west-2"),
        row(6, "use1-az6", kind="p3.8xlarge"),
        row(7, "euw1-az1", region="eu-west-1"),
    ]
    sources = [("", tmp_path), ("1", own), ("p3.8xlarge", own)]

    names = {pk: t.name for pk, t in traces_for_pools(pools, sources).items()}

    assert names == {
        1: "own",  # by pool id
        2: "us-east-1a_v100_1",  # the region's traces in turn
        3: "us-east-1b_v100_1",
        4: "us-east-1b_v100_1",  # its own zone
        5: "us-west-2a_v100_1",
        6: "own",  # by instance type
    }  # eu-west-1 has no trace of the card: Poisson


@pytest.mark.django_db
def test_the_beat_task_returns_how_many_it_interrupted(
    market: Any, fleet: dict[str, Any], interrupts: list[dict[str, Any]]
) -> None:
    from migration.tasks import simulate_market_task

    assert simulate_market_task() == 0  # starts the clock (now: real time)
    market.BATON_MARKET_TIME_SCALE = 1e9  # whatever little time passed is years of market

    assert simulate_market_task() == 2


def test_a_bad_trace_setting_stops_start_up(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        BATON_HOME=str(tmp_path),
        BATON_MARKET_TRACES=f"us-east-1a={tmp_path / 'missing.json'}",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert out.returncode != 0
    assert "BATON_MARKET_TRACES" in out.stderr and "no trace file" in out.stderr

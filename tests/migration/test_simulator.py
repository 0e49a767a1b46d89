"""The market simulator: Poisson reclaims at each pool's rate, trace replay at availability
drops, the pool's own windows, and nothing at all unless switched on."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from django.utils import timezone

from migration import market_tick, services
from migration.models import Instance
from migration.simulator import SimulatedPool, availability_drops, preemptions
from tests.conftest import submit


def pool(rate: float = 0.0, **kw: Any) -> SimulatedPool:
    return SimulatedPool(
        id=kw.pop("id", 1),
        interruption_rate_per_hour=rate,
        advance_notice_s=kw.pop("advance_notice_s", 5),
        final_window_s=kw.pop("final_window_s", 20),
        **kw,
    )


def test_poisson_reclaims_match_the_pools_rate() -> None:
    rng = random.Random(7)
    instances = [(i, 1) for i in range(200)]
    hits = sum(len(preemptions([pool(0.6)], instances, 0, 0.5, rng)) for _ in range(50))

    expected = 200 * 50 * (1 - math.exp(-0.6 * 0.5))
    assert abs(hits - expected) < 0.05 * expected


def test_a_pool_with_no_interruptions_or_no_time_never_reclaims() -> None:
    rng = random.Random(1)
    instances = [(i, 1) for i in range(50)]

    assert preemptions([pool(0.0)], instances, 0, 1000, rng) == []
    assert preemptions([pool(5.0)], instances, 3, 3, rng) == []


def test_a_reclaim_carries_the_pools_own_windows() -> None:
    (found,) = preemptions(
        [pool(1e9, advance_notice_s=7, final_window_s=33)], [(4, 1)], 0, 1, random.Random(0)
    )

    assert (found.instance_id, found.advance_notice_s, found.final_window_s) == (4, 7, 33)


def test_a_replayed_trace_reclaims_exactly_at_availability_drops() -> None:
    # available, available, gone, gone, available, gone: drops at ticks 2 and 5 (tick = 1 h).
    replay = pool(unavailable=(False, False, True, True, False, True), tick_hours=1.0)

    assert availability_drops(replay, 0, 1.9) == 0
    assert availability_drops(replay, 1.5, 2.5) == 1
    assert availability_drops(replay, 0, 6) == 2
    assert availability_drops(replay, 6, 12) == 2  # the trace repeats
    assert [
        p.instance_id for p in preemptions([replay], [(1, 1), (2, 1)], 1.5, 2.5, random.Random())
    ] == [1, 2]
    assert preemptions([replay], [(1, 1)], 2.5, 4.5, random.Random()) == []


@pytest.fixture
def running_spot(catalogue: Any, alice: Any) -> Instance:
    job = submit(alice, catalogue)
    services.place_job(job.pk)
    instance = Instance.objects.get(job=job)
    Instance.objects.filter(pk=instance.pk).update(state="running", started_at=timezone.now())
    catalogue["pools"]["t4_spot"].__class__.objects.filter(pk=instance.pool_id).update(
        interruption_rate_per_hour=1e6
    )
    return instance


@pytest.mark.django_db
def test_the_market_is_off_by_default(running_spot: Instance) -> None:
    assert market_tick.run_market_tick() == []
    running_spot.refresh_from_db()
    assert running_spot.final_notice_at is None


@pytest.mark.django_db
def test_a_switched_on_market_interrupts_running_spot_instances(
    running_spot: Instance, settings: Any
) -> None:
    settings.BATON_MARKET_TIME_SCALE = 3600.0
    settings.BATON_REDIS_PREFIX = f"test-market-{running_spot.pk}-{random.random()}"
    assert market_tick.run_market_tick(now=1000.0) == []  # the first tick starts the clock

    assert market_tick.run_market_tick(now=1002.0) == [running_spot.pk]

    running_spot.refresh_from_db()
    assert running_spot.final_notice_at is not None and running_spot.reclaim_at is not None
    assert market_tick.run_market_tick(now=1004.0) == []  # already under notice

"""Pure placement: fitting, ranking and reasons, with no database."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from migration.compatibility import HardwareOption, Rule, hardware_options
from migration.placement import (
    PlacementChoice,
    PlacementRequest,
    PoolView,
    Rejection,
    choose_pool,
    expected_cost_to_finish,
    place_many,
)


def pool(
    pid: int,
    acc: str = "T4",
    price: float = 1.0,
    free: int = 3,
    market: str = "spot",
    gpus: int = 1,
    region: str = "us-east-1",
) -> PoolView:
    return PoolView(pid, region, f"{region}-az{pid}", f"type{pid}", acc, gpus, market, price, free)


def request(
    *options: HardwareOption,
    nodes: int = 1,
    market: str = "spot",
    cap: float | None = None,
    replicas: frozenset[str] = frozenset(),
) -> PlacementRequest:
    return PlacementRequest(
        tuple(options) or (HardwareOption("T4", 1),), nodes, market, cap, replicas, "T4"
    )


def test_it_picks_the_cheapest_pool_with_room_for_the_whole_gang() -> None:
    pools = [pool(1, price=0.5, free=1), pool(2, price=0.7, free=2), pool(3, price=0.6, free=2)]

    choice = choose_pool(request(nodes=2), pools)

    assert isinstance(choice, PlacementChoice)
    assert choice.pool.id == 3
    assert "cheapest" in choice.reason and "2 instance(s)" in choice.reason


def test_it_only_considers_the_requested_market() -> None:
    pools = [pool(1, price=0.1, market="on_demand"), pool(2, price=0.9)]

    choice = choose_pool(request(), pools)

    assert isinstance(choice, PlacementChoice) and choice.pool.id == 2


def test_it_rejects_an_incompatible_accelerator_with_a_reason() -> None:
    result = choose_pool(request(HardwareOption("A100-40GB", 1)), [pool(1)])

    assert isinstance(result, Rejection)
    assert "no spot pool has compatible hardware" in result.reason


def test_it_says_when_every_compatible_pool_is_full() -> None:
    result = choose_pool(request(nodes=2), [pool(1, free=1), pool(2, free=0)])

    assert isinstance(result, Rejection)
    assert "full" in result.reason and result.considered == 2


def test_the_price_cap_covers_the_whole_gang() -> None:
    pools = [pool(1, price=0.3)]

    over = choose_pool(request(nodes=2, cap=0.5), pools)
    under = choose_pool(request(nodes=2, cap=0.6), pools)

    assert isinstance(over, Rejection) and "cap" in over.reason
    assert isinstance(under, PlacementChoice)


def test_a_pool_fits_only_with_the_right_gpus_per_instance() -> None:
    result = choose_pool(request(HardwareOption("T4", 4)), [pool(1, gpus=1), pool(2, gpus=4)])

    assert isinstance(result, PlacementChoice) and result.pool.id == 2


def test_a_substitute_is_used_when_the_exact_card_is_full() -> None:
    exact, substitute = HardwareOption("T4", 1), HardwareOption("A10G", 1, "cross_generation")
    room = [pool(1, "T4", price=1.0), pool(2, "A10G", price=0.9)]
    full = [pool(1, "T4", price=1.0, free=0), pool(2, "A10G", price=0.9)]

    keep = choose_pool(request(exact, substitute), room)
    switch = choose_pool(request(exact, substitute), full)

    assert isinstance(keep, PlacementChoice) and keep.pool.id == 1
    assert "the exact card is kept" in keep.reason and "10% less" in keep.reason
    assert isinstance(switch, PlacementChoice) and switch.pool.id == 2
    assert "every exact T4 pool is full" in switch.reason
    assert "substitute for T4" in switch.reason


def test_a_ready_replica_breaks_a_tie_towards_its_region() -> None:
    pools = [pool(1, price=1.0, region="us-east-1"), pool(2, price=1.0, region="eu-west-1")]

    choice = choose_pool(request(replicas=frozenset({"eu-west-1"})), pools)

    assert isinstance(choice, PlacementChoice) and choice.pool.id == 2
    assert "replica is ready" in choice.reason


def test_hardware_options_follow_enabled_rules_and_model_parallel_consent() -> None:
    rules = [
        Rule("V100-32GB", "V100-16GB", "model_parallel", 2),
        Rule("V100-32GB", "A100-40GB", "cross_generation"),
        Rule("V100-32GB", "A10G", "cross_generation", enabled=False),
        Rule("T4", "A10G", "cross_generation"),
    ]

    without = hardware_options("V100-32GB", 2, rules, allow_model_parallel=False)
    with_mp = hardware_options("V100-32GB", 2, rules, allow_model_parallel=True)

    assert [(o.accelerator, o.gpus_per_instance) for o in without] == [
        ("V100-32GB", 2),
        ("A100-40GB", 2),
    ]
    assert ("V100-16GB", 4) in [(o.accelerator, o.gpus_per_instance) for o in with_mp]
    assert not without[0].substitute and without[1].substitute


def spot_request(**fields: Any) -> PlacementRequest:
    fields.setdefault("options", (HardwareOption("T4", 1),))
    return PlacementRequest(nodes=fields.pop("nodes", 1), market="spot", requested="T4", **fields)


def rated(pid: int, price: float, rate: float, **fields: Any) -> PoolView:
    return replace(pool(pid, price=price, **fields), interruption_rate_per_hour=rate)


def test_a_pool_interrupted_less_wins_at_a_higher_price_and_the_reason_says_why() -> None:
    pools = [rated(1, price=0.5, rate=2.0), rated(2, price=0.6, rate=0.1)]
    long_job = spot_request(remaining_hours=20, restart_overhead_hours=0.1)

    choice = choose_pool(long_job, pools)

    assert isinstance(choice, PlacementChoice) and choice.pool.id == 2
    assert "lowest expected cost to finish" in choice.reason
    assert "interrupted 2.00 times per hour against 0.10" in choice.reason
    assert choice.expected_cost == pytest.approx(expected_cost_to_finish(pools[1], long_job))


def test_without_restarts_or_lost_work_price_alone_decides() -> None:
    pools = [rated(1, price=0.5, rate=2.0), rated(2, price=0.6, rate=0.1)]

    choice = choose_pool(spot_request(remaining_hours=20), pools)

    assert isinstance(choice, PlacementChoice) and choice.pool.id == 1
    assert choice.reason.startswith("cheapest compatible spot pool")


def test_a_notice_too_short_for_the_emergency_checkpoint_costs_rework() -> None:
    short = replace(rated(1, price=0.5, rate=0.5), notice_s=120)
    long = replace(rated(2, price=0.55, rate=0.5), notice_s=600)
    job = spot_request(remaining_hours=20, save_seconds=300, checkpoint_interval_hours=1)

    choice = choose_pool(job, [short, long])

    assert isinstance(choice, PlacementChoice) and choice.pool.id == 2
    assert "120 s notice is too short for the 300 s emergency checkpoint" in choice.reason
    # A checkpoint that fits both notices loses nothing anywhere: the cheaper pool again.
    small = choose_pool(replace(job, save_seconds=60), [short, long])
    assert isinstance(small, PlacementChoice) and small.pool.id == 1


def test_a_ready_replica_saves_the_cross_region_copy_but_not_at_any_price() -> None:
    job = spot_request(remaining_hours=10, copy_hours=0.5, replica_regions=frozenset({"eu"}))
    near = pool(2, price=1.02, region="eu")

    close_call = choose_pool(job, [pool(1, price=1.0, region="us"), near])
    far_cheaper = choose_pool(job, [pool(1, price=0.8, region="us"), near])

    assert isinstance(close_call, PlacementChoice) and close_call.pool.id == 2
    assert "the ready checkpoint replica decided" in close_call.reason
    assert isinstance(far_cheaper, PlacementChoice) and far_cheaper.pool.id == 1


def test_a_substitute_displaces_the_exact_card_only_when_it_saves_its_share() -> None:
    exact = HardwareOption("V100-32GB", 1)
    memory = HardwareOption("V100-16GB", 2, "model_parallel", 2)
    newer = HardwareOption("A100-40GB", 1, "cross_generation")

    def chosen(option: HardwareOption, price: float) -> str:
        gpus = option.gpus_per_instance
        pools = [pool(1, "V100-32GB", price=1.0), pool(2, option.accelerator, price, gpus=gpus)]
        result = choose_pool(spot_request(options=(exact, option)), pools)
        assert isinstance(result, PlacementChoice)
        return result.option.accelerator

    assert chosen(newer, 0.6) == "A100-40GB"  # 40% less: more than a 1:1 substitute's 30%
    assert chosen(newer, 0.75) == "V100-32GB"
    assert chosen(memory, 0.6) == "V100-32GB"  # model parallel must save half
    assert chosen(memory, 0.45) == "V100-16GB"


def test_at_equal_cost_the_exact_card_wins() -> None:
    exact, larger = HardwareOption("V100-16GB", 1), HardwareOption("V100-32GB", 1, "larger_memory")
    pools = [pool(9, "V100-32GB", price=1.0), pool(1, "V100-16GB", price=1.0)]

    choice = choose_pool(spot_request(options=(exact, larger)), pools)

    assert isinstance(choice, PlacementChoice) and not choice.option.substitute


def test_the_expected_cost_is_the_estimators_closed_form() -> None:
    from costs.estimator import expected_cost_to_finish as estimator_cost

    spot, on_demand = rated(1, price=0.9, rate=0.4), pool(2, price=3.0, market="on_demand")
    job = spot_request(
        nodes=2,
        remaining_hours=30,
        restart_overhead_hours=0.2,
        save_seconds=500,
        checkpoint_interval_hours=0.5,
    )

    expected_spot, expected_od = estimator_cost(30, 1.8, 6.0, 0.8, 0.2, None, 0.25)

    assert expected_cost_to_finish(spot, job) == pytest.approx(expected_spot)
    assert expected_cost_to_finish(on_demand, replace(job, market="on_demand")) == pytest.approx(
        expected_od
    )


def test_place_many_takes_each_gang_from_the_pools_as_it_goes() -> None:
    pools = [pool(1, price=0.5, free=2), pool(2, price=0.7, free=3)]
    asks = [request(nodes=2), request(nodes=2), request(nodes=1), request(nodes=1)]

    results = place_many(asks, pools)

    placed = [r.pool.id if isinstance(r, PlacementChoice) else None for r in results]
    assert placed == [1, 2, 2, None]
    assert isinstance(results[3], Rejection) and "full" in results[3].reason
    assert isinstance(results[2], PlacementChoice) and results[2].pool.free == 1

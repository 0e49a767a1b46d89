"""Pure placement: fitting, ranking and reasons, with no database."""

from __future__ import annotations

from migration.compatibility import HardwareOption, Rule, hardware_options
from migration.placement import PlacementChoice, PlacementRequest, PoolView, Rejection, choose_pool


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

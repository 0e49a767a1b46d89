"""Placement's promises over random pools, rules and jobs (plain pytest, no database): never
incompatible hardware, never over capacity, never above the price cap, migrations first."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from migration.compatibility import Rule, hardware_options
from migration.placement import PlacementChoice, PlacementRequest, PoolView, place_many

CARDS = ["T4", "A10G", "V100-16GB", "V100-32GB"]
RULES = [
    Rule("T4", "A10G", "cross_generation", 1),
    Rule("V100-16GB", "V100-32GB", "larger_memory", 1),
    Rule("V100-32GB", "V100-16GB", "model_parallel", 2),
]

pools = st.lists(
    st.builds(
        PoolView,
        id=st.integers(1, 10_000),
        region=st.sampled_from(["us-east-1", "us-west-2"]),
        zone=st.just(""),
        instance_type=st.just("x"),
        accelerator=st.sampled_from(CARDS),
        gpus_per_instance=st.sampled_from([1, 2, 4]),
        market=st.sampled_from(["spot", "on_demand"]),
        price_per_hour=st.floats(0.05, 10),
        free=st.integers(0, 4),
        interruption_rate_per_hour=st.floats(0, 3),
    ),
    max_size=25,
    unique_by=lambda p: p.id,
)


@st.composite
def requests(draw: st.DrawFn) -> PlacementRequest:
    card = draw(st.sampled_from(CARDS))
    gpus = draw(st.sampled_from([1, 2]))
    options = hardware_options(card, gpus, RULES, draw(st.booleans()))
    return PlacementRequest(
        options=tuple(options),
        nodes=draw(st.integers(1, 3)),
        market=draw(st.sampled_from(["spot", "on_demand"])),
        max_price_per_hour=draw(st.none() | st.floats(0.1, 20)),
        requested=card,
        remaining_hours=draw(st.floats(0.01, 100)),
        restart_overhead_hours=draw(st.floats(0, 0.2)),
        checkpoint_interval_hours=draw(st.floats(0, 1)),
    )


@settings(max_examples=150, deadline=None)
@given(pools, st.lists(requests(), max_size=30))
def test_placement_never_breaks_hardware_capacity_or_price(
    pool_list: list[PoolView], asks: list[PlacementRequest]
) -> None:
    results = place_many(asks, pool_list)

    taken: Counter[int] = Counter()
    for ask, result in zip(asks, results, strict=True):
        if not isinstance(result, PlacementChoice):
            continue
        pool = result.pool
        assert result.option in ask.options
        assert pool.accelerator == result.option.accelerator
        assert pool.gpus_per_instance == result.option.gpus_per_instance
        assert pool.market == ask.market
        if ask.max_price_per_hour is not None:
            assert pool.price_per_hour * ask.nodes <= ask.max_price_per_hour
        taken[pool.id] += ask.nodes
    capacity = {pool.id: pool.free for pool in pool_list}
    assert all(taken[pid] <= capacity[pid] for pid in taken)


@settings(max_examples=150, deadline=None)
@given(pools, st.lists(requests(), max_size=15), st.lists(requests(), max_size=15))
def test_migrations_placed_first_are_never_starved_by_new_jobs(
    pool_list: list[PoolView], migrations: list[PlacementRequest], new: list[PlacementRequest]
) -> None:
    together = place_many(migrations + new, pool_list)
    alone = place_many(migrations, pool_list)

    # New jobs queued behind the migrations change nothing for the migrations.
    assert together[: len(migrations)] == alone


@settings(max_examples=100, deadline=None)
@given(pools, requests())
def test_an_exact_card_with_room_always_wins_over_a_substitute(
    pool_list: list[PoolView], ask: PlacementRequest
) -> None:
    (result,) = place_many([ask], pool_list)

    exact_room = [
        p
        for p in pool_list
        if p.market == ask.market
        and p.accelerator == ask.requested
        and p.gpus_per_instance == ask.options[0].gpus_per_instance
        and p.free >= ask.nodes
        and (
            ask.max_price_per_hour is None or p.price_per_hour * ask.nodes <= ask.max_price_per_hour
        )
    ]
    if exact_room:
        assert isinstance(result, PlacementChoice) and not result.option.substitute

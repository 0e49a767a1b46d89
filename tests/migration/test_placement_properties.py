"""Placement's promises over random pools, rules and jobs (plain pytest, no database): never
incompatible hardware, never over capacity, never above the price cap, the best score wins,
and migrations placed first are never starved by the new jobs behind them."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from migration.compatibility import Rule, hardware_options
from migration.placement import (
    PlacementChoice,
    PlacementRequest,
    PoolView,
    Rejection,
    choose_pool,
    expected_cost_to_finish,
    place_many,
    required_saving,
)

CARDS = ["T4", "A10G", "V100-16GB", "V100-32GB"]
REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]

rules = st.lists(
    st.sampled_from(
        [
            Rule("T4", "A10G", "cross_generation", 1),
            Rule("A10G", "T4", "model_parallel", 2),
            Rule("V100-16GB", "V100-32GB", "larger_memory", 1),
            Rule("V100-32GB", "V100-16GB", "model_parallel", 2),
            Rule("V100-16GB", "A10G", "cross_generation", 1),
        ]
    ),
    unique=True,
)

pools = st.lists(
    st.builds(
        PoolView,
        id=st.integers(1, 10_000),
        region=st.sampled_from(REGIONS),
        zone=st.just(""),
        instance_type=st.just("x"),
        accelerator=st.sampled_from(CARDS),
        gpus_per_instance=st.sampled_from([1, 2, 4]),
        market=st.sampled_from(["spot", "on_demand"]),
        price_per_hour=st.floats(0.05, 10),
        free=st.integers(0, 4),
        interruption_rate_per_hour=st.floats(0, 3),
        notice_s=st.sampled_from([30.0, 120.0, 600.0]),
    ),
    max_size=25,
    unique_by=lambda p: p.id,
)


@st.composite
def requests(draw: st.DrawFn, matrix: list[Rule]) -> PlacementRequest:
    card = draw(st.sampled_from(CARDS))
    options = hardware_options(card, draw(st.sampled_from([1, 2])), matrix, draw(st.booleans()))
    return PlacementRequest(
        options=tuple(options),
        nodes=draw(st.integers(1, 3)),
        market=draw(st.sampled_from(["spot", "on_demand"])),
        max_price_per_hour=draw(st.none() | st.floats(0.1, 20)),
        replica_regions=frozenset(draw(st.lists(st.sampled_from(REGIONS), max_size=2))),
        requested=card,
        remaining_hours=draw(st.floats(0.01, 100)),
        restart_overhead_hours=draw(st.floats(0, 0.2)),
        checkpoint_interval_hours=draw(st.floats(0, 1)),
        save_seconds=draw(st.floats(0, 900)),
        copy_hours=draw(st.floats(0, 1)),
    )


@st.composite
def queues(draw: st.DrawFn) -> tuple[list[PoolView], list[PlacementRequest]]:
    matrix = draw(rules)
    return draw(pools), draw(st.lists(requests(matrix), max_size=30))


def fits(pool: PoolView, ask: PlacementRequest) -> bool:
    """Compatible hardware in the asked market, under the cap: the candidates by definition."""
    return (
        pool.market == ask.market
        and any(
            pool.accelerator == o.accelerator and pool.gpus_per_instance == o.gpus_per_instance
            for o in ask.options
        )
        and (
            ask.max_price_per_hour is None
            or pool.price_per_hour * ask.nodes <= ask.max_price_per_hour
        )
    )


@settings(max_examples=150, deadline=None)
@given(queues())
def test_placement_never_breaks_hardware_capacity_or_price(
    queue: tuple[list[PoolView], list[PlacementRequest]],
) -> None:
    pool_list, asks = queue

    results = place_many(asks, pool_list)

    taken: Counter[int] = Counter()
    for ask, result in zip(asks, results, strict=True):
        if not isinstance(result, PlacementChoice):
            continue
        pool, option = result.pool, result.option
        assert option in ask.options
        assert pool.accelerator == option.accelerator
        assert pool.gpus_per_instance == option.gpus_per_instance
        assert pool.market == ask.market
        if ask.max_price_per_hour is not None:
            assert pool.price_per_hour * ask.nodes <= ask.max_price_per_hour
        taken[pool.id] += ask.nodes
    capacity = {pool.id: pool.free for pool in pool_list}
    assert all(taken[pid] <= capacity[pid] for pid in taken)


@settings(max_examples=150, deadline=None)
@given(queues())
def test_each_job_gets_the_best_score_among_the_pools_with_room_at_its_turn(
    queue: tuple[list[PoolView], list[PlacementRequest]],
) -> None:
    pool_list, asks = queue
    free = {pool.id: pool.free for pool in pool_list}

    for ask, result in zip(asks, place_many(asks, pool_list), strict=True):
        scores = [
            (expected_cost_to_finish(pool, ask) / (1 - required_saving(option)), option.substitute)
            for pool in pool_list
            if fits(pool, ask) and free[pool.id] >= ask.nodes
            for option in ask.options
            if pool.accelerator == option.accelerator
            and pool.gpus_per_instance == option.gpus_per_instance
        ]
        if not scores:
            assert isinstance(result, Rejection)
            continue
        assert isinstance(result, PlacementChoice)
        chosen = expected_cost_to_finish(result.pool, ask) / (1 - required_saving(result.option))
        best = min(score for score, _ in scores)
        assert chosen == best or chosen <= best * (1 + 1e-12)
        if any(score == chosen and not substitute for score, substitute in scores):
            assert not result.option.substitute  # at equal cost the exact card wins
        free[result.pool.id] -= ask.nodes


@settings(max_examples=150, deadline=None)
@given(queues(), st.data())
def test_migrations_placed_first_are_never_starved_by_new_jobs(
    queue: tuple[list[PoolView], list[PlacementRequest]], data: st.DataObject
) -> None:
    pool_list, asks = queue
    migrations = asks[: data.draw(st.integers(0, len(asks)))]
    new = asks[len(migrations) :]

    together = place_many(migrations + new, pool_list)

    # New jobs queued behind the migrations change nothing for the migrations...
    assert together[: len(migrations)] == place_many(migrations, pool_list)
    # ...and a migration left without a pool had none with room for it at its turn, so no
    # new job took capacity it could have used.
    free = {pool.id: pool.free for pool in pool_list}
    for index, (ask, result) in enumerate(zip(migrations + new, together, strict=True)):
        if isinstance(result, PlacementChoice):
            free[result.pool.id] -= ask.nodes
        elif index < len(migrations):
            assert not [p for p in pool_list if fits(p, ask) and free[p.id] >= ask.nodes]


@settings(max_examples=100, deadline=None)
@given(queues())
def test_place_many_chooses_what_one_choose_pool_per_job_would(
    queue: tuple[list[PoolView], list[PlacementRequest]],
) -> None:
    pool_list, asks = queue
    current = list(pool_list)

    for ask, result in zip(asks, place_many(asks, pool_list), strict=True):
        alone = choose_pool(ask, current)
        assert type(alone) is type(result)
        if isinstance(alone, PlacementChoice) and isinstance(result, PlacementChoice):
            assert (alone.pool.id, alone.option, alone.reason) == (
                result.pool.id,
                result.option,
                result.reason,
            )
            current = [
                replace(p, free=p.free - ask.nodes) if p.id == alone.pool.id else p for p in current
            ]

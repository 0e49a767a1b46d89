"""Choosing a pool for a job (DESIGN §6). Pure: plain dataclasses in and out, no Django.

The service layer asks the cost policies which market to use, then calls `choose_pool` with
the pools it loaded; this module only filters and ranks, and says why in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from migration.compatibility import HardwareOption

# A ready checkpoint replica in the pool's region saves a cross-region copy on restore.
LOCALITY_BONUS = 0.05
# Substitutes rank after the exact card (decision 031); among substitutes, a 1:1 card before
# N cards in model parallel, which adds communication the job was not written for.
SUBSTITUTE_RANK = {None: 0, "larger_memory": 1, "cross_generation": 1, "model_parallel": 2}


@dataclass(frozen=True)
class PoolView:
    """What placement needs to know of a capacity pool."""

    id: int
    region: str
    zone: str
    instance_type: str
    accelerator: str
    gpus_per_instance: int
    market: str
    price_per_hour: float
    free: int
    interruption_rate_per_hour: float = 0.0
    notice_s: float = 120.0  # advance notice plus final window: time for an emergency save


@dataclass(frozen=True)
class PlacementRequest:
    """A job (a gang of `nodes` instances) looking for capacity in one market."""

    options: tuple[HardwareOption, ...]
    nodes: int
    market: str
    max_price_per_hour: float | None = None
    replica_regions: frozenset[str] = field(default_factory=frozenset)
    requested: str = ""
    # What is left to do, for the expected cost of finishing (1 hour ranks by price alone).
    remaining_hours: float = 1.0
    restart_overhead_hours: float = 0.0
    checkpoint_interval_hours: float = 0.0


@dataclass(frozen=True)
class PlacementChoice:
    pool: PoolView
    option: HardwareOption
    reason: str

    @property
    def job_price_per_hour(self) -> float:
        return self.pool.price_per_hour


@dataclass(frozen=True)
class Rejection:
    """Why no pool was chosen, in words, with what was considered."""

    reason: str
    considered: int = 0


def _fits(pool: PoolView, option: HardwareOption) -> bool:
    return (
        pool.accelerator == option.accelerator
        and pool.gpus_per_instance == option.gpus_per_instance
    )


def expected_cost_to_finish(pool: PoolView, request: PlacementRequest) -> float:
    """What finishing the remaining work on `pool` costs in expectation: the gang's price over
    the remaining hours, stretched on spot by the work each interruption costs (a restart plus
    on average half a checkpoint interval redone, at the pool's interruption rate for the whole
    gang), the first-order form of the estimator's model (decision 020)."""
    hours = request.remaining_hours
    if pool.market != "on_demand":
        rate = pool.interruption_rate_per_hour * request.nodes
        per_interruption = request.restart_overhead_hours + request.checkpoint_interval_hours / 2
        hours *= 1 + rate * per_interruption
    return pool.price_per_hour * request.nodes * hours


def _score(pool: PoolView, option: HardwareOption, request: PlacementRequest) -> tuple[int, float]:
    """Exact hardware first (a substitute carries operator and memory-mapping risk), then the
    expected cost of finishing, a little lower where a checkpoint replica is ready."""
    cost = expected_cost_to_finish(pool, request)
    if pool.region in request.replica_regions:
        cost *= 1 - LOCALITY_BONUS
    return SUBSTITUTE_RANK.get(option.rule_kind, 1), cost


def cheapest_fit(request: PlacementRequest, pools: list[PoolView]) -> PoolView | None:
    """The pool `choose_pool` would prefer if capacity were no object (exact card first, then
    price under the cap): what the market would cost, even while it is full."""
    fitting = [
        (pool, option)
        for pool in pools
        if pool.market == request.market
        for option in request.options
        if _fits(pool, option)
        and (
            request.max_price_per_hour is None
            or pool.price_per_hour * request.nodes <= request.max_price_per_hour
        )
    ]
    if not fitting:
        return None
    return min(fitting, key=lambda po: (_score(po[0], po[1], request), po[0].id))[0]


def choose_pool(request: PlacementRequest, pools: list[PoolView]) -> PlacementChoice | Rejection:
    """The best pool of `request.market` that fits the whole gang, or why there is none."""
    matching = [
        (pool, option)
        for pool in pools
        if pool.market == request.market
        for option in request.options
        if _fits(pool, option)
    ]
    if not matching:
        return Rejection(f"no {request.market} pool has compatible hardware")
    affordable = [
        (pool, option)
        for pool, option in matching
        if request.max_price_per_hour is None
        or pool.price_per_hour * request.nodes <= request.max_price_per_hour
    ]
    if not affordable:
        cheapest = min(pool.price_per_hour * request.nodes for pool, _ in matching)
        return Rejection(
            f"every compatible {request.market} pool costs more than the cap of "
            f"{request.max_price_per_hour:.4f}/h (cheapest {cheapest:.4f}/h)",
            len(matching),
        )
    free = [(pool, option) for pool, option in affordable if pool.free >= request.nodes]
    if not free:
        return Rejection(
            f"all {len(affordable)} compatible {request.market} pools are full "
            f"(need {request.nodes} free instance(s))",
            len(affordable),
        )
    pool, option = min(free, key=lambda po: (_score(po[0], po[1], request), po[0].id))
    exact_full = option.substitute and any(not o.substitute for _, o in affordable)
    reason = (
        f"{'cheapest' if len(free) > 1 else 'only'} compatible {request.market} pool with room "
        f"for {request.nodes} instance(s) among {len(free)}: {pool.instance_type} in "
        f"{pool.zone or pool.region} at {pool.price_per_hour:.4f}/h per instance, "
        f"{option.describe(request.requested or option.accelerator)}"
    )
    if exact_full:
        reason = f"every exact {request.requested} pool is full, so a {reason}"
    if pool.region in request.replica_regions:
        reason += "; a checkpoint replica is ready in this region"
    return PlacementChoice(pool, option, reason)


def place_many(
    requests: list[PlacementRequest], pools: list[PoolView]
) -> list[PlacementChoice | Rejection]:
    """Place `requests` in the order given (callers put migrations first), each taking its
    gang's slots from the pools' free capacity before the next is placed, so no pool is ever
    over-filled. Pools are indexed by hardware and market once, so each request looks only at
    the pools that could fit it."""
    free = {pool.id: pool.free for pool in pools}
    by_hardware: dict[tuple[str, int, str], list[PoolView]] = {}
    for pool in pools:
        by_hardware.setdefault((pool.accelerator, pool.gpus_per_instance, pool.market), []).append(
            pool
        )
    results: list[PlacementChoice | Rejection] = []
    for request in requests:
        candidates = {
            pool.id: replace(pool, free=free[pool.id])
            for option in request.options
            for pool in by_hardware.get(
                (option.accelerator, option.gpus_per_instance, request.market), ()
            )
        }
        result = choose_pool(request, list(candidates.values()))
        if isinstance(result, PlacementChoice):
            free[result.pool.id] -= request.nodes
        results.append(result)
    return results

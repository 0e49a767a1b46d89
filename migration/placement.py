"""Choosing a pool for a job (DESIGN §6). Pure: plain dataclasses in and out, no Django.

The service layer asks the cost policies which market to use, then calls `choose_pool` with
the pools it loaded; this module only filters and ranks, and says why in words.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from migration.compatibility import HardwareOption

# A ready checkpoint replica in the pool's region saves a cross-region copy on restore.
LOCALITY_BONUS = 0.05


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


def _score(pool: PoolView, option: HardwareOption, request: PlacementRequest) -> tuple[bool, float]:
    """Exact hardware first (a substitute carries operator and memory-mapping risk), then the
    price per hour of the gang, a little lower where a checkpoint replica is ready."""
    cost = pool.price_per_hour * request.nodes
    if pool.region in request.replica_regions:
        cost *= 1 - LOCALITY_BONUS
    return option.substitute, cost


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

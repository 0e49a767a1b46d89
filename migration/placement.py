"""Choosing a pool for a job (DESIGN §6). Pure: plain dataclasses in and out, no Django.

The service layer asks the cost policies which market to use, then calls `choose_pool` with
the pools it loaded; this module only filters and ranks, and says why in words.

A candidate's score (docs/decisions/032-placement-score.md) is what finishing the job there is
expected to cost, in dollars:

    score = gang price per hour x expected hours held / (1 - substitute's required saving)

- expected hours held: on-demand, the first start (restart overhead, plus a cross-region copy
  of the checkpoint when no replica is ready in the pool's region) then the remaining work. On
  spot, the estimator's closed form for exponential spells (`costs.estimator`,
  decision 020): w exp(rate R) + (exp(rate R) - 1) / rate, with R that start (the copy counted
  in every restart: a small overstatement, a restart after an interruption finds the replica
  in place), rate the pool's interruption rate times the gang's instances (any rank's
  interruption moves them all) and w the work stretched by the work each interruption loses:
  nothing when the emergency checkpoint fits the pool's notice, else half a checkpoint
  interval on average.
- locality: a ready replica in the pool's region spares the copy, so the start is shorter; the
  factor (hours held with the copy / hours held without) is what a remote pool pays more.
- substitute saving: a substitute carries operator, numerics and memory-mapping risk the user
  did not ask for; it displaces an exact card with room only when it is expected to cost that
  share less, more for a newer generation than for more memory, most for model parallel. At
  equal cost the exact card wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from costs.estimator import expected_spot_held_hours
from migration.compatibility import HardwareOption

ON_DEMAND = "on_demand"
# Share of the exact card's expected cost a substitute must save to displace it (decision 032):
# more memory on the same generation is the smallest step, a newer generation may change
# numerics and kernels, N cards in model parallel add communication the job was not written for.
SUBSTITUTE_SAVING: dict[str | None, float] = {
    None: 0.0,
    "larger_memory": 0.2,
    "cross_generation": 0.3,
    "model_parallel": 0.5,
}
# A kind the table does not know (a rule kind added later): the most cautious 1:1 figure.
UNKNOWN_SUBSTITUTE_SAVING = 0.3
# Copying a checkpoint between regions' stores: a cross-region object copy, ~100 MB/s.
CROSS_REGION_GB_PER_S = 0.1


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
    # When the pool last took back a spot instance (None: never seen): its spot has had room
    # without a break since then.
    last_preempted_at: datetime | None = None


@dataclass(frozen=True)
class PlacementRequest:
    """A job (a gang of `nodes` instances) looking for capacity in one market.

    The defaults rank by price alone (one hour of work, free restarts, nothing lost), so a
    caller that knows nothing of the job's progress still gets the cheapest pool.
    """

    options: tuple[HardwareOption, ...]
    nodes: int
    market: str
    max_price_per_hour: float | None = None
    replica_regions: frozenset[str] = field(default_factory=frozenset)
    requested: str = ""
    # What is left to do, for the expected cost of finishing.
    remaining_hours: float = 1.0
    # Every start: provisioning, replica, start, restore and validation, without progress.
    restart_overhead_hours: float = 0.0
    checkpoint_interval_hours: float = 0.0
    # Writing the emergency checkpoint: an interruption whose notice is shorter loses work.
    save_seconds: float = 0.0
    # Bringing the newest checkpoint to a region without a ready replica (0: nothing to copy).
    copy_hours: float = 0.0


@dataclass(frozen=True)
class PlacementChoice:
    pool: PoolView
    option: HardwareOption
    reason: str
    expected_cost: float = 0.0

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


def _under_cap(pool: PoolView, request: PlacementRequest) -> bool:
    cap = request.max_price_per_hour
    return cap is None or pool.price_per_hour * request.nodes <= cap


def has_replica(pool: PoolView, request: PlacementRequest) -> bool:
    """No copy is needed: a replica is ready in the pool's region, or there is no checkpoint."""
    return not request.replica_regions or pool.region in request.replica_regions


def expected_hours_held(pool: PoolView, request: PlacementRequest, local: bool = True) -> float:
    """Hours of the gang's instances held (and billed) to finish the remaining work on `pool`.

    `local=False` prices the start as if the checkpoint had to be copied to the pool's region.
    """
    start = request.restart_overhead_hours
    if not (local and has_replica(pool, request)):
        start += request.copy_hours
    if pool.market == ON_DEMAND:
        return request.remaining_hours + start
    lost = 0.0
    if request.save_seconds > pool.notice_s:
        lost = request.checkpoint_interval_hours / 2
    return expected_spot_held_hours(
        request.remaining_hours,
        pool.interruption_rate_per_hour * request.nodes,
        start,
        lost_hours_per_interruption=lost,
    )


def expected_cost_to_finish(pool: PoolView, request: PlacementRequest) -> float:
    """What finishing the remaining work on `pool` costs in expectation (inf: never finishes,
    interruptions come faster than the lost work is redone)."""
    return pool.price_per_hour * request.nodes * expected_hours_held(pool, request)


def required_saving(option: HardwareOption) -> float:
    """Share of the exact card's expected cost `option` must save to displace it."""
    return SUBSTITUTE_SAVING.get(option.rule_kind, UNKNOWN_SUBSTITUTE_SAVING)


def _score(cost: float, option: HardwareOption) -> float:
    return cost / (1 - required_saving(option))


@dataclass(frozen=True)
class _Candidate:
    pool: PoolView
    option: HardwareOption
    cost: float  # expected cost to finish
    score: float  # the cost, raised for a substitute by the saving it must bring
    local: bool  # no checkpoint copy needed

    @property
    def key(self) -> tuple[float, bool, bool, int]:
        # Equal scores: the exact card, then a ready replica, then the older pool, so the
        # choice never depends on the order pools were listed in.
        return (self.score, self.option.substitute, not self.local, self.pool.id)


def _candidate(pool: PoolView, option: HardwareOption, request: PlacementRequest) -> _Candidate:
    cost = expected_cost_to_finish(pool, request)
    return _Candidate(pool, option, cost, _score(cost, option), has_replica(pool, request))


def _candidates(
    request: PlacementRequest, pools: Iterable[PoolView]
) -> list[tuple[PoolView, HardwareOption]]:
    return [
        (pool, option)
        for pool in pools
        if pool.market == request.market
        for option in request.options
        if _fits(pool, option)
    ]


def candidate_pools(request: PlacementRequest, pools: list[PoolView]) -> list[PoolView]:
    """Every pool of `request.market` placement may take for the job, room or not: compatible
    hardware under the cap (where an interrupted job can go next)."""
    found = {pool.id: pool for pool, _ in _candidates(request, pools) if _under_cap(pool, request)}
    return list(found.values())


def cheapest_fit(request: PlacementRequest, pools: list[PoolView]) -> PoolView | None:
    """The pool `choose_pool` would prefer if capacity were no object (same score, under the
    cap): what the market would cost, even while it is full."""
    fitting = [
        _candidate(pool, option, request)
        for pool, option in _candidates(request, pools)
        if _under_cap(pool, request)
    ]
    return min(fitting, key=lambda c: c.key).pool if fitting else None


def choose_pool(request: PlacementRequest, pools: list[PoolView]) -> PlacementChoice | Rejection:
    """The best pool of `request.market` that fits the whole gang, or why there is none."""
    return _rank(request, _candidates(request, pools), None)


def _rank(
    request: PlacementRequest,
    matching: list[tuple[PoolView, HardwareOption]],
    free: Mapping[int, int] | None,
) -> PlacementChoice | Rejection:
    """Filter `matching` (pool, option) pairs by cap and room, and take the best score.

    `free` overrides the pools' own free capacity (place_many's running count)."""
    if not matching:
        return Rejection(f"no {request.market} pool has compatible hardware")
    affordable = [(pool, option) for pool, option in matching if _under_cap(pool, request)]
    if not affordable:
        cheapest = min(pool.price_per_hour * request.nodes for pool, _ in matching)
        return Rejection(
            f"every compatible {request.market} pool costs more than the cap of "
            f"{request.max_price_per_hour:.4f}/h (cheapest {cheapest:.4f}/h)",
            len(matching),
        )
    room = [
        _candidate(pool, option, request)
        for pool, option in affordable
        if (pool.free if free is None else free[pool.id]) >= request.nodes
    ]
    if not room:
        return Rejection(
            f"all {len(affordable)} compatible {request.market} pools are full "
            f"(need {request.nodes} free instance(s))",
            len(affordable),
        )
    best = min(room, key=lambda c: c.key)
    pool = best.pool if free is None else replace(best.pool, free=free[best.pool.id])
    reason = _reason(request, best, room, affordable)
    return PlacementChoice(pool, best.option, reason, best.cost)


def _money(value: float) -> str:
    return "never finishing" if math.isinf(value) else f"${value:,.2f}"


def _where(pool: PoolView) -> str:
    return f"{pool.instance_type} in {pool.zone or pool.region}"


def _hours(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def _kind(option: HardwareOption) -> str:
    return (option.rule_kind or "").replace("_", " ")


def _reason(
    request: PlacementRequest,
    best: _Candidate,
    room: list[_Candidate],
    affordable: list[tuple[PoolView, HardwareOption]],
) -> str:
    """The choice in words, naming what decided it over the runner-up (and over a pool that
    costs less per hour, when one lost)."""
    pool, option = best.pool, best.option
    market = request.market.replace("_", "-")
    # "Cheapest" among the pools of its own kind: a cheaper substitute is answered below.
    peers = [c for c in room if c.option.substitute == option.substitute]
    cheapest = min(peers, key=lambda c: (c.pool.price_per_hour, c.key))
    if len(room) == 1:
        lead = f"only compatible {market} pool with room"
    elif cheapest.pool.price_per_hour >= pool.price_per_hour:
        lead = f"cheapest compatible {market} pool with room"
    else:
        lead = f"compatible {market} pool with the lowest expected cost to finish and room"
    reason = (
        f"{lead} for {request.nodes} instance(s) among {len(room)}: {_where(pool)} at "
        f"{pool.price_per_hour:.4f}/h per instance, "
        f"{option.describe(request.requested or option.accelerator)}; expected "
        f"{_money(best.cost)} to finish {_hours(request.remaining_hours)} of work"
    )
    requested = request.requested or request.options[0].accelerator
    if option.substitute:
        exact = [c for c in room if not c.option.substitute]
        if exact:
            rival = min(exact, key=lambda c: c.key)
            reason += (
                f"; it is expected to cost {1 - best.cost / rival.cost:.0%} less than the best "
                f"exact pool ({_where(rival.pool)}, {_money(rival.cost)}), more than the "
                f"{required_saving(option):.0%} a {_kind(option)} substitute must save"
            )
        elif any(not o.substitute for _, o in affordable):
            reason = f"every exact {requested} pool is full, so the {reason}"
        else:
            reason = f"no exact {requested} {market} pool is within reach, so the {reason}"
    others = [c for c in room if c.pool.id != best.pool.id]
    if others:
        runner_up = min(others, key=lambda c: c.key)
        reason += _decider(request, best, runner_up)
        if cheapest.pool.price_per_hour < pool.price_per_hour and cheapest is not runner_up:
            reason += _dearer(request, best, cheapest)
    if request.replica_regions and pool.region in request.replica_regions:
        reason += "; a checkpoint replica is ready in this region"
    return reason


def _decider(request: PlacementRequest, best: _Candidate, rival: _Candidate) -> str:
    """What made `best` win over `rival`, the next best, when its price per hour did not."""
    if not best.option.substitute and rival.option.substitute and rival.cost < best.cost:
        return (
            f"; the exact card is kept: a {_kind(rival.option)} substitute "
            f"({_where(rival.pool)}) would cost {1 - rival.cost / best.cost:.0%} less, under "
            f"the {required_saving(rival.option):.0%} it must save"
        )
    if best.option.substitute != rival.option.substitute:
        return ""  # said before: the exact card has no room, or the substitute saves enough
    if best.local and not rival.local:
        hours = expected_hours_held(best.pool, request, local=False)
        remote = best.pool.price_per_hour * request.nodes * hours
        if _score(remote, best.option) >= rival.score:
            return (
                f"; the ready checkpoint replica decided: {_where(rival.pool)} would first "
                f"copy it across regions ({_hours(request.copy_hours)})"
            )
    if best.pool.price_per_hour < rival.pool.price_per_hour:
        return ""  # the cheaper pool won: the lead says so
    return _dearer(request, best, rival)


def _dearer(request: PlacementRequest, best: _Candidate, rival: _Candidate) -> str:
    """Why `rival`, no dearer per hour than `best`, is expected to cost more to finish."""
    why = []
    if rival.pool.interruption_rate_per_hour > best.pool.interruption_rate_per_hour:
        why.append(
            f"is interrupted {rival.pool.interruption_rate_per_hour:.2f} times per hour "
            f"against {best.pool.interruption_rate_per_hour:.2f}"
        )
    if request.save_seconds > rival.pool.notice_s and request.save_seconds <= best.pool.notice_s:
        why.append(
            f"its {rival.pool.notice_s:.0f} s notice is too short for the "
            f"{request.save_seconds:.0f} s emergency checkpoint"
        )
    if best.local and not rival.local:
        why.append(f"would first copy the checkpoint across regions ({_hours(request.copy_hours)})")
    if not why:
        return f"; {_where(rival.pool)} would cost as much and comes later in the list"
    return (
        f"; {_where(rival.pool)} costs {rival.pool.price_per_hour:.4f}/h but "
        f"{' and '.join(why)}, so it is expected to cost {_money(rival.cost)} to finish"
    )


def place_many(
    requests: list[PlacementRequest], pools: list[PoolView]
) -> list[PlacementChoice | Rejection]:
    """Place `requests` in the order given (callers put migrations first), each taking its
    gang's slots from the pools' free capacity before the next is placed, so no pool is ever
    over-filled. Pools are indexed by (accelerator, GPUs per instance, market) once, so each
    request scores only the pools that could fit it."""
    free = {pool.id: pool.free for pool in pools}
    by_hardware: dict[tuple[str, int, str], list[PoolView]] = {}
    for pool in pools:
        key = (pool.accelerator, pool.gpus_per_instance, pool.market)
        by_hardware.setdefault(key, []).append(pool)
    results: list[PlacementChoice | Rejection] = []
    for request in requests:
        matching = [
            (pool, option)
            for option in request.options
            for pool in by_hardware.get(
                (option.accelerator, option.gpus_per_instance, request.market), ()
            )
        ]
        result = _rank(request, matching, free)
        if isinstance(result, PlacementChoice):
            free[result.pool.id] -= request.nodes
        results.append(result)
    return results


def likely_regions(requests: Iterable[PlacementRequest], pools: list[PoolView]) -> list[str]:
    """The regions a job would land in next, most likely first: every region with a pool that
    fits one of `requests` (a market each) under its cap, ordered by its best candidate as
    placement ranks them, pools with room for the gang before full ones."""
    best: dict[str, tuple[bool, tuple[float, bool, bool, int]]] = {}
    for request in requests:
        for pool, option in _candidates(request, pools):
            if not _under_cap(pool, request):
                continue
            key = (pool.free < request.nodes, _candidate(pool, option, request).key)
            if pool.region not in best or key < best[pool.region]:
                best[pool.region] = key
    return sorted(best, key=lambda region: best[region])

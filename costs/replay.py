"""Replay of a job over a spot availability trace, and the references it is judged against.

The model (DESIGN §9 ``replay_policy``): time advances in ticks of the trace's ``gap_seconds``.
At the start of every tick a policy picks spot, on-demand or waiting. A tick on a market costs
that market's price for the tick; on spot, a tick whose trace value is 1 is unavailable (a job
holding spot is preempted: it loses the instance, not its progress, which the emergency
checkpoint keeps). Every start — the first one, a restart after a preemption, a switch of
market — costs ``restart_overhead_hours`` of billed time without progress. The job finishes in
the middle of a tick and pays for the used part only. Past the end of the trace spot counts as
unavailable.

To keep the arithmetic exact, progress is counted in integer *units*: a tick is ``q`` units with
``q`` the smallest denominator (up to 64) making the restart overhead a whole number of units
(0.1 h on 195 s ticks: q = 13, 15 s units; on 32 s ticks: q = 4). Work and overhead are rounded
to whole units (at most half a unit off; none for the shared traces and 0.1 h).

References, all on the same trace and job:

- ``on_demand``: on-demand from the first tick to the end.
- ``greedy``: spot when available, waiting otherwise, until the slack is down to one restart;
  then on-demand for good.
- ``optimal``: the omniscient optimum, which knows the whole trace: an exact dynamic programme
  over ticks and progress units (``optimal_outcome``), checked against brute force
  (``brute_force_optimal``) on small traces.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from costs.market import (
    CODE_OF_MARKET,
    MARKET_ON_DEMAND,
    MARKET_SPOT,
    ON_DEMAND,
    deadline_action_scalar,
)
from costs.policies import TOLERANCES, MarketDecision, MarketSituation, decide_market

# The V100 prices of the shared data: p3.2xlarge spot as the traces carry it, and the AWS
# on-demand list price in us-east-1 (aws-gpu-instance-types.tsv).
DEFAULT_SPOT_PRICE = 0.918
DEFAULT_ON_DEMAND_PRICE = 3.06
MAX_UNITS_PER_TICK = 64


@dataclass(frozen=True)
class ReplayJob:
    """The job replayed: hours of work, deadline from the start, overhead per start, prices."""

    task_hours: float
    deadline_hours: float
    restart_overhead_hours: float
    spot_price: float = DEFAULT_SPOT_PRICE
    on_demand_price: float = DEFAULT_ON_DEMAND_PRICE

    def __post_init__(self) -> None:
        for name in ("task_hours", "deadline_hours", "restart_overhead_hours"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        if self.spot_price < 0 or self.on_demand_price < 0:
            raise ValueError("prices must not be negative")


@dataclass(frozen=True)
class ReplayOutcome:
    """What one plan realised on the trace. ``finish_hours`` is None when it never finished.

    The split into spot and on-demand hours and the count of starts are known for replayed
    policies; the optimum (a cost, not a replay) leaves them None.
    """

    cost: float
    finish_hours: float | None
    deadline_met: bool
    preemptions: int
    spot_hours: float | None = None
    on_demand_hours: float | None = None
    restarts: int | None = None

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``replay_policy --json``: the four fields, then the known extras."""
        out: dict[str, object] = {
            "cost": round(self.cost, 6),
            "finish_hours": None if self.finish_hours is None else round(self.finish_hours, 6),
            "deadline_met": self.deadline_met,
            "preemptions": self.preemptions,
        }
        if self.spot_hours is not None:
            out["spot_hours"] = round(self.spot_hours, 6)
        if self.on_demand_hours is not None:
            out["on_demand_hours"] = round(self.on_demand_hours, 6)
        if self.restarts is not None:
            out["restarts"] = self.restarts
        return out


@dataclass(frozen=True)
class ReplayState:
    """What a replay policy sees at the start of a tick."""

    tick: int
    tick_hours: float
    elapsed_hours: float
    done_hours: float
    remaining_work_hours: float
    hours_to_deadline: float
    market: str | None  # held when the tick starts; None when idle or just preempted
    spot_available: bool
    preemptions: int
    waited_hours: float  # since the job last ran on spot (or since it started)
    restart_left_hours: float = 0.0  # of the held market's current start
    spot_up_hours: float = math.inf  # spot available without a break before this tick


# A policy maps the state to the market for the tick: "spot", "on_demand" or None (wait).
# Asking for spot while it is unavailable means waiting.
ReplayPolicy = Callable[[ReplayState], "str | None"]


@dataclass(frozen=True)
class Grid:
    """The integer accounting of one replay: units per tick, overhead, work and deadline."""

    tick_hours: float
    units_per_tick: int
    overhead_units: int
    work_units: int
    deadline_ticks: float

    @classmethod
    def of(cls, gap_seconds: float, job: ReplayJob) -> Grid:
        """Pick the unit so the overhead is a whole number of units, then round work to it."""
        tick_hours = gap_seconds / 3600.0
        ratio = Fraction(job.restart_overhead_hours / tick_hours).limit_denominator(
            MAX_UNITS_PER_TICK
        )
        q = ratio.denominator
        return cls(
            tick_hours=tick_hours,
            units_per_tick=q,
            overhead_units=round(job.restart_overhead_hours / tick_hours * q),
            work_units=round(job.task_hours / tick_hours * q),
            deadline_ticks=job.deadline_hours / tick_hours,
        )

    @property
    def unit_hours(self) -> float:
        """Hours per unit of progress."""
        return self.tick_hours / self.units_per_tick


def _spot_prices(n_ticks: int, job: ReplayJob, prices: np.ndarray | None) -> np.ndarray:
    """Spot price per tick: the trace's where it has them, the job's flat price elsewhere."""
    out = np.full(n_ticks, job.spot_price)
    if prices is not None:
        out[: min(n_ticks, prices.size)] = prices[:n_ticks]
    return out


def _availability(unavailable: np.ndarray, n_ticks: int) -> np.ndarray:
    avail = np.zeros(n_ticks, dtype=bool)
    m = min(n_ticks, unavailable.size)
    avail[:m] = ~np.asarray(unavailable[:m], dtype=bool)
    return avail


WAITING = "waiting"


@dataclass
class ReplayLog:
    """What a replay did, tick by tick: the market of every tick until the finish (``spot``,
    ``on_demand`` or ``waiting``) and the ticks at whose start the job lost spot."""

    states: list[str] = field(default_factory=list)
    preempted_at: list[int] = field(default_factory=list)

    def segments(self, tick_hours: float) -> list[dict[str, object]]:
        """Runs of one state: ``[{"state", "start_hours", "end_hours"}, ...]``."""
        out: list[dict[str, object]] = []
        for tick, state in enumerate(self.states):
            if out and out[-1]["state"] == state:
                out[-1]["end_hours"] = round((tick + 1) * tick_hours, 6)
            else:
                out.append(
                    {
                        "state": state,
                        "start_hours": round(tick * tick_hours, 6),
                        "end_hours": round((tick + 1) * tick_hours, 6),
                    }
                )
        return out


def replay(
    unavailable: np.ndarray,
    gap_seconds: float,
    job: ReplayJob,
    policy: ReplayPolicy,
    spot_prices: np.ndarray | None = None,
    log: ReplayLog | None = None,
) -> ReplayOutcome:
    """Run ``policy`` over the trace tick by tick and return what it realised; when ``log`` is
    given, what it did in every tick is written to it."""
    grid = Grid.of(gap_seconds, job)
    q, r, w = grid.units_per_tick, grid.overhead_units, grid.work_units
    g = grid.tick_hours
    # Enough ticks for any plan that finishes at all: the trace, or the deadline, then a full
    # on-demand run.
    horizon = max(unavailable.size, math.ceil(grid.deadline_ticks)) + math.ceil((r + w) / q) + 2
    avail = _availability(unavailable, horizon)
    cs = _spot_prices(horizon, job, spot_prices)

    t = p = o = 0
    market: str | None = None
    cost = spot_hours = od_hours = 0.0
    preemptions = restarts = 0
    waited_since = 0
    up_since = 0  # first tick of the current run of available ticks
    finish: float | None = None if w > 0 else 0.0
    while finish is None and t < horizon:
        if not avail[t] or (t > 0 and not avail[t - 1]):
            up_since = t
        if market == MARKET_SPOT and not avail[t]:
            preemptions += 1
            market = None
            waited_since = t
            if log is not None:
                log.preempted_at.append(t)
        state = ReplayState(
            tick=t,
            tick_hours=g,
            elapsed_hours=t * g,
            done_hours=p * grid.unit_hours,
            remaining_work_hours=(w - p) * grid.unit_hours,
            hours_to_deadline=job.deadline_hours - t * g,
            market=market,
            spot_available=bool(avail[t]),
            preemptions=preemptions,
            waited_hours=(t - waited_since) * g,
            restart_left_hours=o * grid.unit_hours if market is not None else 0.0,
            spot_up_hours=(t - up_since) * g if avail[t] else 0.0,
        )
        choice = policy(state)
        if choice == MARKET_SPOT and not avail[t]:
            choice = None
        if choice is None:
            if market == MARKET_SPOT:
                waited_since = t
            market = None
            if log is not None:
                log.states.append(WAITING)
            t += 1
            continue
        if log is not None:
            log.states.append(choice)
        if choice != market:
            o = r
            restarts += 1
            market = choice
        price = cs[t] if market == MARKET_SPOT else job.on_demand_price
        need = o + (w - p)
        used = min(q, need) / q
        cost += price * g * used
        if market == MARKET_SPOT:
            spot_hours += g * used
            waited_since = t + 1
        else:
            od_hours += g * used
        if need <= q:
            finish = (t + used) * g
            break
        p += max(0, q - o)
        o = max(0, o - q)
        t += 1
    return ReplayOutcome(
        cost=float(cost),
        finish_hours=finish,
        deadline_met=finish is not None and finish <= job.deadline_hours + 1e-9,
        preemptions=preemptions,
        spot_hours=spot_hours,
        on_demand_hours=od_hours,
        restarts=restarts,
    )


def on_demand_policy(state: ReplayState) -> str | None:
    """Always on-demand."""
    return MARKET_ON_DEMAND


def spot_only_policy(state: ReplayState) -> str | None:
    """Always spot, waiting whenever it is unavailable (no deadline guard)."""
    return MARKET_SPOT


def make_greedy_policy(job: ReplayJob) -> ReplayPolicy:
    """Spot while the slack covers the remaining work plus a restart; then on-demand for good."""

    def greedy(state: ReplayState) -> str | None:
        code = deadline_action_scalar(
            state.remaining_work_hours,
            state.hours_to_deadline,
            0.0,
            job.restart_overhead_hours,
            CODE_OF_MARKET[state.market],
            state.spot_available,
            step_hours=state.tick_hours,
            safety_restarts=1.0,
            restart_left_hours=state.restart_left_hours,
        )
        return MARKET_ON_DEMAND if code == ON_DEMAND else MARKET_SPOT

    return greedy


def make_tolerance_policy(
    job: ReplayJob,
    tolerance: str,
    interruption_rate_per_hour: float,
    max_wait_hours: float | None = None,
    max_interruptions: int | None = None,
    decisions: list[MarketDecision] | None = None,
) -> ReplayPolicy:
    """The placement policy of ``tolerance`` (``costs.policies.decide_market``) as a replay policy.

    ``interruption_rate_per_hour`` is what the policy believes of the spot pool: production
    takes it from history, so callers should measure it on data before the replayed window.
    When ``decisions`` is a list, every decision is appended to it (for explanations and tests).
    """
    if tolerance not in TOLERANCES:
        raise ValueError(f"unknown policy {tolerance!r}; expected one of {', '.join(TOLERANCES)}")

    def policy(state: ReplayState) -> str | None:
        decision = decide_market(
            MarketSituation(
                tolerance=tolerance,
                remaining_work_hours=state.remaining_work_hours,
                spot_available=state.spot_available,
                spot_price_per_hour=job.spot_price,
                on_demand_price_per_hour=job.on_demand_price,
                interruption_rate_per_hour=interruption_rate_per_hour,
                current_market=state.market,
                restart_overhead_hours=job.restart_overhead_hours,
                hours_to_deadline=state.hours_to_deadline,
                total_work_hours=job.task_hours,
                total_hours_to_deadline=job.deadline_hours,
                interruptions=state.preemptions,
                max_interruptions=max_interruptions,
                waited_for_spot_hours=state.waited_hours,
                max_wait_hours=max_wait_hours,
                decision_step_hours=state.tick_hours,
                restart_left_hours=state.restart_left_hours,
                spot_available_hours=state.spot_up_hours,
            )
        )
        if decisions is not None:
            decisions.append(decision)
        return None if decision.wait else decision.market

    return policy


def _shift(values: np.ndarray, by: int, fill: float) -> np.ndarray:
    """``values`` moved ``by`` units of progress up; what falls off the end is dropped."""
    out = np.full_like(values, fill)
    if by < values.size:
        out[by:] = values[: values.size - by]
    return out


@dataclass
class _Best:
    cost: float = math.inf
    finish_ticks: float = math.inf
    preemptions: int = 0

    def offer(self, cost: np.ndarray, finish: np.ndarray, count: np.ndarray, limit: float) -> None:
        """Keep the cheapest finish by the deadline; ties go to the earlier, then calmer one."""
        ok = np.isfinite(cost) & (finish <= limit + 1e-9)
        if not ok.any():
            return
        cost, finish, count = cost[ok], finish[ok], count[ok]
        order = np.lexsort((count, finish, np.round(cost, 9)))
        i = order[0]
        key = (round(float(cost[i]), 9), float(finish[i]), int(count[i]))
        if key < (round(self.cost, 9), self.finish_ticks, self.preemptions):
            self.cost, self.finish_ticks, self.preemptions = float(cost[i]), key[1], key[2]


def _min_with_counts(
    a: np.ndarray, ca: np.ndarray, b: np.ndarray, cb: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore"):  # inf - inf: both unreachable, keep a
        take_b = (b < a - 1e-9) | ((np.abs(b - a) <= 1e-9) & (cb < ca))
    return np.where(take_b, b, a), np.where(take_b, cb, ca)


def optimal_outcome(
    unavailable: np.ndarray,
    gap_seconds: float,
    job: ReplayJob,
    spot_prices: np.ndarray | None = None,
) -> ReplayOutcome:
    """The omniscient optimum: the cheapest plan that meets the deadline, knowing the trace.

    Forward dynamic programme over ticks. A state is indexed by the slack spent so far,
    ``s = elapsed units - progress units``: running keeps ``s``, a tick of waiting adds a tick, a
    start adds the overhead; a job that has spent more than the deadline's slack cannot make it,
    so the arrays are only as long as the slack, not the work. For every ``s`` the programme keeps
    the cheapest way to stand at the tick boundary idle, holding spot, or holding on-demand. A
    start is one move over the ticks its overhead spans (a start abandoned inside its overhead
    only costs, so it is never part of an optimum). Ties go to the earlier finish, then to fewer
    preemptions. When no plan meets the deadline the on-demand plan is returned.
    """
    grid = Grid.of(gap_seconds, job)
    q, r, w = grid.units_per_tick, grid.overhead_units, grid.work_units
    g = grid.tick_hours
    if w == 0:
        return ReplayOutcome(cost=0.0, finish_hours=0.0, deadline_met=True, preemptions=0)
    slack_units = math.floor(grid.deadline_ticks * q - w + 1e-9)
    if slack_units < 0:
        return replay(unavailable, gap_seconds, job, on_demand_policy, spot_prices)
    n_ticks = math.ceil(grid.deadline_ticks - 1e-9)
    k = max(1, math.ceil(r / q))
    span = n_ticks + k + 1
    avail = _availability(unavailable, span)
    cs = _spot_prices(span, job, spot_prices) * g
    co = np.full(span, job.on_demand_price * g)
    # Ticks t..t+k-1 all available: a spot start at t survives its overhead.
    run = np.convolve(avail.astype(int), np.ones(k, dtype=int))[k - 1 :][:span]
    spot_start_ok = run >= k
    # Consecutive available ticks from each tick on (0 where spot is away).
    avail_run = np.zeros(span + 1, dtype=np.int64)
    for i in range(span - 1, -1, -1):
        avail_run[i] = avail_run[i + 1] + 1 if avail[i] else 0
    cum_s = np.concatenate(([0.0], np.cumsum(cs)))
    cum_o = np.concatenate(([0.0], np.cumsum(co)))

    size = slack_units + 1
    spent = np.arange(size)
    inf = math.inf
    idle = np.full(size, inf)
    idle[0] = 0.0
    spot = np.full(size, inf)
    ond = np.full(size, inf)
    zeros = np.zeros(size, dtype=np.int64)
    c_idle, c_spot, c_ond = zeros, zeros, zeros
    arrivals: dict[int, tuple[np.ndarray, ...]] = {}
    best = _Best()

    for t in range(n_ticks):
        if t in arrivals:
            a_s, a_o, a_c = arrivals.pop(t)
            spot, c_spot = _min_with_counts(spot, c_spot, a_s, a_c)
            ond, c_ond = _min_with_counts(ond, c_ond, a_o, a_c)
        need = w - (t * q - spent)  # units of work still to do at each slack level
        done = need <= 0  # finished earlier; offered then
        idle = np.where(done, inf, idle)
        spot = np.where(done, inf, spot)
        ond = np.where(done, inf, ond)
        pool, c_pool = _min_with_counts(idle, c_idle, ond, c_ond)
        pool, c_pool = _min_with_counts(pool, c_pool, spot, c_spot + (0 if avail[t] else 1))

        # Finishing inside this tick while continuing on a market.
        tail = need <= q
        if tail.any():
            frac = need[tail] / q
            if avail[t]:
                best.offer(spot[tail] + cs[t] * frac, t + frac, c_spot[tail], grid.deadline_ticks)
            best.offer(ond[tail] + co[t] * frac, t + frac, c_ond[tail], grid.deadline_ticks)
        # Finishing inside a fresh start (overhead + the rest of the work).
        short = need + r <= k * q
        if short.any():
            used = need[short] + r
            full = used // q
            part = (used % q) / q
            fin = t + used / q
            od_cost = pool[short] + (cum_o[t + full] - cum_o[t]) + co[t + full] * part
            best.offer(od_cost, fin, c_pool[short], grid.deadline_ticks)
            ticks_used = -(-used // q)
            sp_ok = ticks_used <= avail_run[t]
            if sp_ok.any():
                sp_cost = pool[short] + (cum_s[t + full] - cum_s[t]) + cs[t + full] * part
                best.offer(sp_cost[sp_ok], fin[sp_ok], c_pool[short][sp_ok], grid.deadline_ticks)

        # Moves to the next boundaries: running keeps the slack spent, waiting spends a tick.
        new_spot = spot + cs[t] if avail[t] else np.full(size, inf)
        new_ond = ond + co[t]
        arrive = t + k
        if arrive < n_ticks:
            started, c_started = _shift(pool, r, inf), _shift(c_pool, r, 0)
            s_arr = started + (cum_s[arrive] - cum_s[t]) if spot_start_ok[t] else np.full(size, inf)
            o_arr = started + (cum_o[arrive] - cum_o[t])
            if arrive == t + 1:
                new_spot, c_spot = _min_with_counts(new_spot, c_spot, s_arr, c_started)
                new_ond, c_ond = _min_with_counts(new_ond, c_ond, o_arr, c_started)
            else:
                arrivals[arrive] = (s_arr, o_arr, c_started)
        idle, c_idle = _shift(pool, q, inf), _shift(c_pool, q, 0)
        spot, ond = new_spot, new_ond

    if not math.isfinite(best.cost):
        return replay(unavailable, gap_seconds, job, on_demand_policy, spot_prices)
    return ReplayOutcome(
        cost=best.cost,
        finish_hours=best.finish_ticks * g,
        deadline_met=True,
        preemptions=best.preemptions,
    )


def brute_force_optimal(
    unavailable: np.ndarray,
    gap_seconds: float,
    job: ReplayJob,
    spot_prices: np.ndarray | None = None,
) -> ReplayOutcome | None:
    """Try every sequence of choices over the deadline's ticks (3 ** ticks: small traces only).

    Returns the cheapest outcome that meets the deadline, or None when none does.
    """
    grid = Grid.of(gap_seconds, job)
    n_ticks = math.ceil(grid.deadline_ticks - 1e-9)
    if n_ticks > 12:
        raise ValueError("brute force is for traces of at most 12 ticks")
    best: ReplayOutcome | None = None
    for plan in itertools.product((None, MARKET_SPOT, MARKET_ON_DEMAND), repeat=n_ticks):
        outcome = replay(unavailable, gap_seconds, job, _scripted(plan), spot_prices)
        if not outcome.deadline_met:
            continue
        if best is None or (round(outcome.cost, 9), outcome.finish_hours) < (
            round(best.cost, 9),
            best.finish_hours,
        ):
            best = outcome
    return best


def _scripted(plan: Sequence[str | None]) -> ReplayPolicy:
    def follow(state: ReplayState) -> str | None:
        return plan[state.tick] if state.tick < len(plan) else None

    return follow


@dataclass(frozen=True)
class ReplayComparison:
    """A policy's replay next to the three references on the same trace."""

    policy: ReplayOutcome
    on_demand: ReplayOutcome
    greedy: ReplayOutcome
    optimal: ReplayOutcome

    def to_dict(self) -> dict[str, object]:
        """``{"policy": {...}, "on_demand": {...}, "greedy": {...}, "optimal": {...}}``."""
        return {
            "policy": self.policy.to_dict(),
            "on_demand": self.on_demand.to_dict(),
            "greedy": self.greedy.to_dict(),
            "optimal": self.optimal.to_dict(),
        }


def compare(
    unavailable: np.ndarray,
    gap_seconds: float,
    job: ReplayJob,
    policy: ReplayPolicy,
    spot_prices: np.ndarray | None = None,
) -> ReplayComparison:
    """Replay ``policy`` and the three references on one trace."""
    return ReplayComparison(
        policy=replay(unavailable, gap_seconds, job, policy, spot_prices),
        on_demand=replay(unavailable, gap_seconds, job, on_demand_policy, spot_prices),
        greedy=replay(unavailable, gap_seconds, job, make_greedy_policy(job), spot_prices),
        optimal=optimal_outcome(unavailable, gap_seconds, job, spot_prices),
    )


__all__ = [
    "DEFAULT_ON_DEMAND_PRICE",
    "DEFAULT_SPOT_PRICE",
    "Grid",
    "ReplayComparison",
    "ReplayJob",
    "ReplayLog",
    "ReplayOutcome",
    "ReplayPolicy",
    "ReplayState",
    "brute_force_optimal",
    "compare",
    "make_greedy_policy",
    "make_tolerance_policy",
    "on_demand_policy",
    "optimal_outcome",
    "replay",
    "spot_only_policy",
]

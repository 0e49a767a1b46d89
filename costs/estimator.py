"""Cost-benefit estimator: what a job will probably cost and take on spot versus on-demand.

DESIGN §7. Pure (numpy + stdlib, no Django); plain dataclasses in and out.

Call ``estimate(EstimateInput(...)) -> Estimate`` and serialise with ``Estimate.to_dict()``::

    {"spot": {...}, "on_demand": {...}, "recommendation": "spot" | "on_demand",
     "checkpoint_interval_s": 600, "reasons": ["...", ...]}

each side with ``expected_cost, expected_hours, p90_hours, expected_interruptions,
expected_lost_hours`` and a few more (``p90_cost``, ``deadline_met_probability``,
``expected_spot_hours``, ``expected_on_demand_hours``, ``price_per_hour``).

The model (docs/decisions/020-estimator-model.md):

- On-demand: one start (``restart_hours``), then the work; no interruptions.
- Spot: spot capacity alternates between available spells (mean ``1 / interruption rate``) and
  outages (mean ``mean_outage_hours``; 0 when another pool takes the job at once), each spell
  length drawn from a distribution with the given mean and coefficient of variation (gamma for
  cv <= 1, two-phase hyperexponential above: the shared traces measure cv 1.3 to 2.6). Every start
  costs ``restart_hours`` = migration overhead + restore time, billed without progress. An
  interruption loses nothing when the emergency checkpoint fits in the notice, otherwise the work
  since the last periodic checkpoint (uniform over the interval). Periodic checkpoints slow spot
  work by ``save / (interval + save)``. With a deadline the job follows the deadline rule of
  ``costs.market`` (the one placement applies), so the spot side includes the on-demand time the
  rule buys; without one it waits for spot (up to ``max_wait_hours``, then on-demand until spot
  is back).
- The spot side is a seeded, vectorised Monte Carlo over ``samples`` jobs, event by event (no time
  grid), so one estimate of a two-day job takes a few tens of milliseconds.
- The checkpoint interval is Young/Daly's for the save time and the mean time between
  interruptions, clamped to [60 s, 6 h].

``expected_cost_to_finish`` is the closed form the balanced policy uses on every decision (no
deadline, exponential spells; the Monte Carlo agrees with it there, a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from costs.market import (
    MARKET_ON_DEMAND,
    MARKET_SPOT,
    ON_DEMAND,
    SAFETY_RESTARTS,
    SPOT,
    WAIT,
    deadline_action,
    planned_rate,
    return_after_hours,
)

# Snapshot written to the instance's local disk; the upload to the store runs in the
# background (DESIGN §5), so only the local write delays training: NVMe-class, 1 GB/s.
DEFAULT_SAVE_GB_PER_S = 1.0
# A restore downloads from the regional store to a fresh instance: single-stream object
# storage reads of ~200 MB/s.
DEFAULT_RESTORE_GB_PER_S = 0.2
# Provisioning, replica, start and validation of a migration before the job runs again, when
# no measurement of past migrations is at hand (the portal passes the measured mean).
DEFAULT_MIGRATION_OVERHEAD_HOURS = 0.1
# AWS's two-minute spot interruption notice.
DEFAULT_NOTICE_SECONDS = 120.0
DEFAULT_SAMPLES = 1000
MIN_CHECKPOINT_INTERVAL_S = 60.0
MAX_CHECKPOINT_INTERVAL_S = 6 * 3600.0
# Candidate intervals the recommendation and the page's cost curve are evaluated on: 64 per
# decade-and-a-bit between the bounds, so neighbours differ by under 10%.
INTERVAL_GRID_POINTS = 64
# Share of interruptions whose emergency checkpoint does not make it although it fits the
# notice (the instance goes early, the save fails), before Baton has measured its own: the
# portal passes the share of final notices that ended in `checkpoint_missed`.
DEFAULT_EMERGENCY_MISS_SHARE = 0.05
# Bounds on what one estimate may be asked (issue: bounded work per request). A year of work;
# a job and its deadline within two years; a 10 TB checkpoint; at most this many simulated
# interruptions per sample (about a second of Monte Carlo).
MAX_WORK_HOURS = 8760.0
MAX_DEADLINE_HOURS = 2 * 8760.0
MAX_CHECKPOINT_GB = 10_000.0
MAX_SIMULATED_INTERRUPTIONS = 2500.0
MAX_SAMPLES = 5000
# Below this chance of meeting the deadline on spot the estimator recommends on-demand.
DEADLINE_CONFIDENCE = 0.95
# Guard against a pathological input looping for ever (each sample moves one event per round).
MAX_EVENT_ROUNDS = 20_000
# Spot that needs more than this many held hours per hour of work (exp(rate x restart) in the
# closed form) is hopeless: the estimate says it would not finish instead of simulating it.
HOPELESS_OVERHEAD_FACTOR = 50.0
# Spells longer than this (hours) are as good as endless; keeps sums of draws finite.
ENDLESS_HOURS = 1e9


class EstimateRefused(ValueError):
    """An input the estimator will not take, with the field it concerns (for a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class EstimateInput:
    """A job and the pools it would use, as the estimator needs them.

    Prices are for the whole job per hour (instances x price per instance-hour, a substitute's
    price when placement would use one). ``interruption_rate_per_hour`` is interruptions per hour
    of spot held, from the pools' history; ``mean_outage_hours`` how long spot stays unavailable
    after an interruption (0: another candidate pool takes the job at once); ``outage_pools``
    how many candidate pools' history it was measured on (0: the judged pool's alone): the wait
    after an interruption while every candidate pool is away, none while another has spot.
    """

    work_hours: float
    spot_price_per_hour: float
    on_demand_price_per_hour: float
    interruption_rate_per_hour: float
    checkpoint_gb: float = 0.0
    migration_overhead_hours: float = DEFAULT_MIGRATION_OVERHEAD_HOURS
    deadline_hours: float | None = None
    max_wait_hours: float | None = None
    mean_outage_hours: float = 0.0
    uptime_cv: float = 1.0
    outage_cv: float = 1.0
    spot_available_now: bool | None = None
    emergency_miss_share: float = DEFAULT_EMERGENCY_MISS_SHARE
    interruption_rate_source: str = "given"
    interruption_rate_borrowed_from: tuple[str, ...] = ()
    history_hours: float = 0.0
    outage_pools: int = 0
    market_time_scale: float = 1.0
    notice_seconds: float = DEFAULT_NOTICE_SECONDS
    save_gb_per_s: float = DEFAULT_SAVE_GB_PER_S
    restore_gb_per_s: float = DEFAULT_RESTORE_GB_PER_S
    safety_restarts: float = SAFETY_RESTARTS
    samples: int = DEFAULT_SAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "work_hours",
            "spot_price_per_hour",
            "on_demand_price_per_hour",
            "interruption_rate_per_hour",
            "checkpoint_gb",
            "migration_overhead_hours",
            "mean_outage_hours",
            "notice_seconds",
        ):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise EstimateRefused(name, f"must be a finite number >= 0, not {value!r}")
        if self.work_hours > MAX_WORK_HOURS:
            raise EstimateRefused(
                "work_hours", f"at most {MAX_WORK_HOURS:g} hours can be estimated at once"
            )
        if self.checkpoint_gb > MAX_CHECKPOINT_GB:
            raise EstimateRefused("checkpoint_gb", f"at most {MAX_CHECKPOINT_GB:g} GB")
        if self.deadline_hours is not None and not (0 < self.deadline_hours <= MAX_DEADLINE_HOURS):
            raise EstimateRefused(
                "deadline_hours", f"must be positive and at most {MAX_DEADLINE_HOURS:g} hours"
            )
        if self.max_wait_hours is not None and not self.max_wait_hours >= 0:
            raise EstimateRefused("max_wait_hours", "must not be negative")
        if not 0.0 <= self.emergency_miss_share <= 1.0:
            raise EstimateRefused("emergency_miss_share", "must be between 0 and 1")
        if self.save_gb_per_s <= 0 or self.restore_gb_per_s <= 0:
            raise ValueError("bandwidths must be positive")
        if self.uptime_cv <= 0 or self.outage_cv <= 0:
            raise ValueError("coefficients of variation must be positive")
        if not 10 <= self.samples <= MAX_SAMPLES:
            raise EstimateRefused("samples", f"must be between 10 and {MAX_SAMPLES}")
        # Every interruption is an event of the Monte Carlo: refuse what would run for long.
        expected = self.interruption_rate_per_hour * (self.work_hours + self.restart_hours)
        if expected > MAX_SIMULATED_INTERRUPTIONS:
            raise EstimateRefused(
                "work_hours",
                f"about {expected:,.0f} interruptions to simulate at "
                f"{self.interruption_rate_per_hour:g} per hour, more than "
                f"{MAX_SIMULATED_INTERRUPTIONS:,.0f}: estimate a shorter stretch of the work",
            )

    @property
    def save_seconds(self) -> float:
        """Time to write one checkpoint to local disk."""
        return self.checkpoint_gb / self.save_gb_per_s

    @property
    def restore_seconds(self) -> float:
        """Time to bring a checkpoint from the store onto a fresh instance."""
        return self.checkpoint_gb / self.restore_gb_per_s

    @property
    def restart_hours(self) -> float:
        """Billed time without progress at every start: migration overhead plus restore."""
        return self.migration_overhead_hours + self.restore_seconds / 3600.0

    @property
    def emergency_checkpoint_fits(self) -> bool:
        """Whether an emergency checkpoint fits in the interruption notice."""
        return self.save_seconds <= self.notice_seconds

    @property
    def loss_share(self) -> float:
        """Share of interruptions that lose the work since the last periodic checkpoint: all
        when the emergency checkpoint does not fit the notice, else the ones where it misses."""
        return self.emergency_miss_share if self.emergency_checkpoint_fits else 1.0


@dataclass(frozen=True)
class MarketEstimate:
    """The outlook of one market. Hours and costs are None when the job would never finish."""

    market: str
    price_per_hour: float
    expected_cost: float | None
    p90_cost: float | None
    expected_hours: float | None
    p90_hours: float | None
    expected_interruptions: float
    expected_lost_hours: float
    expected_spot_hours: float
    expected_on_demand_hours: float
    deadline_met_probability: float | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON types, rounded for display."""
        out: dict[str, object] = {}
        for key, value in asdict(self).items():
            out[key] = round(value, 4) if isinstance(value, float) else value
        return out


@dataclass(frozen=True)
class Estimate:
    """Both outlooks, the recommendation and why (DESIGN §9 ``POST /api/estimates/``)."""

    spot: MarketEstimate
    on_demand: MarketEstimate
    recommendation: str
    checkpoint_interval_s: float
    reasons: list[str] = field(default_factory=list)
    interruption_rate_per_hour: float = 0.0
    interruption_rate_source: str = "given"
    interruption_rate_borrowed_from: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """``{"spot", "on_demand", "recommendation", "checkpoint_interval_s", "reasons"}`` and
        where the interruption rate comes from (``interruption_rate_source``: ``history``,
        ``borrowed`` with ``interruption_rate_borrowed_from``, ``default`` or ``given``)."""
        return {
            "spot": self.spot.to_dict(),
            "on_demand": self.on_demand.to_dict(),
            "recommendation": self.recommendation,
            "checkpoint_interval_s": round(self.checkpoint_interval_s),
            "reasons": list(self.reasons),
            "interruption_rate_per_hour": round(self.interruption_rate_per_hour, 4),
            "interruption_rate_source": self.interruption_rate_source,
            "interruption_rate_borrowed_from": list(self.interruption_rate_borrowed_from),
        }


def young_daly_interval_seconds(save_seconds: float, mtbi_seconds: float) -> float:
    """Daly's (2006) optimum checkpoint interval, clamped to [60 s, 6 h].

    ``sqrt(2 d M) * (1 + sqrt(d / 2M) / 3 + d / 18M) - d`` for a save time ``d`` below twice the
    mean time between interruptions ``M``, else ``M`` (checkpointing more often than failures
    arrive gains nothing).
    """
    if not math.isfinite(mtbi_seconds):
        return MAX_CHECKPOINT_INTERVAL_S
    d, m = save_seconds, mtbi_seconds
    if d >= 2 * m:
        tau = m
    else:
        tau = math.sqrt(2 * d * m) * (1 + math.sqrt(d / (2 * m)) / 3 + d / (18 * m)) - d
    return min(MAX_CHECKPOINT_INTERVAL_S, max(MIN_CHECKPOINT_INTERVAL_S, tau))


def interval_grid_seconds() -> np.ndarray:
    """The candidate checkpoint intervals, 60 s to 6 h on a log scale."""
    return np.geomspace(MIN_CHECKPOINT_INTERVAL_S, MAX_CHECKPOINT_INTERVAL_S, INTERVAL_GRID_POINTS)


def spot_cost_curve(inp: EstimateInput, intervals_s: np.ndarray) -> np.ndarray:
    """Expected spot cost of the job for each checkpoint interval, in closed form (spells
    exponential, no deadline: ``expected_spot_held_hours``); inf where it would never finish.

    Longer intervals spend less time saving and lose more work at each interruption whose
    emergency checkpoint does not make it. This is the curve the costs page draws and the
    recommended interval is its lowest point.
    """
    out = np.empty(intervals_s.size)
    for i, interval in enumerate(intervals_s):
        out[i] = inp.spot_price_per_hour * expected_spot_held_hours(
            inp.work_hours,
            inp.interruption_rate_per_hour,
            inp.restart_hours,
            lost_hours_per_interruption=_lost_per_interruption_hours(inp, float(interval)),
            spot_work_rate=_spot_work_rate(inp, float(interval)),
        )
    return out


def checkpoint_interval_seconds(inp: EstimateInput) -> float:
    """The recommended periodic checkpoint interval: the lowest point of ``spot_cost_curve``
    on the grid (the longest interval among equals: fewer saves for the same cost)."""
    grid = interval_grid_seconds()
    curve = spot_cost_curve(inp, grid)
    if not np.isfinite(curve).any():
        return young_daly_interval_seconds(inp.save_seconds, _mtbi_seconds(inp))
    best = np.flatnonzero(curve <= np.nanmin(curve) * (1 + 1e-12))
    return float(grid[best[-1]])


def _mtbi_seconds(inp: EstimateInput) -> float:
    rate = inp.interruption_rate_per_hour
    return 3600.0 / rate if rate > 0 else math.inf


def _spot_work_rate(inp: EstimateInput, interval_s: float) -> float:
    """Share of spot time that is training, the rest writing periodic checkpoints."""
    return interval_s / (interval_s + inp.save_seconds)


def _lost_per_interruption_hours(inp: EstimateInput, interval_s: float) -> float:
    """Mean work lost per interruption: half an interval for those that lose work."""
    return inp.loss_share * interval_s / 2 / 3600.0


def expected_spot_held_hours(
    remaining_work_hours: float,
    interruption_rate_per_hour: float,
    restart_hours: float,
    on_spot_now: bool = False,
    lost_hours_per_interruption: float = 0.0,
    spot_work_rate: float = 1.0,
) -> float:
    """Expected hours of spot held (and billed) to finish, for exponential spells, in closed form.

    Getting through a start's overhead ``R`` takes ``g = (exp(rate * R) - 1) / rate`` in
    expectation (a run shorter than ``R`` is billed and wasted); during ``w`` hours of work
    ``rate * w`` interruptions each need another ``g``. So ``H = w * exp(rate * R) + g`` (without
    the first ``g`` for a job already running on spot), with ``w`` the work stretched by the
    checkpoint share and by the work lost per interruption. Infinite when interruptions come
    faster than the lost work can be redone.
    """
    rate = interruption_rate_per_hour
    work = remaining_work_hours / spot_work_rate
    if rate <= 0:
        return work + (0.0 if on_spot_now else restart_hours)
    if rate * lost_hours_per_interruption >= 1.0:
        return math.inf
    work /= 1.0 - rate * lost_hours_per_interruption
    growth = math.exp(min(rate * restart_hours, 700.0))
    first = 0.0 if on_spot_now else (growth - 1.0) / rate
    return work * growth + first


def expected_cost_to_finish(
    remaining_work_hours: float,
    spot_price_per_hour: float,
    on_demand_price_per_hour: float,
    interruption_rate_per_hour: float,
    restart_hours: float,
    current_market: str | None = None,
    lost_hours_per_interruption: float = 0.0,
    spot_work_rate: float = 1.0,
) -> tuple[float, float]:
    """(spot, on-demand) expected cost to finish from here, in closed form.

    Spot: the price times ``expected_spot_held_hours`` (no deadline, exponential spells; waiting
    for spot is free). On-demand: the price times the work plus one restart, none when the job
    already runs there. The balanced policy compares the two on every decision.
    """
    held = expected_spot_held_hours(
        remaining_work_hours,
        interruption_rate_per_hour,
        restart_hours,
        current_market == MARKET_SPOT,
        lost_hours_per_interruption,
        spot_work_rate,
    )
    first_od = 0.0 if current_market == MARKET_ON_DEMAND else restart_hours
    return spot_price_per_hour * held, on_demand_price_per_hour * (remaining_work_hours + first_od)


def _draw_spells(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    """``n`` spell lengths with the given mean and coefficient of variation."""
    if mean <= 0:
        return np.zeros(n)
    if mean >= ENDLESS_HOURS:
        return np.full(n, math.inf)
    if cv <= 1.0:
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, mean / shape, n)
    # Two-phase hyperexponential with balanced means: the usual fit for cv > 1.
    c2 = cv * cv
    p1 = 0.5 * (1.0 + math.sqrt((c2 - 1.0) / (c2 + 1.0)))
    means = np.where(rng.random(n) < p1, mean / (2 * p1), mean / (2 * (1 - p1)))
    return rng.exponential(1.0, n) * means


def _residual_spells(rng: np.random.Generator, mean: float, cv: float, n: int) -> np.ndarray:
    """What is left of the spell under way at a random moment (length-biased, then uniform)."""
    if mean <= 0 or mean >= ENDLESS_HOURS:
        return _draw_spells(rng, mean, cv, n)
    pool = _draw_spells(rng, mean, cv, 8 * n)
    picked = rng.choice(pool, size=n, p=pool / pool.sum())
    return picked * rng.random(n)


class _SpellSource:
    """Spell lengths drawn a block at a time: one draw per round per sample would dominate."""

    def __init__(self, rng: np.random.Generator, mean: float, cv: float, n: int) -> None:
        self._rng, self._mean, self._cv, self._n = rng, mean, cv, n
        self._block = np.empty(0)
        self._at = 0

    def take(self) -> np.ndarray:
        """``n`` fresh spell lengths."""
        if self._at + self._n > self._block.size:
            self._block = _draw_spells(self._rng, self._mean, self._cv, 16 * self._n)
            self._at = 0
        out = self._block[self._at : self._at + self._n]
        self._at += self._n
        return out


@dataclass
class _Runs:
    cost: np.ndarray
    hours: np.ndarray
    interruptions: np.ndarray
    lost: np.ndarray
    spot_hours: np.ndarray
    od_hours: np.ndarray


def _simulate_spot(inp: EstimateInput, interval_s: float) -> _Runs:
    """Monte Carlo of the job on spot under Baton's rules, ``inp.samples`` jobs at once."""
    rng = np.random.default_rng(inp.seed)
    n = inp.samples
    rate = inp.interruption_rate_per_hour
    mean_up = 1.0 / rate if rate > 1.0 / ENDLESS_HOURS else math.inf
    mean_down = inp.mean_outage_hours
    restart = inp.restart_hours
    kappa = _spot_work_rate(inp, interval_s)
    interval_h = interval_s / 3600.0
    loss_share = inp.loss_share
    deadline = inp.deadline_hours
    rho = planned_rate(inp.work_hours, deadline)
    max_wait = math.inf if inp.max_wait_hours is None else inp.max_wait_hours

    if inp.spot_available_now is None:
        # Spells that never end (a rate too small to tell from none) leave no share of the
        # clock to outages: inf / (inf + down) would be NaN, and every job would start down.
        endless = math.isinf(mean_up)
        share_up = 1.0 if mean_down == 0 or endless else mean_up / (mean_up + mean_down)
        up = rng.random(n) < share_up
    else:
        up = np.full(n, bool(inp.spot_available_now))
    spell_end = np.where(
        up,
        _residual_spells(rng, mean_up, inp.uptime_cv, n),
        _residual_spells(rng, mean_down, inp.outage_cv, n),
    )
    ups = _SpellSource(rng, mean_up, inp.uptime_cv, n)
    downs = _SpellSource(rng, mean_down, inp.outage_cv, n)
    t = np.zeros(n)
    rem = np.full(n, float(inp.work_hours))
    market = np.full(n, WAIT)
    over = np.zeros(n)
    run_work = np.zeros(n)
    wait_since = np.zeros(n)
    # When the current spell of available spot began (-inf: before the start, long enough).
    up_since = np.full(n, -math.inf)
    cost = np.zeros(n)
    spot_hours = np.zeros(n)
    od_hours = np.zeros(n)
    interruptions = np.zeros(n)
    lost = np.zeros(n)
    finish = np.full(n, math.inf)
    active = rem > 0
    finish[~active] = 0.0
    prices = np.array([0.0, inp.spot_price_per_hour, inp.on_demand_price_per_hour])
    work_rates = np.array([0.0, kappa, 1.0])
    nudge = 1e-7  # step just past a threshold so the rule sees it crossed

    for _ in range(MAX_EVENT_ROUNDS):
        if not active.any():
            break
        if deadline is not None:
            action = deadline_action(
                rem,
                deadline - t,
                rho,
                restart,
                market,
                up,
                safety_restarts=inp.safety_restarts,
                spot_up_hours=t - up_since,
            )
        else:
            fallback = (market == ON_DEMAND) | (t - wait_since >= max_wait)
            action = np.where(up, SPOT, np.where(fallback, ON_DEMAND, WAIT))
        action = np.where(active, action, market)
        start = (action != market) & (action != WAIT)
        over = np.where(start, restart, over)
        run_work = np.where(start, 0.0, run_work)
        market = action
        running = market != WAIT
        work_rate = work_rates[market]

        with np.errstate(divide="ignore", invalid="ignore"):
            to_finish = np.where(running, over + rem / np.where(running, work_rate, 1.0), math.inf)
        to_spell = spell_end - t
        to_rule = np.full(n, math.inf)
        idle = market == WAIT
        if deadline is not None:
            slack = deadline - t - rem - inp.safety_restarts * restart
            not_od = market != ON_DEMAND
            # Slack shrinks while idle or in a start's overhead, and by the checkpoint share on
            # spot: the moment it reaches the safety net is an event.
            after = over + (slack - over) / (1.0 - kappa) if kappa < 1.0 else np.full(n, math.inf)
            to_safety = np.where((market == SPOT) & (slack > over), after, slack)
            to_rule = np.where(not_od, np.maximum(to_safety, 0.0) + nudge, math.inf)
            if rho > 0:
                to_plan = deadline - rem / rho - t
                to_rule = np.where(
                    idle, np.minimum(to_rule, np.maximum(to_plan, 0.0) + nudge), to_rule
                )
                # A job on on-demand held back from a spell too recent: it returns when the
                # spell has lasted long enough or when it has caught up with its plan.
                if rho < 1.0:
                    to_held = up_since + return_after_hours(restart) - t
                    to_caught_up = over + (rem - rho * (deadline - t - over)) / (1.0 - rho)
                    held = (market == ON_DEMAND) & up & (to_held > 0) & (to_caught_up > 0)
                    to_release = np.minimum(to_held, to_caught_up) + nudge
                    to_rule = np.where(held, np.minimum(to_rule, to_release), to_rule)
        elif math.isfinite(max_wait):
            to_wait = wait_since + max_wait - t
            to_rule = np.where(idle, np.maximum(to_wait, 0.0) + nudge, math.inf)

        dt = np.minimum(np.minimum(to_finish, to_spell), to_rule)
        dt = np.where(active, np.maximum(dt, 0.0), 0.0)
        done = active & running & (to_finish <= dt)

        price = prices[market]
        cost += np.where(running, price * dt, 0.0)
        spot_hours += np.where(market == SPOT, dt, 0.0)
        od_hours += np.where(market == ON_DEMAND, dt, 0.0)
        progress = work_rate * np.maximum(dt - over, 0.0)
        over = np.maximum(over - dt, 0.0)
        rem = np.where(done, 0.0, rem - np.where(running, progress, 0.0))
        run_work += np.where(running, progress, 0.0)
        t = t + dt
        finish = np.where(done, t, finish)
        active &= ~done

        flip = active & (to_spell <= dt)
        if flip.any():
            going_down = flip & up
            preempted = going_down & (market == SPOT)
            if preempted.any():
                interruptions += preempted
                if loss_share > 0:
                    loses = rng.random(n) < loss_share
                    drawn = np.where(loses, rng.random(n) * interval_h, 0.0)
                    loss = np.minimum(drawn, run_work)
                else:
                    loss = np.zeros(n)
                rem = np.where(preempted, rem + loss, rem)
                lost += np.where(preempted, loss, 0.0)
                market = np.where(preempted, WAIT, market)
                wait_since = np.where(preempted, t, wait_since)
            fresh = np.where(up, downs.take(), ups.take())
            spell_end = np.where(flip, t + fresh, spell_end)
            up = up ^ flip
            up_since = np.where(flip & up, t, up_since)
            wait_since = np.where(flip & ~up & (market == WAIT), t, wait_since)

    return _Runs(cost, finish, interruptions, lost, spot_hours, od_hours)


def _hopeless(inp: EstimateInput, interval_s: float) -> bool:
    """Whether spot would need absurdly many held hours per hour of work."""
    loss = inp.restart_hours + _lost_per_interruption_hours(inp, interval_s)
    return inp.interruption_rate_per_hour * loss > math.log(HOPELESS_OVERHEAD_FACTOR)


def _never() -> _Runs:
    """Runs that never finish: what a hopeless spot outlook summarises to."""
    endless, nothing = np.full(10, math.inf), np.zeros(10)
    return _Runs(endless, endless, nothing, nothing, nothing, nothing)


def _summarise_spot(inp: EstimateInput, runs: _Runs) -> MarketEstimate:
    finished = np.isfinite(runs.hours)
    all_done = bool(finished.all())
    p90_done = finished.mean() >= 0.9
    met = None
    if inp.deadline_hours is not None:
        met = float(np.mean(runs.hours <= inp.deadline_hours + 1e-6))
    return MarketEstimate(
        market=MARKET_SPOT,
        price_per_hour=inp.spot_price_per_hour,
        expected_cost=float(runs.cost.mean()) if all_done else None,
        p90_cost=float(np.quantile(runs.cost, 0.9)) if p90_done else None,
        expected_hours=float(runs.hours.mean()) if all_done else None,
        p90_hours=float(np.quantile(runs.hours, 0.9)) if p90_done else None,
        expected_interruptions=float(runs.interruptions.mean()),
        expected_lost_hours=float(runs.lost.mean()),
        expected_spot_hours=float(runs.spot_hours.mean()),
        expected_on_demand_hours=float(runs.od_hours.mean()),
        deadline_met_probability=met,
    )


def _on_demand(inp: EstimateInput) -> MarketEstimate:
    hours = inp.work_hours + (inp.restart_hours if inp.work_hours > 0 else 0.0)
    cost = inp.on_demand_price_per_hour * hours
    met = None
    if inp.deadline_hours is not None:
        met = 1.0 if hours <= inp.deadline_hours + 1e-9 else 0.0
    return MarketEstimate(
        market=MARKET_ON_DEMAND,
        price_per_hour=inp.on_demand_price_per_hour,
        expected_cost=cost,
        p90_cost=cost,
        expected_hours=hours,
        p90_hours=hours,
        expected_interruptions=0.0,
        expected_lost_hours=0.0,
        expected_spot_hours=0.0,
        expected_on_demand_hours=hours,
        deadline_met_probability=met,
    )


def _money(value: float) -> str:
    return f"${value:,.2f}"


def _duration(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def _recommend(
    inp: EstimateInput, spot: MarketEstimate, od: MarketEstimate, interval_s: float
) -> tuple[str, list[str]]:
    reasons: list[str] = []
    if spot.expected_cost is None:
        reasons.append(
            "On spot the job would not finish: interruptions come faster than it can restart."
        )
        return MARKET_ON_DEMAND, reasons
    assert od.expected_cost is not None and od.expected_hours is not None
    if inp.deadline_hours is not None and od.expected_hours > inp.deadline_hours:
        reasons.append(
            f"Even on-demand needs {_duration(od.expected_hours)}, past the "
            f"{_duration(inp.deadline_hours)} deadline: on-demand is the fastest way."
        )
        return MARKET_ON_DEMAND, reasons

    saving = od.expected_cost - spot.expected_cost
    share = saving / od.expected_cost if od.expected_cost > 0 else 0.0
    reasons.append(_rate_reason(inp, spot))
    if inp.outage_pools > 1:
        wait = (
            f"it would have waited {_duration(inp.mean_outage_hours)} for spot on average"
            if inp.mean_outage_hours > 0
            else "another of them always had spot, so the estimate counts no wait for spot"
        )
        reasons.append(
            f"After an interruption the job can move to any of {inp.outage_pools} spot pools; "
            f"over their recent history {wait}."
        )
    if inp.market_time_scale != 1.0:
        reasons.append(
            f"The market simulator runs {inp.market_time_scale:g} times faster than the clock: "
            "interruptions and outages are counted per hour of the clock."
        )
    if not inp.emergency_checkpoint_fits:
        reasons.append(
            f"A {inp.checkpoint_gb:g} GB checkpoint takes {inp.save_seconds:.0f} s to save, more "
            f"than the {inp.notice_seconds:.0f} s notice: each interruption loses the work since "
            f"the last periodic checkpoint ({_duration(spot.expected_lost_hours)} in all)."
        )
    else:
        reasons.append(
            f"The emergency checkpoint ({inp.save_seconds:.0f} s) fits in the "
            f"{inp.notice_seconds:.0f} s notice; the {inp.emergency_miss_share:.0%} of "
            "interruptions where it misses lose the work since the last periodic checkpoint "
            f"({_duration(spot.expected_lost_hours)} in all)."
        )
    reasons.append(
        f"Checkpoint every {_duration(interval_s / 3600)}: the lowest point of the expected "
        f"spot cost against the interval ({inp.save_seconds:.0f} s per save against the work "
        "lost at an interruption)."
    )
    if inp.deadline_hours is not None and spot.expected_on_demand_hours > 0:
        reasons.append(
            f"To meet the {_duration(inp.deadline_hours)} deadline Baton expects to run "
            f"{_duration(spot.expected_on_demand_hours)} of it on on-demand when spot is away."
        )
    met = spot.deadline_met_probability
    if met is not None and met < DEADLINE_CONFIDENCE:
        reasons.append(
            f"On spot the deadline is met in only {met:.0%} of simulated runs: on-demand is safer."
        )
        return MARKET_ON_DEMAND, reasons
    if saving > 0:
        reasons.append(
            f"Spot is expected to cost {_money(spot.expected_cost)} against "
            f"{_money(od.expected_cost)} on-demand ({share:.0%} less)."
        )
        return MARKET_SPOT, reasons
    reasons.append(
        f"On-demand is expected to cost {_money(od.expected_cost)}, no more than spot's "
        f"{_money(spot.expected_cost)} once interruptions are counted."
    )
    return MARKET_ON_DEMAND, reasons


def _rate_reason(inp: EstimateInput, spot: MarketEstimate) -> str:
    """The interruption rate in words, and where it comes from."""
    rate = inp.interruption_rate_per_hour
    outlook = (
        f"expect {spot.expected_interruptions:.1f} interruptions, each costing a "
        f"{_duration(inp.restart_hours)} restart."
    )
    if inp.interruption_rate_source == "borrowed":
        return (
            f"This pool has no interruption history of its own: its rate, about {rate:.2f} per "
            f"hour held, is borrowed from {', '.join(inp.interruption_rate_borrowed_from)}; "
            + outlook
        )
    if inp.interruption_rate_source == "default":
        return (
            "Neither this pool nor any similar one has interruption history: Baton assumes its "
            f"default of {rate:.2f} interruptions per hour held, a guess, not a measurement; "
            + outlook
        )
    if rate <= 0:
        return "These spot pools have no recorded interruptions."
    measured = ""
    if inp.interruption_rate_source == "history" and inp.history_hours > 0:
        measured = f" (measured over {inp.history_hours:.0f} h of this pool's recent history)"
    elif inp.interruption_rate_source == "pool":
        measured = " (the rate set on this pool, not derived from history)"
    return (
        f"Spot here is interrupted about {rate:.2f} times per hour held (every "
        f"{_duration(1 / rate)}){measured}; " + outlook
    )


def _spot_runs(inp: EstimateInput, interval_s: float) -> _Runs:
    return _never() if _hopeless(inp, interval_s) else _simulate_spot(inp, interval_s)


def expected_spot_cost_at_interval(inp: EstimateInput, interval_s: float) -> float:
    """Expected spot cost when checkpointing every ``interval_s`` seconds (inf: never ends);
    what the cost-against-interval chart plots around the recommended interval."""
    cost = _summarise_spot(inp, _spot_runs(inp, interval_s)).expected_cost
    return math.inf if cost is None else cost


def spot_completion_hours(inp: EstimateInput) -> np.ndarray:
    """The simulated completion times on spot (inf for runs that never end), for charts."""
    return _spot_runs(inp, checkpoint_interval_seconds(inp)).hours


def estimate(inp: EstimateInput) -> Estimate:
    """Spot and on-demand outlooks for ``inp``, the recommendation and its reasons."""
    interval_s = checkpoint_interval_seconds(inp)
    runs = _spot_runs(inp, interval_s)
    spot = _summarise_spot(inp, runs)
    od = _on_demand(inp)
    recommendation, reasons = _recommend(inp, spot, od, interval_s)
    return Estimate(
        spot=spot,
        on_demand=od,
        recommendation=recommendation,
        checkpoint_interval_s=interval_s,
        reasons=reasons,
        interruption_rate_per_hour=inp.interruption_rate_per_hour,
        interruption_rate_source=inp.interruption_rate_source,
        interruption_rate_borrowed_from=inp.interruption_rate_borrowed_from,
    )

"""One tick of the market simulator (beat): preempt running spot instances as the simulated
market says, through the same two-level interrupt a staff member sends.

Off unless BATON_MARKET_TIME_SCALE is above 0, or staff switched it on from the fleet page
(`set_time_scale`, which overrides the setting until switched back); then each wall second is
that many simulated seconds. The last tick's wall time and the simulator's clock (the
simulated hours that traces are replayed on) live in Redis under the install's key prefix:
every worker sees the same market, a restart carries on where it stopped, and two installs
sharing a Redis keep apart.
The decision itself is `migration.simulator` (pure); see docs/decisions/041-market-simulator.md.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from costs.traces import parse_trace_name
from migration.choices import InstanceState, Market
from migration.interruptions import InstanceNotRunning, interrupt_instance
from migration.models import CapacityPool, Instance
from migration.simulator import (
    MarketTick,
    ReplayTrace,
    RunningInstance,
    SpotPool,
    market_preemptions,
    replay_trace_from_dict,
)

logger = logging.getLogger(__name__)

# A longer gap between two ticks (the system was stopped, beat fell behind) counts as this
# many tick intervals: the market does not make up for the lost time in one burst.
MAX_GAP_TICKS = 5
# Longer than any tick takes; a lock left by a killed worker frees itself after this.
LOCK_SECONDS = 60
# A day a second: beyond that every spot instance would be preempted at every tick.
MAX_TIME_SCALE = 86_400.0


def state_key() -> str:
    """The Redis key of the simulator's state for this install."""
    return f"{settings.BATON_REDIS_PREFIX}:market-simulator"


def switch_key() -> str:
    """The Redis key of the fleet page's switch: a time scale (0 is off) that overrides
    BATON_MARKET_TIME_SCALE while it is set."""
    return f"{state_key()}:switch"


def time_scale() -> float:
    """The simulated seconds per wall second now: the switch's when set, else the setting's."""
    switched = redis_client(settings.REDIS_URL).get(switch_key())
    return float(switched) if switched is not None else settings.BATON_MARKET_TIME_SCALE


def set_time_scale(scale: float | None) -> None:
    """Switch the simulator at run time: a scale above 0 turns it on, 0 off, None goes back to
    BATON_MARKET_TIME_SCALE."""
    store = redis_client(settings.REDIS_URL)
    if scale is None:
        store.delete(switch_key())
    elif not math.isfinite(scale) or not 0 <= scale <= MAX_TIME_SCALE:
        raise ValueError(f"a time scale is 0 (off) to {MAX_TIME_SCALE:g}")
    else:
        store.set(switch_key(), repr(float(scale)))


@functools.lru_cache(maxsize=4)
def redis_client(url: str) -> redis.Redis:
    """One client (and connection pool) per process."""
    return redis.Redis.from_url(url)


def run_market_tick(now: datetime | None = None) -> list[int]:
    """Advance the simulated market to `now` and interrupt the instances it preempts.

    Returns the ids of the instances interrupted. The first tick after the state is gone only
    starts the clock. A tick already running elsewhere makes this one do nothing.
    """
    scale = time_scale()
    if scale <= 0:
        return []
    now = now or timezone.now()
    store = redis_client(settings.REDIS_URL)
    key = state_key()
    lock = store.lock(f"{key}:lock", timeout=LOCK_SECONDS, blocking=False)
    if not lock.acquire():
        return []
    try:
        raw = store.get(key)
        state = json.loads(raw) if raw else None
        # The clock moves first: a tick that fails half-way is not replayed on a retry.
        clock = float(state["clock_hours"]) if state else 0.0
        gap = now.timestamp() - float(state["wall"]) if state else 0.0
        gap = min(max(gap, 0.0), MAX_GAP_TICKS * settings.BATON_MARKET_TICK_SECONDS)
        tick = MarketTick(now=now, wall_seconds=gap, time_scale=scale, clock_hours=clock)
        store.set(key, json.dumps({"wall": now.timestamp(), "clock_hours": tick.end_hours}))
        if tick.elapsed_hours <= 0:
            return []
        return _preempt(tick)
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            logger.warning("market tick outlived its lock (%s s)", LOCK_SECONDS)


def _preempt(tick: MarketTick) -> list[int]:
    """Load the running spot instances and their pools (two queries), ask the simulator,
    interrupt what it preempts."""
    running = [
        RunningInstance(id=pk, pool_id=pool_id, running_since=started_at)
        for pk, pool_id, started_at in Instance.objects.filter(
            state=InstanceState.RUNNING, pool__market=Market.SPOT, final_notice_at__isnull=True
        ).values_list("pk", "pool_id", "started_at")
    ]
    if not running:
        return []
    sources = settings.BATON_MARKET_TRACES
    pools = CapacityPool.objects.filter(market=Market.SPOT)
    if not sources:
        pools = pools.filter(pk__in={i.pool_id for i in running})
    rows = list(
        pools.values(
            "id",
            "zone",
            "instance_type",
            "region__code",
            "accelerator__name",
            "interruption_rate_per_hour",
            "advance_notice_s",
            "final_window_s",
        )
    )
    traces = traces_for_pools(rows, sources) if sources else {}
    spot_pools = [
        SpotPool(
            id=row["id"],
            interruption_rate_per_hour=row["interruption_rate_per_hour"],
            advance_notice_s=row["advance_notice_s"],
            final_window_s=row["final_window_s"],
            trace=traces.get(row["id"]),
        )
        for row in rows
    ]
    seed = settings.BATON_MARKET_SEED
    # Seeded by the clock too, so a seeded run repeats tick by tick whatever came before.
    rng = random.Random(f"{seed}:{tick.clock_hours!r}") if seed is not None else random.Random()
    interrupted = []
    for preemption in market_preemptions(spot_pools, running, tick, rng):
        try:
            interrupt_instance(
                preemption.instance_id,
                advance_notice_s=preemption.advance_notice_s,
                final_window_s=preemption.final_window_s,
                source="simulated",
            )
        except InstanceNotRunning:
            continue  # released or interrupted since it was read: the market moves on
        logger.info(
            "market simulator preempts instance %s: %s", preemption.instance_id, preemption.reason
        )
        interrupted.append(preemption.instance_id)
    return interrupted


def traces_for_pools(
    pools: Sequence[Mapping[str, Any]], sources: Sequence[tuple[str, Path]]
) -> dict[int, ReplayTrace]:
    """The trace each spot pool replays, by pool id, from BATON_MARKET_TRACES entries.

    `pools` are rows with `id`, `zone`, `instance_type`, `region__code` and
    `accelerator__name`. A `KEY=FILE` entry names the pool by id, zone or instance type (in
    that order of precedence). Files of bare entries are matched by their names: a trace of
    the pool's own zone and card first; otherwise the pools of a region and card take that
    region's traces of the card in turn, by pool id, so neighbouring pools replay different
    zones. Names follow `<zone>_<card>_<nodes>`; a file of a folder that does not is skipped.
    """
    named = {key: path for key, path in sources if key}
    by_name = [
        found
        for key, path in sources
        if not key
        for found in _named_traces(path, path.stat().st_mtime_ns)
    ]
    chosen: dict[int, Path] = {}
    in_region: dict[tuple[str, str], list[int]] = {}
    for pool in sorted(pools, key=lambda p: p["id"]):
        explicit = [str(pool["id"]), pool["zone"], pool["instance_type"]]
        path = next((named[k] for k in explicit if k and k in named), None)
        if path is None:
            card = pool["accelerator__name"]
            path = next((p for _, z, c, p in by_name if z == pool["zone"] and c == card), None)
        if path is not None:
            chosen[pool["id"]] = path
        else:
            in_region.setdefault((pool["region__code"], pool["accelerator__name"]), []).append(
                pool["id"]
            )
    for (region, card), pool_ids in in_region.items():
        same = [p for r, _, c, p in by_name if r == region and c == card]
        for rank, pool_id in enumerate(pool_ids):
            if same:
                chosen[pool_id] = same[rank % len(same)]
    return {pool_id: load_replay_trace(path) for pool_id, path in chosen.items()}


@functools.lru_cache(maxsize=16)
def _named_traces(path: Path, mtime_ns: int) -> tuple[tuple[str, str, str, Path], ...]:
    """(region, zone, card, file) of the trace files a bare entry names (scanned once)."""
    found = []
    for file in sorted(path.glob("*.json")) if path.is_dir() else [path]:
        try:
            region, zone, card, _ = parse_trace_name(file.stem)
        except ValueError:
            logger.warning("market traces: %s is not named like us-east-1a_v100_1.json", file)
            continue
        found.append((region, zone, card, file))
    return tuple(found)


def load_replay_trace(path: Path) -> ReplayTrace:
    """The trace in a file, read once per process (again when the file changes)."""
    return _load_replay_trace(path, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _load_replay_trace(path: Path, mtime_ns: int) -> ReplayTrace:
    with path.open(encoding="utf-8") as handle:
        return replay_trace_from_dict(path.stem, json.load(handle))

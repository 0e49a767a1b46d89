"""One tick of the market simulator (beat): reclaim running spot instances as the simulated
market says, through the same two-level interrupt a staff member would send.

Off unless BATON_MARKET_TIME_SCALE is above 0 (then one wall second is that many simulated
seconds). The simulated clock and the last tick's time live in Redis under the install's
prefix, so every worker process shares them and a restart carries on where it stopped.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

import redis
from django.conf import settings

from costs.traces import load_trace
from migration.choices import InstanceState, Market
from migration.interruptions import InstanceNotRunning, interrupt_instance
from migration.models import CapacityPool, Instance
from migration.simulator import SimulatedPool, preemptions

logger = logging.getLogger(__name__)

# After a pause (the system was stopped), the market does not make up for the lost time.
MAX_TICK_WALL_S = 60.0


def _traces_by_pool(pools: list[CapacityPool]) -> dict[int, tuple[tuple[bool, ...], float]]:
    """Pools matched to the trace files of BATON_MARKET_TRACES (a folder of the shared trace
    format): a pool takes the traces of its region and accelerator in turn, by pool id."""
    folder = settings.BATON_MARKET_TRACES
    if folder is None:
        return {}
    traces = [load_trace(path) for path in sorted(Path(folder).glob("*.json"))]
    matched: dict[int, tuple[tuple[bool, ...], float]] = {}
    for pool in sorted(pools, key=lambda p: p.pk):
        same = [
            t
            for t in traces
            if t.region == pool.region.code and t.accelerator == pool.accelerator.name
        ]
        if same:
            trace = same[pool.pk % len(same)]
            matched[pool.pk] = (tuple(bool(v) for v in trace.unavailable), trace.tick_hours)
    return matched


def run_market_tick(now: float | None = None) -> list[int]:
    """Advance the simulated market to now; interrupt what it reclaims. Returns the ids of
    the instances interrupted."""
    scale = settings.BATON_MARKET_TIME_SCALE
    if scale <= 0:
        return []
    now = time.time() if now is None else now
    store = redis.Redis.from_url(settings.REDIS_URL)
    key = f"{settings.BATON_REDIS_PREFIX}:market"
    state = json.loads(store.get(key) or b"{}")
    last = float(state.get("wall", now))
    clock = float(state.get("hours", 0.0))
    elapsed = min(max(0.0, now - last), MAX_TICK_WALL_S) * scale / 3600
    store.set(key, json.dumps({"wall": now, "hours": clock + elapsed}))
    if elapsed == 0:
        return []
    running = list(
        Instance.objects.filter(
            state=InstanceState.RUNNING,
            pool__market=Market.SPOT,
            final_notice_at__isnull=True,
        ).values_list("pk", "pool_id")
    )
    if not running:
        return []
    pools = list(
        CapacityPool.objects.filter(pk__in={pool for _, pool in running}).select_related(
            "region", "accelerator"
        )
    )
    traces = _traces_by_pool(pools)
    simulated = [
        SimulatedPool(
            id=pool.pk,
            interruption_rate_per_hour=pool.interruption_rate_per_hour,
            advance_notice_s=pool.advance_notice_s,
            final_window_s=pool.final_window_s,
            unavailable=traces.get(pool.pk, ((), 1.0))[0],
            tick_hours=traces.get(pool.pk, ((), 1.0))[1],
        )
        for pool in pools
    ]
    seed = settings.BATON_MARKET_SEED
    rng = random.Random(f"{seed}:{clock}") if seed is not None else random.Random()
    interrupted = []
    for reclaim in preemptions(simulated, running, clock, clock + elapsed, rng):
        try:
            interrupt_instance(
                reclaim.instance_id,
                advance_notice_s=reclaim.advance_notice_s,
                final_window_s=reclaim.final_window_s,
                source="simulated",
            )
        except InstanceNotRunning:
            continue
        logger.info(
            "market simulator reclaims instance %s: %s", reclaim.instance_id, reclaim.reason
        )
        interrupted.append(reclaim.instance_id)
    return interrupted

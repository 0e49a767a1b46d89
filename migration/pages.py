"""Reads for the portal's pages: what a job's page and the fleet page show, in a fixed
handful of queries whatever the size of the job or the fleet."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING, Any

from django.db.models import Prefetch

from jobs.lifecycle import is_finished
from migration.choices import InstanceState
from migration.models import (
    CapacityPool,
    Checkpoint,
    CheckpointReplica,
    Instance,
    Migration,
    TimelineEvent,
)

if TYPE_CHECKING:
    from jobs.models import Job

# A migration's phases in order, as the job page's timeline draws them.
PHASES = (
    "notice",
    "checkpoint",
    "release",
    "placement",
    "replica",
    "start",
    "restore",
    "validation",
    "running",
)
# Log lines a job's page shows at first; older ones stay in GET /api/jobs/{id}/logs/.
LOG_TAIL = 300
# The fleet page lists the instances that are not over, and this many recently ended ones.
RECENT_ENDED_INSTANCES = 20
# Events the fleet page's feed shows at first.
FEED_TAIL = 30


def describe_workload(workload: dict[str, Any]) -> str:
    """A workload in words: `mlp_numpy (seed=1, lr=0.1)` or the command as a shell line."""
    if "command" in workload:
        return shlex.join(str(a) for a in workload["command"])
    params = ", ".join(f"{k}={v}" for k, v in sorted((workload.get("params") or {}).items()))
    return f"{workload.get('template', '?')} ({params or 'defaults'})"


def job_parts(job: Job) -> dict[str, Any]:
    """The parts of a job's page that change as it runs: its pool, instances, checkpoints with
    their replicas per region, and migrations with their pools (five queries)."""
    pool = (
        CapacityPool.objects.select_related("region").filter(pk=job.pool_id).first()
        if job.pool_id
        else None
    )
    replicas = CheckpointReplica.objects.select_related("region").order_by("region__code")
    checkpoints = list(
        Checkpoint.objects.filter(job=job)
        .prefetch_related(Prefetch("replicas", queryset=replicas))
        .order_by("-step", "-id")
    )
    migrations = list(
        Migration.objects.filter(job=job)
        .select_related("from_pool__region", "to_pool__region")
        .order_by("id")
    )
    for migration in migrations:
        finished = migration.finished_at
        migration.took_s = (  # type: ignore[attr-defined]
            (finished - migration.started_at).total_seconds() if finished else None
        )
    instances = list(
        Instance.objects.filter(job=job).select_related("pool__region").order_by("-id")[:50]
    )
    return {
        "pool": pool,
        "checkpoints": checkpoints,
        "migrations": migrations,
        "instances": instances,
        "finished": is_finished(job.state),
        "progress_percent": round(100 * job.step / job.total_steps) if job.total_steps else 0,
    }


def log_tail_start(job: Job) -> int:
    """The id after which the page's log starts: the last `LOG_TAIL` lines are shown."""
    ids = list(job.log_lines.order_by("-id").values_list("id", flat=True)[:LOG_TAIL])
    return ids[-1] - 1 if ids else 0


@dataclass(frozen=True)
class RegionPools:
    region: str
    pools: list[CapacityPool]


@dataclass(frozen=True)
class AcceleratorPools:
    """One card's pools by region, with what a glance needs: the cheapest spot and the room."""

    accelerator: str
    regions: list[RegionPools]

    @property
    def pools(self) -> list[CapacityPool]:
        return [pool for region in self.regions for pool in region.pools]

    @property
    def cheapest_spot(self) -> Any:
        prices = [p.price_per_hour for p in self.pools if p.market == "spot"]
        return min(prices) if prices else None

    @property
    def free(self) -> int:
        return sum(max(getattr(p, "free", 0), 0) for p in self.pools)  # with_free()


def fleet_pools() -> list[AcceleratorPools]:
    """Enabled pools with their free capacity and history, by accelerator then region (one
    query); within a region spot comes before on-demand, cheapest first."""
    pools = (
        CapacityPool.objects.with_free()
        .filter(enabled=True)
        .select_related("region", "accelerator", "spot_history")
        .order_by("accelerator__name", "region__code", "-market", "price_per_hour", "id")
    )
    return [
        AcceleratorPools(
            accelerator,
            [
                RegionPools(region, list(items))
                for region, items in groupby(in_card, key=lambda p: p.region.code)
            ],
        )
        for accelerator, in_card in groupby(pools, key=lambda p: p.accelerator.name)
    ]


def fleet_instances() -> list[Instance]:
    """Instances that are not over, then the most recently ended (two queries)."""
    live_states = [s for s in InstanceState.values if s not in ("released", "failed")]
    related = ("job", "pool__region", "pool__accelerator")
    live = list(
        Instance.objects.filter(state__in=live_states).select_related(*related).order_by("-id")
    )
    ended = list(
        Instance.objects.exclude(state__in=live_states)
        .select_related(*related)
        .order_by("-id")[:RECENT_ENDED_INSTANCES]
    )
    return live + ended


def fleet_feed_start() -> int:
    """The event id after which the fleet page's feed starts: the last `FEED_TAIL` events."""
    ids = list(TimelineEvent.objects.order_by("-id").values_list("id", flat=True)[:FEED_TAIL])
    return ids[-1] - 1 if ids else 0

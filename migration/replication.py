"""Checkpoints everywhere a job may land (decision 044).

- After a checkpoint of every rank commits in the job's home region, it is copied to the
  BATON_REPLICAS regions placement would most likely take the job to next: only the chunks a
  region lacks, from the nearest region holding a ready copy (the latency matrix). A region
  whose store cannot be reached is skipped for the next one. Every copy is a
  `CheckpointReplica`; the home region's own copy is one too.
- A replica a restore is about to use is verified chunk by chunk. A corrupt chunk is removed
  and every replica of the job in that region is marked failed, so the next copy brings good
  chunks from another region.
- Retention keeps the last BATON_KEEP_CHECKPOINTS committed checkpoints of a job plus its newest
  emergency one, in every region; never one that a restore or a copy is using.
- Deleting a finished job removes its checkpoints from every region that may hold them, once
  the deletion commits: nothing could find them afterwards.

Everything here runs outside transactions (store I/O can take minutes) and is safe to run twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from jobs.lifecycle import is_finished
from jobs.models import Job
from migration.checkpoint import CorruptChunk, ManifestRef, Store, StoreError
from migration.checkpoint.store import DEFAULT_GC_GRACE_S
from migration.choices import (
    ACTIVE_INSTANCE_STATES,
    CheckpointKind,
    CheckpointStatus,
    ReplicaStatus,
)
from migration.models import Checkpoint, CheckpointReplica, Instance, Region, RegionLatency
from migration.selectors import (
    checkpoint_rank,
    complete_checkpoints,
    likely_regions,
    open_migration,
)
from migration.stores import RegionStore, region_store
from portal.enqueue import enqueue_on_commit

logger = logging.getLogger(__name__)

# An S3 region store that does not answer within this long is skipped (the store's own retry
# budget is a minute: right for a save on an instance, too long for a choice among regions).
STORE_RETRY_S = 10.0
# Chunks younger than this are never collected: a save or a copy may be about to name them.
RETENTION_GRACE_S = DEFAULT_GC_GRACE_S
# A deleted job's stores are swept again this long after the grace period.
FORGET_SWEEP_MARGIN_S = 60.0


class ReplicationFailed(StoreError):
    """No region holding a ready copy could copy the checkpoint to the target region."""


@dataclass(frozen=True)
class CopyOutcome:
    """One checkpoint (every rank) made ready in one region."""

    region: str
    source: str
    latency_ms: float | None
    copied_bytes: int
    skipped_bytes: int
    seconds: float

    def as_event(self) -> dict[str, Any]:
        return asdict(self)


def open_region(region: str, job: Job) -> Store:
    """The job's project namespace in `region`'s store."""
    return _open(region_store(region, job.project.slug))


def _open(store: RegionStore) -> Store:
    return store.open(retry_seconds=STORE_RETRY_S) if store.is_s3 else store.open()


def step_rows(checkpoint: Checkpoint) -> list[Checkpoint]:
    """Every rank's row of the checkpoint's step and kind."""
    return list(
        Checkpoint.objects.filter(
            job_id=checkpoint.job_id, step=checkpoint.step, kind=checkpoint.kind
        )
    )


def record_home(checkpoint: Checkpoint) -> None:
    """A checkpoint of every rank committed in its home region: its first ready replica."""
    assert checkpoint.region_id is not None
    CheckpointReplica.objects.update_or_create(
        checkpoint=checkpoint,
        region_id=checkpoint.region_id,
        defaults={
            "status": ReplicaStatus.READY,
            "bytes": sum(row.bytes_new for row in step_rows(checkpoint)),
            "completed_at": timezone.now(),
        },
    )


def holders(checkpoint: Checkpoint) -> list[str]:
    """Regions holding a ready copy of the checkpoint."""
    return list(
        checkpoint.replicas.filter(status=ReplicaStatus.READY).values_list(
            "region__code", flat=True
        )
    )


def latencies_to(target: str, regions: list[str]) -> dict[str, float]:
    """Milliseconds from each of `regions` to `target` in the latency matrix, read in one
    query (0 within a region; a pair stored the other way round counts; infinite when the
    matrix does not say)."""
    found: dict[str, float] = {}
    rows = RegionLatency.objects.filter(
        Q(source__code=target, target__code__in=regions)
        | Q(target__code=target, source__code__in=regions)
    ).values_list("source__code", "target__code", "milliseconds")
    for source, other, ms in rows:
        if other == target:  # stored as region -> target: preferred over the reverse
            found[source] = float(ms)
        else:
            found.setdefault(other, float(ms))
    return {r: 0.0 if r == target else found.get(r, math.inf) for r in regions}


def nearest_first(regions: list[str], target: str) -> list[tuple[str, float]]:
    """`regions` with their latency to `target`, nearest first."""
    latency = latencies_to(target, regions)
    return sorted(((r, latency[r]) for r in regions), key=lambda p: (p[1], p[0]))


def copy_to_region(checkpoint: Checkpoint, target: str) -> CopyOutcome:
    """Make the checkpoint (every rank) ready in `target`: copy the chunks it lacks from the
    nearest region holding a ready copy, or the next nearest when that one fails. Raises
    ReplicationFailed when none could (the target's store down, or no copy left)."""
    job = checkpoint.job
    sources = nearest_first(holders(checkpoint), target)
    if any(region == target for region, _ in sources):
        return CopyOutcome(target, target, 0.0, 0, 0, 0.0)
    if not sources:
        raise ReplicationFailed(f"no region holds a ready copy of checkpoint {checkpoint.pk}")
    region = Region.objects.get(code=target)
    CheckpointReplica.objects.update_or_create(
        checkpoint=checkpoint,
        region=region,
        defaults={"status": ReplicaStatus.COPYING, "completed_at": None},
    )
    ref = ManifestRef.parse(checkpoint.manifest_key)
    errors: list[str] = []
    for source, ms in sources:
        started = time.perf_counter()
        copied = skipped = 0
        try:
            with open_region(source, job) as origin, open_region(target, job) as destination:
                for rank in range(job.nodes):
                    stats = origin.copy(ref.for_rank(rank), destination)
                    copied += stats.bytes_copied
                    skipped += stats.bytes_skipped
        except Exception as exc:  # whatever a store raises, that source is skipped
            logger.warning(
                "copy of checkpoint %s %s -> %s failed: %s", checkpoint.pk, source, target, exc
            )
            errors.append(f"from {source}: {exc}")
            continue
        seconds = round(time.perf_counter() - started, 3)
        CheckpointReplica.objects.filter(checkpoint=checkpoint, region=region).update(
            status=ReplicaStatus.READY, bytes=copied, completed_at=timezone.now()
        )
        return CopyOutcome(target, source, None if math.isinf(ms) else ms, copied, skipped, seconds)
    CheckpointReplica.objects.filter(checkpoint=checkpoint, region=region).update(
        status=ReplicaStatus.FAILED
    )
    raise ReplicationFailed(
        f"checkpoint {checkpoint.pk} could not be copied to {target}: " + "; ".join(errors)
    )


def newest_complete(job: Job) -> Checkpoint | None:
    found = complete_checkpoints(job)
    return found[0] if found else None


def replication_targets(job: Job, checkpoint: Checkpoint) -> list[str]:
    """Regions without a ready copy, most likely first: the migration's pre-reserved target,
    then the regions placement would take the job to next."""
    have = set(holders(checkpoint))
    ranked = likely_regions(job)
    migration = open_migration(job)
    if migration is not None and migration.to_pool_id is not None:
        ranked.insert(0, migration.to_pool.region.code)  # type: ignore[union-attr]
    seen: list[str] = []
    for region in ranked:
        if region not in have and region not in seen:
            seen.append(region)
    return seen


def replicate(checkpoint_id: int, region: str | None = None) -> list[CopyOutcome]:
    """Copy the job's newest complete checkpoint (`checkpoint_id`, or nothing if a newer one
    came since) to `region`, or to the regions the job is likely to land in until it has
    BATON_REPLICAS copies besides its home; then apply retention. Returns the copies made."""
    checkpoint = (
        Checkpoint.objects.select_related("job__project", "region").filter(pk=checkpoint_id).first()
    )
    if checkpoint is None or checkpoint.status != CheckpointStatus.COMMITTED:
        return []
    job = checkpoint.job
    newest = newest_complete(job)
    if is_finished(job.state) or newest is None or newest.pk != checkpoint.pk:
        retain(job)
        return []
    if region is not None:
        targets, wanted = [region], 1
    else:
        targets = replication_targets(job, checkpoint)
        wanted = settings.BATON_REPLICAS - max(0, len(holders(checkpoint)) - 1)
    made: list[CopyOutcome] = []
    for target in targets:
        if len(made) >= wanted:
            break
        try:
            made.append(copy_to_region(checkpoint, target))
        except ReplicationFailed as exc:  # that region's store is down: the next one
            logger.warning("job %s: %s", job.pk, exc)
    retain(job)
    return made


# -- integrity -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Integrity:
    """The result of reading back every chunk of a replica."""

    region: str
    ok: bool
    chunks: int
    bytes: int
    seconds: float
    error: str = ""

    def as_event(self) -> dict[str, Any]:
        return asdict(self)


def verify_replica(checkpoint: Checkpoint, region: str) -> Integrity:
    """Read back every chunk of every rank's manifest in `region` and check its hash. A corrupt
    chunk is removed and every replica of the job in the region marked failed, so the next
    copy there brings good chunks."""
    job = checkpoint.job
    ref = ManifestRef.parse(checkpoint.manifest_key)
    started = time.perf_counter()
    chunks = size = 0
    try:
        with open_region(region, job) as store:
            try:
                for rank in range(job.nodes):
                    stats = store.verify(ref.for_rank(rank))
                    chunks += stats.chunks
                    size += stats.bytes
            except CorruptChunk as exc:
                store.remove_chunks([exc.chunk])
                CheckpointReplica.objects.filter(checkpoint__job=job, region__code=region).update(
                    status=ReplicaStatus.FAILED
                )
                return Integrity(region, False, chunks, size, _since(started), str(exc))
    except StoreError as exc:
        return Integrity(region, False, chunks, size, _since(started), str(exc))
    return Integrity(region, True, chunks, size, _since(started))


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


# -- retention -----------------------------------------------------------------------------------


def kept_steps(job: Job) -> set[tuple[int, str]]:
    """The (step, kind) of every checkpoint retention keeps: the newest committed ones, the
    newest emergency one, any a restore or a copy is using, and any newer than the newest
    committed one (a save whose other ranks have not reported yet)."""
    committed = complete_checkpoints(job)
    keep = {(c.step, c.kind) for c in committed[: settings.BATON_KEEP_CHECKPOINTS]}
    newest = _order(committed[0].step, committed[0].kind) if committed else None
    saving = Checkpoint.objects.filter(job=job).exclude(status=CheckpointStatus.CORRUPT)
    for step, kind in saving.values_list("step", "kind"):
        if newest is None or _order(step, kind) > newest:
            keep.add((step, kind))
    emergency = [c for c in committed if c.kind == CheckpointKind.EMERGENCY]
    if emergency:
        keep.add((emergency[0].step, emergency[0].kind))
    migration = open_migration(job)
    if migration is not None and migration.checkpoint is not None:
        keep.add((migration.checkpoint.step, migration.checkpoint.kind))
    for key in Instance.objects.filter(job=job, state__in=ACTIVE_INSTANCE_STATES).values_list(
        "resume_manifest", flat=True
    ):
        if key:
            ref = ManifestRef.parse(key)
            keep.add((ref.step, ref.kind))
    for step, kind in Checkpoint.objects.filter(
        job=job, replicas__status__in=(ReplicaStatus.PENDING, ReplicaStatus.COPYING)
    ).values_list("step", "kind"):
        keep.add((step, kind))
    return keep


def _order(step: int, kind: str) -> tuple[int, int]:
    """Checkpoints in the order of the store (by step, then periodic, emergency, final)."""
    return ManifestRef("0", step, kind).sort_key[:2]


def job_regions(job: Job) -> list[str]:
    """Every region that holds (or held) something of the job."""
    homes = Checkpoint.objects.filter(job=job, region__isnull=False).values_list(
        "region__code", flat=True
    )
    copies = CheckpointReplica.objects.filter(checkpoint__job=job).values_list(
        "region__code", flat=True
    )
    return sorted(set(homes) | set(copies))


def retain(job: Job) -> dict[str, Any]:
    """Remove what retention does not keep, from every region's store and from the database;
    a region whose store cannot be reached keeps its copies until the next round.

    Only checkpoints the database records are removed: a manifest it does not know of is a
    save committing right now whose report is not in yet (read before `keep`, the rows miss
    a checkpoint reported meanwhile, so it is not doomed either)."""
    rows = list(Checkpoint.objects.filter(job=job))
    keep = kept_steps(job)
    doomed = [row for row in rows if (row.step, row.kind) not in keep]
    doomed_steps = {(row.step, row.kind) for row in doomed}
    removed: dict[str, int] = {}
    reached = True
    for region in job_regions(job):
        try:
            with open_region(region, job) as store:
                refs = store.list(job.checkpoint_key)
                removed[region] = store.remove_checkpoints(
                    job.checkpoint_key,
                    [ref for ref in refs if (ref.step, ref.kind) in doomed_steps],
                    grace_s=RETENTION_GRACE_S,
                ).bytes_removed
        except StoreError as exc:
            reached = False
            logger.warning("retention of job %s in %s: %s", job.pk, region, exc)
    if reached and doomed:
        Checkpoint.objects.filter(pk__in=[row.pk for row in doomed]).delete()
    Job.objects.filter(pk=job.pk).update(checkpoint_storage=measure_storage(job))
    return {
        "kept": sorted(keep),
        "removed_checkpoints": len(doomed) if reached else 0,
        "bytes_removed": removed,
    }


def delete_finished_jobs(jobs: Iterable[Job]) -> tuple[list[int], list[int]]:
    """Delete the finished ones of `jobs`. Once a deletion commits, the job's checkpoints are
    removed from every region's store (queue `replication`): their key has a random part only
    the deleted row knew, so nothing could find them again. Returns the ids deleted and the
    ids refused (an unfinished job still holds instances)."""
    regions = sorted(Region.objects.values_list("code", flat=True))
    deleted: list[int] = []
    refused: list[int] = []
    for job in jobs:
        if not is_finished(job.state):
            refused.append(job.pk)
            continue
        pk, key, project = job.pk, job.checkpoint_key, job.project.slug
        with transaction.atomic():
            job.delete()
            enqueue_on_commit("migration.tasks.forget_checkpoints_task", project, key, regions)
        deleted.append(pk)
    return deleted, refused


def forget_checkpoints(
    project: str, key: str, regions: list[str], *, sweep_later: bool
) -> dict[str, int]:
    """Remove every checkpoint named `key` from `project`'s store in each of `regions` (a
    folder store never made is skipped), with the chunks nothing else there references.
    Chunks younger than the grace period stay, since a save may be about to name them (a copy
    of the job's last checkpoint, an earlier retention's leftovers); with `sweep_later`, a
    second run after the grace period removes them. Returns the bytes removed per region.

    A region that cannot be reached raises StoreError once the others are done; running again
    finds nothing left where this run succeeded."""
    removed: dict[str, int] = {}
    unreached: list[str] = []
    for region in regions:
        where = region_store(region, project)
        if where.never_made:
            continue
        try:
            with _open(where) as store:
                removed[region] = store.remove_job(key, grace_s=RETENTION_GRACE_S).bytes_removed
        except StoreError as exc:
            unreached.append(f"{region} ({exc})")
    if unreached:
        raise StoreError(f"checkpoints of {key} not removed in {', '.join(unreached)}")
    logger.info("removed the checkpoints of deleted job %s: %s", key, removed)
    if sweep_later:
        enqueue_on_commit(
            "migration.tasks.forget_checkpoints_task",
            project,
            key,
            regions,
            False,
            countdown=RETENTION_GRACE_S + FORGET_SWEEP_MARGIN_S,
        )
    return removed


def measure_storage(job: Job) -> dict[str, Any]:
    """What the job's ready copies take in each region's store: the bytes of the distinct
    chunks their manifests reference there (chunks shared by checkpoints count once)."""
    ready = CheckpointReplica.objects.filter(
        checkpoint__job=job, status=ReplicaStatus.READY
    ).select_related("checkpoint", "region")
    keys_by_region: dict[str, set[str]] = {}
    for replica in ready:
        ref = ManifestRef.parse(replica.checkpoint.manifest_key)
        keys_by_region.setdefault(replica.region.code, set()).update(
            ref.for_rank(rank).key for rank in range(job.nodes)
        )
    regions: dict[str, int | None] = {}
    for region, keys in sorted(keys_by_region.items()):
        try:
            with open_region(region, job) as store:
                chunks: dict[str, int] = {}
                for key in keys:
                    chunks.update(store.load_manifest(key).chunks())
                regions[region] = sum(chunks.values())
        except StoreError:
            regions[region] = None  # unreachable now
    return {
        "bytes": sum(v for v in regions.values() if v),
        "regions": regions,
        "measured_at": timezone.now().isoformat(),
    }


def rank_zero_row(checkpoint: Checkpoint) -> Checkpoint:
    """The row of rank 0 at the checkpoint's step and kind (the one replicas hang on)."""
    return next(row for row in step_rows(checkpoint) if checkpoint_rank(row) == 0)


def rank_rows_complete(checkpoint: Checkpoint) -> bool:
    """Whether every rank of the job has committed the checkpoint's step and kind."""
    ranks = {
        checkpoint_rank(row)
        for row in step_rows(checkpoint)
        if row.status == CheckpointStatus.COMMITTED
    }
    return set(range(checkpoint.job.nodes)) <= ranks

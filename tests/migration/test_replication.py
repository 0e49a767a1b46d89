"""Replication, integrity and retention on real stores: a folder per region, and the real S3
server for a region configured to use it."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migration import orchestration, replication, services, tasks
from migration.checkpoint import ManifestRef, StoreError
from migration.checkpoint.store import SaveResult
from migration.choices import ReplicaStatus
from migration.models import (
    CapacityPool,
    Checkpoint,
    CheckpointReplica,
    Instance,
    Migration,
    Region,
    RegionLatency,
    TimelineEvent,
)
from tests.conftest import submit
from tests.migration.checkpoint.conftest import S3_ENV, s3_server  # noqa: F401  (a fixture)
from tests.migration.checkpoint.s3server import BUCKET, S3Server
from tests.migration.test_orchestration import Recorder, backend, running_job  # noqa: F401

MIB = 1024 * 1024
BASE_MB = 8  # frozen, like a pretrained base
ADAPTER_FLOATS = 64 * 1024  # trained: 256 KiB a tensor, two of them


@pytest.fixture
def regions(catalogue: dict[str, Any]) -> dict[str, Region]:
    """Three regions with T4 spot capacity; the latency matrix makes us-west-2 nearer to
    eu-west-1 than us-east-1 is."""
    east, west = catalogue["region"], Region.objects.get(code="us-west-2")
    eu = Region.objects.create(code="eu-west-1", name="Ireland")
    CapacityPool.objects.create(
        region=eu,
        zone="euw1-az1",
        instance_type="g4dn.xlarge",
        accelerator=catalogue["accelerators"]["T4"],
        market="spot",
        price_per_hour=Decimal("0.30"),
        gpus_per_instance=1,
        capacity=3,
    )
    for source, target, ms in [(east, west, 70), (east, eu, 80), (west, eu, 40)]:
        RegionLatency.objects.create(source=source, target=target, milliseconds=ms)
    return {"us-east-1": east, "us-west-2": west, "eu-west-1": eu}


class Trainer:
    """Checkpoints of a job written into its home region's store as an SDK would: a frozen base
    and a small adapter that changes at every save, each reported as the portal records it."""

    def __init__(self, job: Any, home: Region) -> None:
        self.job, self.home = job, home
        rng = np.random.default_rng(0)
        self.base = rng.random(BASE_MB * MIB // 4, dtype=np.float32)
        self.adapter = {
            "a": rng.random(ADAPTER_FLOATS, dtype=np.float32),
            "b": rng.random(ADAPTER_FLOATS, dtype=np.float32),
        }

    def save(self, step: int, kind: str = "periodic", rank: int = 0) -> Checkpoint:
        return self.report(self.commit(step, kind, rank))

    def commit(self, step: int, kind: str = "periodic", rank: int = 0) -> SaveResult:
        """Write a checkpoint into the home store, not yet reported to the portal."""
        for tensor in self.adapter.values():
            tensor += 1.0
        with replication.open_region(self.home.code, self.job) as store:
            return store.save(
                self.job.checkpoint_key,
                step,
                {"base": self.base, **self.adapter},
                kind=kind,
                rank=rank,
                world_size=self.job.nodes,
            )

    def report(self, saved: SaveResult) -> Checkpoint:
        step, kind = saved.ref.step, saved.ref.kind
        checkpoint = Checkpoint.objects.create(
            job=self.job,
            step=step,
            kind=kind,
            status="committed",
            manifest_key=saved.ref.key,
            region=self.home,
            bytes_total=saved.bytes_total,
            bytes_new=saved.bytes_new,
        )
        replication.record_home(checkpoint)
        return checkpoint

    @property
    def changed_bytes(self) -> int:
        return sum(t.nbytes for t in self.adapter.values())


@pytest.fixture
def trainer(alice: Any, catalogue: dict[str, Any], regions: dict[str, Region]) -> Trainer:
    return Trainer(submit(alice, catalogue), regions["us-east-1"])


def ready_regions(checkpoint: Checkpoint) -> set[str]:
    return set(replication.holders(checkpoint))


def store_root(region: str, job: Any) -> Path:
    return Path(replication.region_store(region, job.project.slug).url.removeprefix("file://"))


def chunk_path(region: str, job: Any, chunk: str) -> Path:
    return store_root(region, job) / "chunks" / chunk[:2] / chunk


def test_a_checkpoint_goes_to_the_regions_the_job_would_land_in_next(trainer: Trainer) -> None:
    first = trainer.save(10)

    made = replication.replicate(first.pk)

    # Its home is us-east-1; the cheapest other T4 spot pools are in us-west-2 and eu-west-1.
    assert {copy.region for copy in made} == {"us-west-2", "eu-west-1"}
    assert ready_regions(first) == {"us-east-1", "us-west-2", "eu-west-1"}
    for copy in made:
        assert copy.copied_bytes >= BASE_MB * MIB
    assert replication.replicate(first.pk) == []  # twice over: nothing more to do


def test_successive_checkpoints_copy_only_the_chunks_a_region_lacks(trainer: Trainer) -> None:
    replication.replicate(trainer.save(10).pk)

    second = trainer.save(20)
    made = replication.replicate(second.pk)

    assert len(made) == 2
    for copy in made:
        assert copy.skipped_bytes >= BASE_MB * MIB
        assert copy.copied_bytes <= 1.1 * trainer.changed_bytes
    replicas = CheckpointReplica.objects.filter(checkpoint=second).exclude(region__code="us-east-1")
    assert {r.bytes for r in replicas} == {copy.copied_bytes for copy in made}
    assert {r.status for r in replicas} == {ReplicaStatus.READY}


def test_a_copy_comes_from_the_nearest_region_holding_a_ready_one(
    trainer: Trainer, settings: Any
) -> None:
    settings.BATON_REPLICAS = 1
    checkpoint = trainer.save(10)
    replication.copy_to_region(checkpoint, "us-west-2")

    copy = replication.copy_to_region(checkpoint, "eu-west-1")

    assert (copy.source, copy.latency_ms) == ("us-west-2", 40.0)  # not the home, 80 ms away


def test_regions_are_ranked_by_the_latency_matrix_either_way_round(
    regions: dict[str, Region],
) -> None:
    Region.objects.create(code="ap-south-1", name="Mumbai")  # not in the matrix
    ranked = replication.nearest_first(["ap-south-1", "us-east-1", "eu-west-1"], "us-west-2")
    # us-west-2 -> eu-west-1 is stored the other way round; the target itself is 0 ms away.
    assert ranked == [("eu-west-1", 40.0), ("us-east-1", 70.0), ("ap-south-1", float("inf"))]
    assert replication.nearest_first(["us-west-2", "us-east-1"], "us-west-2")[0] == (
        "us-west-2",
        0.0,
    )


def region_down(region: str, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point `region` at an S3 endpoint where nothing listens (given up on after 0.5 s)."""
    monkeypatch.setattr(replication, "STORE_RETRY_S", 0.5)
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    settings.BATON_REGION_STORES = {region: "s3://nobody-listens/ckpt"}
    settings.BATON_REGION_S3_ENDPOINTS = {region: "http://127.0.0.1:9"}


def test_a_region_whose_store_is_down_is_skipped_for_the_next_one(
    trainer: Trainer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.BATON_REPLICAS = 1
    region_down("us-west-2", settings, monkeypatch)
    checkpoint = trainer.save(10)

    made = replication.replicate(checkpoint.pk)

    assert [copy.region for copy in made] == ["eu-west-1"]
    down = CheckpointReplica.objects.get(checkpoint=checkpoint, region__code="us-west-2")
    assert down.status == ReplicaStatus.FAILED


def test_a_region_can_keep_its_checkpoints_on_s3(
    trainer: Trainer,
    s3_server: S3Server,  # noqa: F811
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    settings.BATON_REGION_STORES = {"eu-west-1": f"s3://{BUCKET}/regions/eu-west-1"}
    settings.BATON_REGION_S3_ENDPOINTS = {"eu-west-1": s3_server.endpoint}
    checkpoint = trainer.save(10)

    copy = replication.copy_to_region(checkpoint, "eu-west-1")

    assert copy.copied_bytes >= BASE_MB * MIB
    assert replication.verify_replica(checkpoint, "eu-west-1").ok
    store = replication.region_store("eu-west-1", trainer.job.project.slug)
    assert store.url == f"s3://{BUCKET}/regions/eu-west-1/{trainer.job.project.slug}"
    assert store.environ()["BATON_S3_ENDPOINT"] == s3_server.endpoint


def test_a_corrupt_chunk_fails_verification_and_the_next_copy_heals_the_region(
    trainer: Trainer,
) -> None:
    checkpoint = trainer.save(10)
    replication.copy_to_region(checkpoint, "us-west-2")
    manifest = replication.open_region("us-west-2", trainer.job).load_manifest(
        checkpoint.manifest_key
    )
    victim = next(iter(manifest.chunks()))
    path = chunk_path("us-west-2", trainer.job, victim)
    path.write_bytes(b"\0" * path.stat().st_size)

    bad = replication.verify_replica(checkpoint, "us-west-2")

    assert not bad.ok and victim in bad.error
    assert "us-west-2" not in ready_regions(checkpoint)
    copy = replication.copy_to_region(checkpoint, "us-west-2")
    assert copy.copied_bytes == manifest.chunks()[victim]  # only the bad chunk comes again
    assert replication.verify_replica(checkpoint, "us-west-2").ok


def test_retention_keeps_the_newest_and_what_a_restore_uses_in_every_region(
    trainer: Trainer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replication, "RETENTION_GRACE_S", 0.0)
    settings.BATON_KEEP_CHECKPOINTS = 2
    saved = [trainer.save(step) for step in (10, 20)]
    saved.append(trainer.save(25, kind="emergency"))
    saved += [trainer.save(step) for step in (30, 40, 50)]
    for checkpoint in saved:
        replication.copy_to_region(checkpoint, "us-west-2")
    # A new instance is restoring step 20 (a rollback's target, say).
    instance = Instance.objects.create(
        pool=CapacityPool.objects.get(region__code="us-west-2", market="spot"),
        job=trainer.job,
        resume_manifest=saved[1].manifest_key,
    )
    assert instance.state == "provisioning"

    replication.retain(trainer.job)

    kept = {(c.step, c.kind) for c in Checkpoint.objects.filter(job=trainer.job)}
    assert kept == {(50, "periodic"), (40, "periodic"), (25, "emergency"), (20, "periodic")}
    for region in ("us-east-1", "us-west-2"):
        with replication.open_region(region, trainer.job) as store:
            steps = {ref.step for ref in store.list(trainer.job.checkpoint_key)}
            assert steps == {20, 25, 40, 50}
            for step in (20, 25, 40, 50):  # every kept checkpoint is still whole
                key = ManifestRef(
                    trainer.job.checkpoint_key, step, "emergency" if step == 25 else "periodic"
                )
                store.verify(key)
    removed_adapter = saved[0].manifest_key
    with replication.open_region("us-east-1", trainer.job) as store:
        assert all(ref.key != removed_adapter for ref in store.list(trainer.job.checkpoint_key))
    storage = type(trainer.job).objects.get(pk=trainer.job.pk).checkpoint_storage
    assert set(storage["regions"]) == {"us-east-1", "us-west-2"}
    # Four checkpoints share one base: about one base and four adapters per region.
    per_region = BASE_MB * MIB + 4 * trainer.changed_bytes
    assert all(per_region <= b <= per_region + MIB for b in storage["regions"].values())


def stored_steps(trainer: Trainer) -> set[tuple[int, int]]:
    with replication.open_region(trainer.home.code, trainer.job) as store:
        return {(ref.step, ref.rank) for ref in store.list(trainer.job.checkpoint_key)}


def test_retention_leaves_a_checkpoint_whose_report_is_not_in_yet(
    trainer: Trainer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An emergency save commits while a replication of the previous checkpoint ends with a
    # round of retention: the portal has no row for it yet, and it must survive.
    monkeypatch.setattr(replication, "RETENTION_GRACE_S", 0.0)
    settings.BATON_KEEP_CHECKPOINTS = 1
    for step in (10, 20):
        trainer.save(step)
    unreported = trainer.commit(25, kind="emergency")

    replication.retain(trainer.job)

    assert stored_steps(trainer) == {(20, 0), (25, 0)}
    with replication.open_region(trainer.home.code, trainer.job) as store:
        store.verify(unreported.ref)  # whole: its chunks were not swept either
    trainer.report(unreported)
    replication.retain(trainer.job)
    assert stored_steps(trainer) == {(25, 0)}


def test_retention_keeps_a_gang_checkpoint_until_every_rank_has_reported(
    alice: Any,
    catalogue: dict[str, Any],
    regions: dict[str, Region],
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replication, "RETENTION_GRACE_S", 0.0)
    settings.BATON_KEEP_CHECKPOINTS = 1
    trainer = Trainer(submit(alice, catalogue, nodes=2), regions["us-east-1"])
    for rank in (0, 1):
        trainer.save(10, rank=rank)
    trainer.save(20, rank=0)  # rank 1 is still writing step 20
    late = trainer.commit(20, rank=1)

    replication.retain(trainer.job)

    assert stored_steps(trainer) == {(10, 0), (10, 1), (20, 0), (20, 1)}
    trainer.report(late)
    replication.retain(trainer.job)
    assert stored_steps(trainer) == {(20, 0), (20, 1)}


def test_retention_never_removes_the_checkpoint_a_migration_restores(
    trainer: Trainer, settings: Any
) -> None:
    settings.BATON_KEEP_CHECKPOINTS = 1
    old = trainer.save(10)
    trainer.save(20)
    Migration.objects.create(job=trainer.job, trigger="manual", checkpoint=old)

    replication.retain(trainer.job)

    assert Checkpoint.objects.filter(pk=old.pk).exists()


def test_a_start_whose_region_store_is_down_is_placed_in_another_region(
    catalogue: dict[str, Any],
    alice: Any,
    regions: dict[str, Region],
    backend: Recorder,  # noqa: F811
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    region_down("us-west-2", settings, monkeypatch)
    job, agents = running_job(alice, catalogue, backend)
    with replication.open_region("us-east-1", job) as store:
        key = store.save(
            job.checkpoint_key, 30, {"w": np.ones(1000, np.float32)}, kind="emergency"
        ).ref
    agents[0].send("notice", level="final", source="imds")
    agents[0].send("checkpoint", manifest=key.key, step=30, kind="emergency", rank=0)
    agents[0].send("exit", reason="preempted")
    CapacityPool.objects.filter(region=regions["us-east-1"]).update(enabled=False)

    services.place_job(job.pk)  # us-west-2 is the cheapest left: its store does not answer
    assert orchestration.start_job(job.pk) == 0  # the copy is queued, not done here
    assert orchestration.copy_for_start(job.pk) == 0
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    assert orchestration.copy_for_start(job.pk) == 1

    new = Instance.objects.get(job=job, state="provisioning")
    assert new.pool.region.code == "eu-west-1"
    ready = TimelineEvent.objects.filter(job=job, kind="replica_ready").get()
    assert (ready.data["region"], ready.data["source"]) == ("eu-west-1", "us-east-1")
    assert "fetched from us-east-1" in ready.data["note"]


def test_deleting_a_finished_job_removes_its_checkpoints_everywhere_and_no_one_elses(
    trainer: Trainer,
    alice: Any,
    catalogue: dict[str, Any],
    regions: dict[str, Region],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A job of the same project shares the base's chunks and the step-10 adapter's.
    other = Trainer(submit(alice, catalogue), regions["us-east-1"])
    saved = [trainer.save(step) for step in (10, 20)]
    for checkpoint in saved:
        replication.copy_to_region(checkpoint, "us-west-2")
    kept = other.save(10)
    with replication.open_region("us-east-1", trainer.job) as store:
        own = set(store.load_manifest(saved[1].manifest_key).chunks())
        shared = set(store.load_manifest(kept.manifest_key).chunks())
    assert own - shared
    type(trainer.job).objects.filter(pk=trainer.job.pk).update(state="succeeded")
    sent: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(
        replication, "enqueue_on_commit", lambda task, *a, **kw: sent.append((task, a, kw))
    )
    key = trainer.job.checkpoint_key

    deleted, refused = replication.delete_finished_jobs(
        type(trainer.job).objects.filter(pk__in=[trainer.job.pk, other.job.pk]).order_by("pk")
    )

    assert (deleted, refused) == ([trainer.job.pk], [other.job.pk])
    assert not Checkpoint.objects.filter(pk__in=[c.pk for c in saved]).exists()
    args = (trainer.job.project.slug, key, ["eu-west-1", "us-east-1", "us-west-2"])
    assert sent == [("migration.tasks.forget_checkpoints_task", args, {})]
    assert tasks.forget_checkpoints_task(*args) == {"us-east-1": 0, "us-west-2": 0}
    for region in ("us-east-1", "us-west-2"):
        with replication.open_region(region, trainer.job) as store:
            assert store.list(key) == []
        assert not (store_root(region, trainer.job) / "jobs" / key).exists()
    assert (store_root("us-east-1", other.job) / "jobs" / other.job.checkpoint_key).is_dir()
    # Its chunks are younger than the grace period: the second run, after it, takes them.
    assert all(chunk_path("us-east-1", trainer.job, c).exists() for c in own - shared)
    later = (*args, False)
    assert sent[1:] == [
        ("migration.tasks.forget_checkpoints_task", later, {"countdown": 600.0 + 60.0})
    ]
    monkeypatch.setattr(replication, "RETENTION_GRACE_S", 0.0)
    removed = tasks.forget_checkpoints_task(*later)
    assert all(removed[region] >= trainer.changed_bytes for region in ("us-east-1", "us-west-2"))
    assert not any(chunk_path("us-east-1", trainer.job, c).exists() for c in own - shared)
    with replication.open_region("us-east-1", other.job) as store:
        store.verify(kept.manifest_key)  # whole, shared chunks included
    assert len(sent) == 2  # no third run
    assert replication.region_store("eu-west-1", trainer.job.project.slug).never_made


def test_a_deleted_jobs_checkpoints_in_an_unreachable_region_are_removed_on_a_later_try(
    trainer: Trainer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    replication.copy_to_region(trainer.save(10), "us-west-2")
    project, key = trainer.job.project.slug, trainer.job.checkpoint_key
    local_west = replication.region_store("us-west-2", project).url
    region_down("us-west-2", settings, monkeypatch)

    with pytest.raises(StoreError, match="not removed in us-west-2"):
        replication.forget_checkpoints(project, key, ["us-east-1", "us-west-2"], sweep_later=False)

    with replication.open_region("us-east-1", trainer.job) as store:
        assert store.list(key) == []  # the reachable region was done first
    settings.BATON_REGION_STORES = {"us-west-2": local_west.removesuffix(f"/{project}")}
    with replication.open_region("us-west-2", trainer.job) as store:
        assert store.list(key) != []
    replication.forget_checkpoints(project, key, ["us-east-1", "us-west-2"], sweep_later=False)
    with replication.open_region("us-west-2", trainer.job) as store:
        assert store.list(key) == []

"""Two tiers on the instance: periodic saves commit to the local tier and are uploaded to the
region's store in the background; emergency saves go straight to the region's store."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migration.agent.local_api import LocalEndpoint
from migration.checkpoint import LocalStore, ManifestRef, SaveCancelled, Store, StoreConfigError
from migration.checkpoint.sdk import Checkpointer
from migration.checkpoint.tiers import upload_after_exit

from .conftest import TEST_CHUNK, heads_of, new_s3_store
from .procs import in_forked_child
from .s3server import S3Server

MIB = 1024 * 1024
SMALL = 64 * 1024  # more than the packed small tensors of these states
JOB = "job-7"


class GatedStore(LocalStore):
    """A region store in a local folder whose chunk writes wait while `gate` is closed, like
    a store that has stopped answering for a while."""

    def __init__(self, root: Path, **options: Any) -> None:
        super().__init__(root, **options)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()  # set once a write is held at the gate

    def _write_chunk(self, chunk: str, data: memoryview) -> object | None:
        if not self.gate.is_set():
            self.waiting.set()
            self.gate.wait()
        return super()._write_chunk(chunk, data)


class Reports:
    """The agent's real local endpoint, recording the SDK's reports."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, object]]] = []
        self.endpoint = LocalEndpoint(self._on_report, lambda: {"advance": None, "final": None})

    def _on_report(self, kind: str, body: dict[str, object]) -> None:
        self.received.append((kind, body))

    def checkpoints(self) -> list[dict[str, object]]:
        return [body for kind, body in self.received if kind == "checkpoint"]


@pytest.fixture
def reports() -> Iterator[Reports]:
    recorder = Reports()
    recorder.endpoint.start()
    yield recorder
    recorder.endpoint.stop()


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalStore]:
    opened = LocalStore(tmp_path / "local", chunk_size=TEST_CHUNK)
    yield opened
    opened.close()


@pytest.fixture
def region(tmp_path: Path) -> Iterator[GatedStore]:
    opened = GatedStore(tmp_path / "region", chunk_size=TEST_CHUNK)
    yield opened
    opened.gate.set()
    opened.close()


def two_tiers(region: Store, local: Store, **options: Any) -> Checkpointer:
    options.setdefault("job", JOB)
    options.setdefault("every_steps", 1)
    options.setdefault("every_seconds", None)
    options.setdefault("install_signal_handlers", False)
    return Checkpointer(region, local_store=local, **options)


def model(seed: int, mib: int = 4) -> dict[str, Any]:
    """A state of two tensors: `frozen` never changes, `trained` changes with the seed."""
    rng = np.random.default_rng(seed)
    return {
        "frozen": np.arange(mib * MIB // 4, dtype=np.float32),
        "trained": rng.standard_normal(mib * MIB // 4).astype(np.float32),
    }


def steps(store: Store) -> list[int]:
    return [ref.step for ref in store.list(JOB)]


def chunk_bytes(store: LocalStore, *, recycled: bool = False) -> int:
    """The bytes of the store's chunk files, or of the files gc kept for saves to write over."""
    files = (store.root / "chunks").rglob(".recycled-*" if recycled else "[!.]*")
    return sum(path.stat().st_size for path in files if path.is_file())


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        time.sleep(0.01)


def test_a_periodic_save_returns_after_the_local_write_and_is_reported_after_its_upload(
    region: GatedStore, local: LocalStore, reports: Reports
) -> None:
    region.gate.clear()
    ckpt = two_tiers(region, local, agent_url=reports.endpoint.url)
    started = time.monotonic()
    assert ckpt.maybe_save(1, model(1), val_loss=0.25)
    ckpt.wait()  # what a save due next would wait for: the snapshot and the local write
    assert time.monotonic() - started < 10
    assert steps(local) == [1]
    region.waiting.wait(10)
    assert steps(region) == [] and ckpt.uploader is not None
    ckpt.reporter.flush()
    assert reports.checkpoints() == []  # the portal must not hear of it before the region has it

    region.gate.set()
    assert ckpt.uploader.drain(30)
    ckpt.close()
    assert steps(region) == [1]
    region.verify(region.list(JOB)[0])
    [report] = reports.checkpoints()
    assert report["manifest"] == ManifestRef(JOB, 1, "periodic").key
    assert report["kind"] == "periodic" and report["step"] == 1
    assert report["validation_reference"] == 0.25
    assert report["rank"] == 0 and report["world_size"] == 1
    # The tensors plus the small packed ones (the RNG states).
    assert 8 * MIB <= int(report["bytes_total"]) < 8 * MIB + SMALL  # type: ignore[call-overload]
    assert report["bytes_uploaded"] == report["bytes_total"]
    assert report["uploaded_by"] == "sdk"
    assert float(report["upload_seconds"]) > 0  # type: ignore[arg-type]


def test_the_region_store_receives_only_the_chunks_it_lacks(
    s3_env: S3Server, local: LocalStore, reports: Reports
) -> None:
    region = new_s3_store(s3_env)
    ckpt = two_tiers(region, local, agent_url=reports.endpoint.url)
    heads: list[str] = []
    for step in (1, 2):
        if step == 2:
            heads = heads_of(region)
        ckpt.maybe_save(step, model(step))
        ckpt.wait()
        assert ckpt.uploader is not None and ckpt.uploader.drain(60)
    ckpt.close()
    # After step 2's upload, its check asked whether step 1's upload is still up, not about
    # each frozen chunk (decision 005); only the new chunks were asked for, before upload.
    one, two = (region.load_manifest(ref).chunks() for ref in region.list(JOB))
    assert ManifestRef(JOB, 1, "periodic").key in heads
    assert not {region.chunk_key(chunk) for chunk in one if chunk in two} & set(heads)
    first, second = reports.checkpoints()
    assert first["bytes_uploaded"] == first["bytes_total"]
    # Step 2 changed the trained tensor only: its 4 MiB, not the frozen one again.
    assert 4 * MIB <= int(second["bytes_uploaded"]) < 4 * MIB + SMALL  # type: ignore[call-overload]
    assert [ref.step for ref in region.list(JOB)] == [1, 2]
    restored = two_tiers(region, LocalStore(local.root.with_name("elsewhere"))).restore()
    assert restored is not None and not restored.from_local_tier
    assert np.array_equal(restored.state["trained"], model(2)["trained"])
    region.close()


def test_after_a_move_an_emergency_save_asks_whether_the_restored_checkpoint_is_up(
    s3_env: S3Server, local: LocalStore, tmp_path: Path
) -> None:
    # The job moved: the new instance opens the region's store anew and restores from it. Its
    # emergency save straight into that store reuses the frozen chunks the restore read whole,
    # so its check asks whether the restored checkpoint is still up, not about each frozen
    # chunk, before or after its commit (decision 005).
    before = new_s3_store(s3_env)
    ckpt = two_tiers(before, local)
    ckpt.maybe_save(1, model(1))
    ckpt.wait()
    assert ckpt.uploader is not None and ckpt.uploader.drain(60)
    ckpt.close()
    before.close()
    region = new_s3_store(s3_env, prefix=before.prefix)
    elsewhere = LocalStore(tmp_path / "elsewhere", chunk_size=TEST_CHUNK)
    moved = two_tiers(region, elsewhere)
    restored = moved.restore()
    assert restored is not None and restored.step == 1 and not restored.from_local_tier
    heads = heads_of(region)
    moved.request_stop()
    assert moved.maybe_save(2, model(2), val_loss=0.5)
    moved.close()

    one, two = (region.load_manifest(ref) for ref in region.list(JOB))
    assert two.ref == ManifestRef(JOB, 2, "emergency")
    assert one.ref.key in heads
    frozen = {region.chunk_key(chunk) for chunk in one.chunks() if chunk in two.chunks()}
    assert frozen and not frozen & set(heads)
    again = two_tiers(region, elsewhere).restore()
    assert again is not None and again.step == 2
    assert np.array_equal(again.state["frozen"], model(2)["frozen"])
    region.close()
    elsewhere.close()


def test_an_emergency_save_stops_the_upload_in_flight_and_lands_in_the_region_store(
    region: GatedStore, local: LocalStore, reports: Reports
) -> None:
    region.gate.clear()
    ckpt = two_tiers(region, local, agent_url=reports.endpoint.url)
    ckpt.maybe_save(1, model(1))
    ckpt.wait()
    assert region.waiting.wait(10)  # the upload of step 1 is held half-way
    ckpt.request_stop()
    # The notice stops the upload at its next chunk; let the held write go on to see it.
    threading.Timer(0.2, region.gate.set).start()
    assert ckpt.maybe_save(2, model(2), val_loss=0.5)
    assert ckpt.should_stop
    ckpt.close()
    assert [(r.step, r.kind) for r in region.list(JOB)] == [(2, "emergency")]
    [report] = reports.checkpoints()
    assert report["kind"] == "emergency" and report["step"] == 2
    assert "uploaded_by" not in report  # committed in the region's store directly
    assert ckpt.uploader is not None and ckpt.uploader.uploads_done == 0
    restored = two_tiers(region, local).restore()
    assert restored is not None and restored.step == 2
    assert np.array_equal(restored.state["trained"], model(2)["trained"])


def test_a_child_forked_during_an_upload_saves_to_the_region_without_waiting_for_it(
    region: GatedStore, local: LocalStore
) -> None:
    """The upload in flight at a fork is the parent's: the child's save straight to the region
    does not wait for it to stop, and the parent's upload goes on (decision 073)."""
    region.gate.clear()
    ckpt = two_tiers(region, local)
    ckpt.maybe_save(1, model(1))
    ckpt.wait()
    assert region.waiting.wait(10)

    def save_in_the_child() -> None:
        region.gate.set()  # the child's copy of the gate
        ckpt.save(2, model(2))
        ckpt.close()

    code = in_forked_child(save_in_the_child, timeout=30)
    region.gate.set()
    assert ckpt.uploader is not None and ckpt.uploader.drain(30)
    ckpt.close()
    assert code == 0, "the child's save failed or never finished (-9)"
    assert steps(region) == [1, 2]
    region.verify(ManifestRef(JOB, 1, "periodic"))
    assert np.array_equal(
        region.load(ManifestRef(JOB, 2, "periodic")).state["trained"], model(2)["trained"]
    )


def test_uploads_that_lag_skip_to_the_newest_commit_and_the_local_tier_stays_small(
    region: GatedStore, local: LocalStore, reports: Reports
) -> None:
    region.gate.clear()
    ckpt = two_tiers(region, local, agent_url=reports.endpoint.url)
    for step in range(1, 7):
        ckpt.maybe_save(step, model(step))
        ckpt.wait()
        if step == 1:
            assert region.waiting.wait(10)  # its upload is in flight, held
        # The upload in flight (step 1) and the newest commit; nothing else stays.
        assert steps(local) == sorted({1, step})
        assert chunk_bytes(local) <= 2 * 8 * MIB
        # What the next save writes over: at most one checkpoint (so at most what a save
        # needs in new files anyway while the previous two are kept).
        assert chunk_bytes(local, recycled=True) <= 8 * MIB
    assert ckpt.uploader is not None and ckpt.uploader.uploads_skipped == 4
    region.gate.set()
    ckpt.close()  # waits for the upload of the newest commit
    assert steps(region) == [1, 6]  # 2 to 5 were skipped, never queued
    assert [r["step"] for r in reports.checkpoints()] == [1, 6]
    assert steps(local) == [6]
    assert chunk_bytes(local) <= 2 * 8 * MIB


def test_a_restore_on_the_same_machine_reads_the_local_tier(
    region: GatedStore, local: LocalStore, tmp_path: Path
) -> None:
    ckpt = two_tiers(region, local)
    ckpt.maybe_save(3, model(3))
    ckpt.close()
    key = ManifestRef(JOB, 3, "periodic").key
    same_machine = two_tiers(region, local, resume=key).restore()
    assert same_machine is not None and same_machine.from_local_tier
    assert np.array_equal(same_machine.state["trained"], model(3)["trained"])
    # Another machine's local tier does not have it: the region's store is read.
    elsewhere = LocalStore(tmp_path / "elsewhere", chunk_size=TEST_CHUNK)
    other = two_tiers(region, elsewhere, resume=key).restore()
    assert other is not None and not other.from_local_tier
    assert np.array_equal(other.state["trained"], model(3)["trained"])


def test_a_local_copy_that_is_not_the_regions_checkpoint_is_not_restored(
    region: GatedStore, local: LocalStore
) -> None:
    region.save(JOB, 3, model(3))
    local.save(JOB, 3, model(4))  # same key, other content
    restored = two_tiers(region, local).restore()
    assert restored is not None and not restored.from_local_tier
    assert np.array_equal(restored.state["trained"], model(3)["trained"])


def test_the_agent_uploads_what_the_local_tier_has_and_the_region_lacks(
    region: GatedStore, local: LocalStore
) -> None:
    region.save(JOB, 2, model(2))
    for step in (1, 2, 3, 4):
        local.save(JOB, step, model(step), validation_reference=float(step))
    environ = {
        "BATON_LOCAL_STORE_URL": local.url,
        "BATON_STORE_URL": region.url,
        "BATON_JOB_ID": JOB,
        "BATON_RANK": "0",
    }
    emitted: list[tuple[str, dict[str, object]]] = []

    def emit(event_type: str, **fields: object) -> None:
        emitted.append((event_type, fields))

    uploaded = upload_after_exit(environ, emit)
    assert [stats.manifest for stats in uploaded] == [
        ManifestRef(JOB, 3, "periodic").key,
        ManifestRef(JOB, 4, "periodic").key,
    ]
    assert steps(region) == [2, 3, 4]
    assert [(kind, fields["step"], fields["uploaded_by"]) for kind, fields in emitted] == [
        ("checkpoint", 3, "agent"),
        ("checkpoint", 4, "agent"),
    ]
    assert emitted[1][1]["validation_reference"] == 4.0
    # Nothing newer is left: a second pass uploads nothing.
    assert upload_after_exit(environ, emit) == []
    assert len(emitted) == 2
    assert upload_after_exit({"BATON_STORE_URL": region.url}, emit) == []


def test_a_cancelled_copy_leaves_no_manifest_in_the_target(
    local: LocalStore, region: GatedStore
) -> None:
    ref = local.save(JOB, 1, model(1)).ref
    calls = 0

    def cancel() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3

    with pytest.raises(SaveCancelled):
        local.copy(ref, region, cancel=cancel)
    assert region.list(JOB) == []
    assert local.copy(ref, region).manifest == ref.key
    assert steps(region) == [1]


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"BATON_LOCAL_STORE_URL": "file:///tmp/x"}, "BATON_STORE_URL is not"),
        (
            {"BATON_LOCAL_STORE_URL": "s3://bucket/x", "BATON_STORE_URL": "REGION"},
            "BATON_LOCAL_STORE_URL='s3://bucket/x'",
        ),
        (
            {"BATON_LOCAL_STORE_URL": "file://host/x", "BATON_STORE_URL": "REGION"},
            "BATON_LOCAL_STORE_URL: store URL",
        ),
        (
            {"BATON_LOCAL_STORE_URL": "REGION", "BATON_STORE_URL": "REGION"},
            "names the region's store itself",
        ),
    ],
)
def test_a_bad_local_tier_setting_names_the_variable(
    environ: dict[str, str], message: str, tmp_path: Path
) -> None:
    region_url = (tmp_path / "region").as_uri()
    environ = {k: v.replace("REGION", region_url) for k, v in environ.items()}
    with pytest.raises(StoreConfigError, match=message):
        Checkpointer.from_env(environ, install_signal_handlers=False)


def test_without_a_local_tier_a_periodic_save_commits_to_the_store(tmp_path: Path) -> None:
    environ = {"BATON_STORE_URL": (tmp_path / "region").as_uri(), "BATON_JOB_ID": JOB}
    ckpt = Checkpointer.from_env(environ, install_signal_handlers=False, every_steps=1)
    assert ckpt.local_store is None and ckpt.uploader is None
    ckpt.maybe_save(1, model(1, mib=1))
    ckpt.close()
    assert steps(ckpt.store) == [1]

"""The store contract: every test runs against the local folder store and the S3 store."""

from __future__ import annotations

import enum
import json
import os
import random
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migration.checkpoint import (
    CorruptChunk,
    CorruptManifest,
    GcStats,
    ManifestNotFound,
    ManifestRef,
    SaveCancelled,
    SaveResult,
    Store,
    StoreError,
)
from migration.checkpoint.s3 import S3Store
from migration.checkpoint.sdk import Checkpointer
from migration.checkpoint.snapshot import Snapshot

from .conftest import heads_of, new_s3_store, temporaries
from .procs import in_forked_child
from .s3server import S3Server

CHUNK = 1024 * 1024


def newest(store: Store, job: str) -> ManifestRef:
    """The latest committed checkpoint of `job`, which the test expects to exist."""
    ref = store.latest(job)
    assert ref is not None, f"no checkpoint of {job}"
    return ref


def make_state(seed: int = 0, mib: float = 3.0) -> dict[str, Any]:
    """A nested training-like state: one large tensor, small ones, optimizer with int keys."""
    rng = np.random.default_rng(seed)
    big = rng.standard_normal(int(mib * 1024 * 1024 / 4), dtype=np.float32)
    return {
        "model": {"w": big.reshape(-1, 256), "b": rng.standard_normal(256).astype(np.float32)},
        "optimizer": {
            "state": {0: {"m": np.zeros(256, np.float64), "step": np.int64(7)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 1]}],
        },
        "scheduler": {"last_epoch": 3, "name": "cosine"},
        "step": 12,
        "flags": np.array([True, False]),
        "blob": b"\x00\x01opaque",
        "empty": np.zeros((0, 4), np.int32),
    }


def flip_byte(store: Store, chunk: str, size: int, offset: int = 17) -> None:
    """Damage one stored chunk in place: one byte flipped, same name, same size."""
    buf = bytearray(size)
    store._read_chunk_into(chunk, memoryview(buf))
    buf[offset] ^= 0xFF
    token = store._write_chunk(chunk, memoryview(buf))
    store._finish_chunks([token] if token is not None else [])


def assert_same_state(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_state(x, y)
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a == b
    else:
        assert type(a) is type(b) and a == b


def test_a_saved_state_loads_back_identical(store: Store) -> None:
    state = make_state()
    extra = {"rng": np.random.RandomState(3).get_state(), "loader_offset": 12}
    result = store.save("job-1", 12, state, extra=extra, validation_reference=0.25)
    loaded = store.load(result.ref)
    assert_same_state(state, loaded.state)
    assert_same_state(extra, loaded.extra)
    assert loaded.step == 12


def test_the_manifest_records_what_a_restore_and_the_portal_need(store: Store) -> None:
    first = store.save("job-1", 5, make_state(), kind="periodic", world_size=2, rank=1)
    second = store.save(
        "job-1",
        9,
        make_state(),
        kind="emergency",
        parent=first.ref,
        rank=1,
        world_size=2,
        validation_reference=0.5,
        extra={"rng": (3, [1, 2], None)},
        meta={"note": "x"},
    )
    manifest = store.load_manifest(second.ref)
    assert manifest.format == 1
    assert (manifest.job, manifest.step, manifest.kind) == ("job-1", 9, "emergency")
    assert (manifest.rank, manifest.world_size) == (1, 2)
    assert manifest.parent == first.ref.key
    assert manifest.validation_reference == 0.5
    assert manifest.meta == {"note": "x"}
    assert manifest.created.tzinfo is not None
    assert abs((datetime.now(UTC) - manifest.created).total_seconds()) < 60
    w = manifest.tensors["state/model/w"]
    assert (w["dtype"], w["shape"]) == ("<f4", [3 * 1024, 256])
    assert [size for _, size in w["chunks"]] == [store.chunk_size] * 3
    assert manifest.tensors["state/model/b"]["pack"] >= 0
    assert manifest.bytes_total == second.bytes_total > 3 * 1024 * 1024
    assert second.ref.key == "jobs/job-1/manifests/000000000009-emergency-r1.json"


def test_a_save_says_how_much_of_its_time_went_to_writing_and_how_much_to_the_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = store._commit_manifest

    def slow_commit(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)
        commit(*args, **kwargs)

    monkeypatch.setattr(store, "_commit_manifest", slow_commit)
    result = store.save("job-1", 1, make_state())
    # The commit's time (the new chunks made durable, the manifest written) is not counted
    # as writing; every chunk was written before it began.
    assert 0 < result.write_seconds <= result.seconds - 0.3
    assert store.load_manifest(result.ref).chunks_new == result.chunks_new > 0


def test_list_is_ascending_and_latest_is_the_newest_commit(store: Store) -> None:
    assert store.list("job-1") == []
    assert store.latest("job-1") is None
    for step in (30, 10, 20):
        store.save("job-1", step, {"x": np.arange(step)})
    store.save("job-1", 20, {"x": np.arange(20)}, kind="emergency")
    store.save("job-2", 99, {"x": np.arange(3)})
    steps = [(r.step, r.kind) for r in store.list("job-1")]
    assert steps == [(10, "periodic"), (20, "periodic"), (20, "emergency"), (30, "periodic")]
    assert store.latest("job-1") == ManifestRef("job-1", 30, "periodic", 0)
    assert store.jobs() == ["job-1", "job-2"]


def test_latest_ignores_a_checkpoint_cut_off_before_its_manifest(store: Store) -> None:
    store.save("job-1", 1, make_state(0))
    calls = 0

    def cancel_half_way() -> bool:
        nonlocal calls
        calls += 1
        return calls > 2

    snapshot = Snapshot.capture(make_state(1), copy=False)
    with pytest.raises(SaveCancelled):
        store.commit("job-1", 2, snapshot, cancel=cancel_half_way)
    assert [r.step for r in store.list("job-1")] == [1]
    assert store.latest("job-1") == ManifestRef("job-1", 1, "periodic", 0)
    store.verify(newest(store, "job-1"))


def test_an_unchanged_tensor_is_not_written_again(store: Store) -> None:
    state = make_state(0, mib=4)
    first = store.save("job-1", 1, state)
    assert first.bytes_new >= 4 * 1024 * 1024
    state["model"]["b"] = state["model"]["b"] + 1  # only a small tensor changes
    second = store.save("job-1", 2, state)
    assert second.bytes_new < 64 * 1024
    assert second.bytes_total == first.bytes_total
    w = state["model"]["w"]
    w[:1] += 1  # touches the first chunk of the large tensor only
    third = store.save("job-1", 3, state)
    assert store.chunk_size <= third.bytes_new < store.chunk_size + 64 * 1024
    assert_same_state(state, store.load(third.ref).state)


def test_an_emergency_save_of_unchanged_tensors_adds_nothing_and_leaves_nothing(
    store: Store, tmp_path: Path
) -> None:
    # An emergency save writes new chunks while hashing them (local store): a chunk the store
    # already holds is then dropped, never stored twice or left behind half-named.
    state = make_state(0, mib=4)
    store.save("job-1", 1, state)
    emergency = store.save("job-1", 1, state, kind="emergency")

    assert emergency.bytes_new < 64 * 1024
    assert store.latest("job-1") == emergency.ref
    assert_same_state(state, store.load(emergency.ref).state)
    store.verify(emergency.ref)
    assert temporaries(tmp_path) == []


def test_verify_names_a_chunk_with_a_flipped_byte(store: Store) -> None:
    result = store.save("job-1", 1, make_state())
    assert store.verify(result.ref).chunks == result.chunks_total
    chunk, size = result.manifest.tensors["state/model/w"]["chunks"][1]
    flip_byte(store, chunk, size)
    with pytest.raises(CorruptChunk) as caught:
        store.verify(result.ref)
    assert caught.value.chunk == chunk
    assert chunk in str(caught.value) and "state/model/w" in str(caught.value)
    with pytest.raises(CorruptChunk):
        store.load(result.ref)


def test_verify_names_a_missing_chunk(store: Store) -> None:
    result = store.save("job-1", 1, make_state())
    chunk, _ = result.manifest.tensors["state/model/w"]["chunks"][2]
    store._delete([store.chunk_key(chunk)])
    with pytest.raises(CorruptChunk, match="missing") as caught:
        store.verify(result.ref)
    assert caught.value.chunk == chunk


def test_a_damaged_manifest_is_reported_not_loaded(store: Store) -> None:
    result = store.save("job-1", 1, make_state())
    body = json.loads(store._get_object(result.ref.key))
    body["step"] = 2
    store._put_object(result.ref.key, json.dumps(body).encode())
    with pytest.raises(CorruptManifest, match="checksum"):
        store.load_manifest(result.ref)
    with pytest.raises(ManifestNotFound):
        store.load_manifest(ManifestRef("job-1", 7, "final", 0))


def test_a_manifest_with_its_checksum_among_the_sorted_fields_is_still_read(store: Store) -> None:
    # How manifests were laid out before the checksum went first: stores keep them.
    result = store.save("job-1", 1, make_state())
    body = json.loads(store._get_object(result.ref.key))
    store._put_object(
        result.ref.key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    )
    assert store.load_manifest(result.ref) == result.manifest
    assert_same_state(make_state(), store.load(result.ref).state)


def test_gc_keeps_the_newest_and_only_chunks_still_referenced(store: Store) -> None:
    shared = np.full(CHUNK // 8, 3.0)
    for step in range(1, 5):
        store.save("job-1", step, {"shared": shared, "own": np.full(CHUNK // 8, float(step))})
    store.save("job-2", 1, {"shared": shared, "own": np.full(CHUNK // 8, 1.0)})
    before = {c for c, _, _ in store._iter_chunks()}
    stats = store.gc("job-1", keep=2, grace_s=0)
    assert [r.step for r in store.list("job-1")] == [3, 4]
    assert len(stats.manifests_removed) == 2
    after = {c for c, _, _ in store._iter_chunks()}
    # Steps 1 and 2 owned one chunk each; step 1's content is still used by job-2.
    assert len(before - after) == stats.chunks_removed == 1
    for ref in store.list("job-1") + store.list("job-2"):
        store.verify(ref)


def test_gc_spares_unreferenced_chunks_younger_than_its_grace_period(store: Store) -> None:
    for step in range(1, 4):
        store.save("job-1", step, {"own": np.full(CHUNK // 8, float(step))})
    stats = store.gc("job-1", keep=1, grace_s=3600)
    assert len(stats.manifests_removed) == 2
    assert stats.chunks_removed == 0


def test_removing_a_job_leaves_nothing_of_it_and_keeps_the_others(store: Store) -> None:
    shared = np.full(CHUNK // 8, 3.0)
    for step in (1, 2):
        store.save("job-1", step, {"shared": shared, "own": np.full(CHUNK // 8, float(step))})
    kept = store.save("job-2", 1, {"shared": shared})
    before = {c for c, _, _ in store._iter_chunks()}

    stats = store.remove_job("job-1", grace_s=0)

    assert store.list("job-1") == [] and len(stats.manifests_removed) == 2
    assert store._list_dirs("jobs/") == ["job-2"]
    # Steps 1 and 2 owned one chunk each; the shared one stays with job-2.
    assert len(before - {c for c, _, _ in store._iter_chunks()}) == stats.chunks_removed == 2
    store.verify(kept.ref)


def test_a_removed_jobs_folder_stays_while_it_holds_a_young_temporary(tmp_path: Path) -> None:
    from migration.checkpoint import LocalStore

    store = LocalStore(tmp_path / "store", chunk_size=CHUNK)
    store.save("job-1", 1, make_state(0, mib=2))
    folder = tmp_path / "store" / "jobs" / "job-1"
    leftover = folder / "manifests" / f".{'0' * 12}-periodic-r0.json.tmp-1-aaaa"
    leftover.write_bytes(b"partial")  # a save cut short, or one still writing

    store.remove_job("job-1", grace_s=600)
    assert leftover.exists() and store.list("job-1") == []

    an_hour_ago = time.time() - 3600
    os.utime(leftover, (an_hour_ago, an_hour_ago))
    store.remove_job("job-1", grace_s=600)
    assert not folder.exists()


def _gc_with_a_save_after_its_listing(
    store: Store, retired: dict[str, Any]
) -> tuple[GcStats, ManifestRef]:
    """`gc("job-1", keep=1, grace_s=0)` with a save of `retired` by job-2 between gc's listing
    of the chunks and its removal of them: (gc's stats, the save's checkpoint)."""
    listing = store._iter_chunks
    reused: list[ManifestRef] = []

    def listing_then_a_save() -> Any:
        yield from listing()
        reused.append(store.save("job-2", 1, retired).ref)

    store._iter_chunks = listing_then_a_save  # type: ignore[method-assign]
    return store.gc("job-1", keep=1, grace_s=0), reused[0]


def test_gc_keeps_an_old_chunk_a_save_reuses_after_gc_listed_it(tmp_path: Path) -> None:
    # gc lists the chunks no manifest references, then removes them; a save in another process
    # may reuse one of them in between (it finds the chunk present, so it does not write it).
    from migration.checkpoint import LocalStore

    store = LocalStore(tmp_path / "store", chunk_size=CHUNK)
    retired = {"own": np.full(CHUNK // 8, 1.0)}
    store.save("job-1", 1, retired)
    store.save("job-1", 2, {"own": np.full(CHUNK // 8, 2.0)})
    stats, reused = _gc_with_a_save_after_its_listing(store, retired)

    assert len(stats.manifests_removed) == 1
    assert stats.chunks_removed == 0  # the one unreferenced chunk was reused
    assert store.load_manifest(reused).bytes_new == 0
    store.verify(reused)
    assert temporaries(tmp_path / "store") == []


def _saved_then_moved_aside(tmp_path: Path) -> tuple[Store, SaveResult, Path, Path]:
    """A store's one-chunk checkpoint whose chunk gc has moved aside: (store, save, the
    chunk's path, where it is aside)."""
    from migration.checkpoint import LocalStore
    from migration.checkpoint.local import _gc_aside

    store = LocalStore(tmp_path / "store", chunk_size=CHUNK)
    result = store.save("job-1", 1, {"own": np.full(CHUNK // 8, 1.0)})
    [chunk] = result.manifest.chunks()
    path = store._chunk_path(chunk)
    aside = _gc_aside(path)
    os.rename(path, aside)
    return store, result, path, aside


def test_a_read_waits_for_a_chunk_gc_has_moved_aside_while_it_decides(tmp_path: Path) -> None:
    # gc moves an unreferenced chunk aside, then puts it back if a save reused it meanwhile; a
    # restore of that save's checkpoint in between must not find the chunk missing.
    store, result, path, aside = _saved_then_moved_aside(tmp_path)
    threading.Timer(0.2, os.rename, (aside, path)).start()  # gc puts it back
    store.verify(result.ref)

    os.rename(path, aside)
    threading.Timer(0.2, os.unlink, (aside,)).start()  # gc removes it
    with pytest.raises(CorruptChunk, match="missing"):
        store.verify(result.ref)
    store.close()


def test_a_read_finds_a_chunk_gc_put_back_just_after_the_read_missed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The open misses the chunk (it is aside), and gc puts it back before the read looks for
    # it aside: the read must look at the chunk again, not call it missing.
    store, result, path, aside = _saved_then_moved_aside(tmp_path)
    glob = Path.glob

    def put_back_then_look(folder: Path, pattern: str) -> Any:
        if aside.exists():
            os.rename(aside, path)
        return glob(folder, pattern)

    monkeypatch.setattr(Path, "glob", put_back_then_look)
    store.verify(result.ref)
    os.unlink(path)
    with pytest.raises(CorruptChunk, match="missing"):
        store.verify(result.ref)
    store.close()


def _retired_chunk_in_s3(server: S3Server) -> tuple[S3Store, dict[str, Any], str]:
    """An S3 store where job-1 saved `retired` at step 1 and other content at step 2, so that
    `gc("job-1", keep=1)` finds the one chunk of `retired` unreferenced: (store, retired, its
    chunk)."""
    store = new_s3_store(server, chunk_size=CHUNK)
    retired = {"own": np.full(CHUNK // 8, 1.0)}
    [chunk] = store.save("job-1", 1, retired).manifest.chunks()
    store.save("job-1", 2, {"own": np.full(CHUNK // 8, 2.0)})
    return store, retired, chunk


def trash_of(store: S3Store) -> list[str]:
    """The objects in an S3 store's gc trash."""
    return [obj["Key"] for page in store._pages("trash/") for obj in page.get("Contents", [])]


def test_s3_gc_puts_back_a_chunk_a_save_reused_during_its_sweep(s3_env: S3Server) -> None:
    # S3 has no rename to move a chunk aside: the save finds the listed chunk present and
    # commits a manifest naming it before gc deletes it. gc reads the manifests again after
    # its deletes and puts that chunk back from its trash.
    store, retired, chunk = _retired_chunk_in_s3(s3_env)
    stats, reused = _gc_with_a_save_after_its_listing(store, retired)

    assert stats.chunks_removed == 0
    assert store._has_chunk(chunk)
    assert store.load_manifest(reused).bytes_new == 0
    store.verify(reused)
    assert trash_of(store) == []
    store.close()


def test_an_s3_save_whose_reused_chunk_gc_removed_commits_nothing(s3_env: S3Server) -> None:
    # gc runs whole between the save's presence check and its manifest: it cannot see the
    # manifest, so the chunk goes. The save finds it gone after its commit and withdraws the
    # manifest; saving again uploads the chunk.
    store, retired, chunk = _retired_chunk_in_s3(s3_env)
    put_object = store._put_object
    collected: list[int] = []

    def gc_then_put(key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        if key.startswith("jobs/job-2/") and not collected:
            collected.append(store.gc("job-1", keep=1, grace_s=0).chunks_removed)
        put_object(key, data, metadata)

    store._put_object = gc_then_put  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="gc removed 1 chunk"):
        store.save("job-2", 1, retired)
    assert collected == [1]
    assert store.list("job-2") == []
    assert not store._has_chunk(chunk)

    again = store.save("job-2", 1, retired)
    assert again.manifest.bytes_new == CHUNK
    store.verify(again.ref)
    store.close()


def test_s3_gc_that_cannot_read_the_manifests_again_puts_every_chunk_back(
    s3_env: S3Server,
) -> None:
    # Not knowing what a save committed during its deletes, gc must not leave any chunk out.
    store, _, chunk = _retired_chunk_in_s3(s3_env)
    named_chunks = store._named_chunks
    looks: list[int] = []

    def fails_the_second_time() -> Any:
        looks.append(1)
        if len(looks) == 2:
            raise StoreError("the manifests cannot be read")
        return named_chunks()

    store._named_chunks = fails_the_second_time  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="cannot be read"):
        store.gc("job-1", keep=1, grace_s=0)
    assert store._has_chunk(chunk)
    assert trash_of(store) == []
    store.close()


def test_s3_gc_puts_back_the_chunks_of_a_sweep_that_died(s3_env: S3Server) -> None:
    # A gc killed between its deletes and its second look at the manifests leaves the chunks
    # in its trash; the next gc puts them back and decides about them again.
    store = new_s3_store(s3_env, chunk_size=CHUNK)
    kept = store.save("job-1", 1, {"own": np.full(CHUNK // 8, 1.0)})
    [chunk] = kept.manifest.chunks()
    died = "trash/0000000001-deadbeef/"
    assert store._copy(store.chunk_key(chunk), died + chunk)
    store._delete([store.chunk_key(chunk)])

    store.gc("job-1", keep=1, grace_s=0)

    store.verify(kept.ref)
    assert trash_of(store) == []
    store.close()


def _frozen_base_in_s3(server: S3Server) -> tuple[S3Store, dict[str, Any], SaveResult]:
    """An S3 store where job-1 saved a state of eight chunks at step 1: (store, the state, the
    save)."""
    store = new_s3_store(server, chunk_size=CHUNK)
    base = {"base": np.arange(CHUNK, dtype=np.float64)}
    first = store.save("job-1", 1, base)
    assert first.manifest.chunks_total == 8
    return store, base, first


def test_an_s3_save_asks_whether_the_save_it_reused_chunks_from_is_up_not_each_chunk(
    s3_env: S3Server,
) -> None:
    # A job with a large frozen base saves the same chunks at every checkpoint. The store
    # committed those chunks before and found them present after that commit: while that
    # manifest is still up and no gc is sweeping, the new save's check asks for that manifest
    # only, one HEAD instead of one per chunk (decision 005).
    store, base, first = _frozen_base_in_s3(s3_env)
    heads = heads_of(store)
    second = store.save("job-1", 2, base)

    assert second.manifest.chunks_new == 0
    assert heads == [first.ref.key]
    heads.clear()
    third = store.save("job-1", 3, base)
    assert heads == [second.ref.key]
    store.verify(third.ref)
    store.close()


def test_an_s3_save_checks_each_reused_chunk_while_a_gc_sweeps(s3_env: S3Server) -> None:
    # A sweep's trash holds chunks between its deletes and its second look at the manifests;
    # while it does, a manifest being up says nothing about the chunks it names.
    store, base, first = _frozen_base_in_s3(s3_env)
    chunk = next(iter(first.manifest.chunks()))
    assert store._copy(store.chunk_key(chunk), f"trash/{int(time.time()):010d}-0000beef/{chunk}")
    heads = heads_of(store)
    store.save("job-1", 2, base)

    assert sorted(heads) == sorted(store.chunk_key(c) for c in first.manifest.chunks())
    store.close()


def test_an_s3_save_checks_each_reused_chunk_when_the_earlier_manifest_was_put_again(
    s3_env: S3Server,
) -> None:
    # Another writer put the earlier step again under the same key: that object is not the
    # commit this store checked, so its being up says nothing.
    store, base, first = _frozen_base_in_s3(s3_env)
    other = new_s3_store(s3_env, prefix=store.prefix, chunk_size=CHUNK)
    other.save("job-1", 1, base)
    other.close()
    heads = heads_of(store)
    store.save("job-1", 2, base)

    assert first.ref.key in heads
    assert sorted(k for k in heads if k != first.ref.key) == sorted(
        store.chunk_key(c) for c in first.manifest.chunks()
    )
    store.close()


@pytest.mark.parametrize("read", ["load", "verify"])
def test_an_s3_store_opened_anew_asks_at_its_first_save_whether_what_it_read_is_up(
    s3_env: S3Server, read: str
) -> None:
    # A store opened anew, on the instance a job moved to, has committed nothing. Reading a
    # checkpoint whole after its manifest was up finds its chunks present after that commit,
    # as the check after a commit does: its first save that reuses them asks for that
    # manifest, and about no chunk (decision 005).
    store, base, first = _frozen_base_in_s3(s3_env)
    store.close()
    moved = new_s3_store(s3_env, prefix=store.prefix, chunk_size=CHUNK)
    getattr(moved, read)(first.ref)
    heads = heads_of(moved)
    second = moved.save("job-1", 2, base)

    assert second.manifest.chunks_new == 0
    assert heads == [first.ref.key]
    moved.close()


def test_an_s3_store_asks_about_each_chunk_it_read_under_a_manifest_without_a_commit_id(
    s3_env: S3Server,
) -> None:
    # A manifest put by an older writer carries no commit id, so its being up cannot be told
    # from its being put again since: having read it whole vouches for no chunk at a save.
    # The chunks are known present, so the save asks about each once, after its commit.
    store, base, first = _frozen_base_in_s3(s3_env)
    raw = store._get_object(first.ref.key)
    store._client.put_object(Bucket=store.bucket, Key=store._key(first.ref.key), Body=raw)
    store.close()
    moved = new_s3_store(s3_env, prefix=store.prefix, chunk_size=CHUNK)
    moved.load(first.ref)
    heads = heads_of(moved)
    moved.save("job-1", 2, base)

    assert sorted(heads) == sorted(moved.chunk_key(c) for c in first.manifest.chunks())
    moved.close()


def test_an_s3_restore_that_failed_vouches_for_none_of_its_chunks(s3_env: S3Server) -> None:
    # A chunk is gone: the restore fails, and the next save writes that chunk again instead of
    # trusting what the restore read before it failed.
    store, base, first = _frozen_base_in_s3(s3_env)
    store.close()
    moved = new_s3_store(s3_env, prefix=store.prefix, chunk_size=CHUNK)
    gone = sorted(first.manifest.chunks())[3]
    moved._delete([moved.chunk_key(gone)])
    with pytest.raises(CorruptChunk):
        moved.load(first.ref)
    second = moved.save("job-1", 2, base)

    assert second.manifest.chunks_new == 1
    moved.verify(second.ref)
    moved.close()


def test_an_s3_save_does_not_trust_an_earlier_manifest_while_gc_reads_the_manifests_again(
    s3_env: S3Server,
) -> None:
    # The interleaving the trash is listed for. gc lists the manifests, then the save M commits
    # and finds the old chunk present; gc deletes that chunk and starts its second look, which
    # lists M's job before the next save N commits and reads M after retention removed M. gc
    # then puts nothing back. N reused the chunk because M named it: M being up when N checks
    # must not pass N.
    saver = new_s3_store(s3_env, chunk_size=CHUNK)
    sweeper = new_s3_store(s3_env, prefix=saver.prefix, chunk_size=CHUNK)
    state = {"own": np.full(CHUNK // 8, 1.0)}
    retired = saver.save("job-0", 1, state)
    [chunk] = retired.manifest.chunks()
    saver._delete([retired.ref.key])  # nothing names the chunk now
    saved: dict[str, SaveResult] = {}
    refused: list[StoreError] = []

    iter_chunks = sweeper._iter_chunks

    def commit_m_then_list() -> Any:
        saved["M"] = saver.save("job-1", 1, state)
        return iter_chunks()

    named_chunks = sweeper._named_chunks
    looks: list[int] = []

    def counted() -> Any:
        looks.append(1)
        return named_chunks()

    load_manifest = sweeper.load_manifest

    def commit_n_and_retire_m_then_load(ref: Any) -> Any:
        if len(looks) == 2 and not refused and "N" not in saved:
            try:
                saved["N"] = saver.save("job-1", 2, state)
            except StoreError as exc:
                refused.append(exc)
            saver._delete([saved["M"].ref.key])
        return load_manifest(ref)

    sweeper._iter_chunks = commit_m_then_list  # type: ignore[method-assign]
    sweeper._named_chunks = counted  # type: ignore[method-assign]
    sweeper.load_manifest = commit_n_and_retire_m_then_load  # type: ignore[method-assign]
    stats = sweeper.gc("job-9", keep=1, grace_s=0)

    assert stats.chunks_removed == 1
    assert not saver._has_chunk(chunk)
    assert "N" not in saved and len(refused) == 1
    assert "gc removed 1 chunk" in str(refused[0])
    assert saver.list("job-1") == []
    saver.close()
    sweeper.close()


def test_gc_removes_a_listed_chunk_that_nothing_reused(tmp_path: Path) -> None:
    from migration.checkpoint import LocalStore

    store = LocalStore(tmp_path / "store", chunk_size=CHUNK)
    store.save("job-1", 1, {"own": np.full(CHUNK // 8, 1.0)})
    store.save("job-1", 2, {"own": np.full(CHUNK // 8, 2.0)})

    stats = store.gc("job-1", keep=1, grace_s=0)

    assert stats.chunks_removed == 1 and stats.bytes_removed == CHUNK
    assert len(list(store._iter_chunks())) == 1
    assert temporaries(tmp_path / "store") == []


def test_copy_sends_only_the_chunks_the_target_lacks(store: Store, other_store: Store) -> None:
    state = make_state(0, mib=4)
    first = store.save("job-1", 1, state)
    stats = store.copy(first.ref, other_store)
    assert stats.chunks_copied == first.chunks_total and stats.chunks_skipped == 0
    assert stats.bytes_copied == sum(first.manifest.chunks().values())
    state["model"]["w"][:1] = 0.0
    second = store.save("job-1", 2, state)
    stats = store.copy(second.ref, other_store)
    # The changed chunk of the large tensor, and the pack of small tensors (unchanged here).
    assert stats.chunks_copied == 1 and stats.bytes_copied == store.chunk_size
    assert stats.chunks_skipped == second.chunks_total - 1
    assert other_store.latest("job-1") == second.ref
    other_store.verify(second.ref)
    assert_same_state(state, other_store.load(second.ref).state)
    again = store.copy(second.ref, other_store)
    assert again.chunks_copied == 0 and again.bytes_copied == 0


def test_copy_refuses_to_replicate_a_corrupt_chunk(store: Store, other_store: Store) -> None:
    result = store.save("job-1", 1, make_state())
    chunk, size = result.manifest.tensors["state/model/w"]["chunks"][0]
    flip_byte(store, chunk, size)
    with pytest.raises(CorruptChunk):
        store.copy(result.ref, other_store)
    assert other_store.latest("job-1") is None


def test_a_forked_child_saves_with_the_store_its_parent_started(store: Store) -> None:
    """A child forked after the store's threads started (a sweep's trial, a data loader's
    worker) gets threads of its own, even when a thread of the parent held the store's lock at
    the fork; the parent's threads go on serving the parent."""
    store.save("job-1", 1, make_state(1))

    def save_and_load() -> None:
        result = store.save("job-1", 2, make_state(2))
        assert_same_state(make_state(2)["model"], store.load(result.ref).state["model"])

    with store._pool_lock:  # as a parent thread starting the pools would hold it at the fork
        code = in_forked_child(save_and_load)
    assert code == 0, "the forked child's save failed or never finished (-9)"
    assert newest(store, "job-1").step == 2
    third = store.save("job-1", 3, make_state(3))
    assert_same_state(make_state(3)["model"], store.load(third.ref).state["model"])


def test_latest_complete_waits_for_every_rank_of_the_gang(store: Store) -> None:
    for rank in (0, 1):
        store.save("job-1", 10, {"x": np.arange(3)}, rank=rank, world_size=2)
    store.save("job-1", 20, {"x": np.arange(3)}, rank=0, world_size=2)
    assert newest(store, "job-1").step == 20
    assert store.latest_complete("job-1", 2) == ManifestRef("job-1", 10, "periodic", 0)


def write_tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "model.bin").write_bytes(np.random.default_rng(0).bytes(3 * CHUNK + 123))
    (root / "sub" / "opt.bin").write_bytes(b"optimizer" * 1000)
    (root / "sub" / "deeper" / "tiny.txt").write_text("step=3\n")
    (root / "sub" / "deeper" / "zero").write_bytes(b"")
    os.chmod(root / "sub" / "opt.bin", 0o600)
    os.symlink("model.bin", root / "latest")


def test_a_directory_restores_identical(store: Store, tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    write_tree(src)
    result = store.save_directory("job-d", src, 3, "periodic")
    assert result.bytes_total == 3 * CHUNK + 123 + 9000 + 7
    store.verify(result.ref)
    dst.mkdir()
    (dst / "stale.ckpt").write_text("from a previous life")
    stats = store.restore_directory(result.ref, dst)
    assert stats.removed == 1 and not (dst / "stale.ckpt").exists()
    for rel in ("model.bin", "sub/opt.bin", "sub/deeper/tiny.txt", "sub/deeper/zero"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
        assert (dst / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns
    assert (dst / "sub" / "opt.bin").stat().st_mode & 0o777 == 0o600
    assert (dst / "empty").is_dir()
    assert os.readlink(dst / "latest") == "model.bin"
    again = store.restore_directory(result.ref, dst)
    assert again.files_written == 0 and again.files_unchanged == 5


def test_a_directory_snapshot_uploads_only_what_changed(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_tree(src)
    old = time.time() - 60  # old enough to be trusted by size and modification time
    for path in src.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.utime(path, (old, old))
    first = store.save_directory("job-d", src, 1, "periodic")
    second = store.save_directory("job-d", src, 2, "periodic")
    assert second.bytes_new == 0
    assert second.manifest.parent == first.ref.key
    with open(src / "model.bin", "ab") as f:  # a log-like file that only grows
        f.write(b"x" * CHUNK)
    (src / "new.bin").write_bytes(b"n" * 1000)
    third = store.save_directory("job-d", src, 3, "emergency")
    # The old tail chunk grew and a new chunk follows it; the rest of model.bin is reused.
    assert third.bytes_new <= 2 * CHUNK + 1000 + 123
    assert third.bytes_new < third.bytes_total / 2
    dst = tmp_path / "dst"
    store.restore_directory(third.ref, dst)
    assert (dst / "model.bin").read_bytes() == (src / "model.bin").read_bytes()
    assert (dst / "new.bin").read_bytes() == b"n" * 1000


def test_a_directory_restore_fails_on_a_corrupt_chunk_and_leaves_no_half_file(
    store: Store, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_tree(src)
    result = store.save_directory("job-d", src, 1, "periodic")
    assert result.manifest.files is not None
    chunk, size = result.manifest.files["model.bin"]["chunks"][1]
    flip_byte(store, chunk, size)
    dst = tmp_path / "dst"
    with pytest.raises(CorruptChunk) as caught:
        store.restore_directory(result.ref, dst)
    assert caught.value.chunk == chunk
    assert not (dst / "model.bin").exists()
    assert [p.name for p in dst.iterdir() if p.name.startswith(".baton-tmp-")] == []


def test_tensors_of_every_size_and_layout_round_trip(store: Store) -> None:
    rng = np.random.default_rng(9)
    sizes = [0, 1, 4095, 4097, CHUNK - 1, CHUNK + 5, CHUNK + CHUNK // 2 + 3, 300_001]
    state: dict[str, object] = {f"u8_{n}": rng.integers(0, 255, n, dtype=np.uint8) for n in sizes}
    state["strided"] = np.arange(400_000, dtype=np.float64)[::3]  # not contiguous
    state["fortran"] = np.asfortranarray(rng.random((300, 200)))
    state["half"] = rng.random(70_000).astype(np.float16)
    state["complex"] = (rng.random(50_000) + 1j * rng.random(50_000)).astype(np.complex64)
    state["mask"] = rng.random(100_003) > 0.5
    state["scalar"] = np.float32(2.5)
    result = store.save("job-1", 1, state)
    loaded = store.load(result.ref).state
    for name, value in state.items():
        assert np.array_equal(np.asarray(loaded[name]), np.asarray(value)), name
        assert np.asarray(loaded[name]).dtype == np.asarray(value).dtype, name
    assert type(loaded["scalar"]) is np.float32
    store.verify(result.ref)


def test_sequences_mixing_plain_values_and_tensors_load_back_each_in_its_place(
    store: Store,
) -> None:
    class Level(enum.IntEnum):
        HIGH = 2

    weights = np.arange(10, dtype=np.float32)
    state = {
        "mixed": [1, "two", weights, 3.5, None, True, Level.HIGH, (4, weights * 2, b"raw")],
        "python_rng": random.Random(5).getstate(),
    }
    result = store.save("job-1", 1, state)
    assert sorted(result.manifest.tensors) == ["state/mixed/2", "state/mixed/7/1"]
    loaded = store.load(result.ref).state
    assert_same_state({**state, "mixed": [*state["mixed"][:6], 2, *state["mixed"][7:]]}, loaded)


def medium_state() -> dict[str, np.ndarray]:
    """Tensors that train between the small limit and the pack's, one frozen of that size and
    a small one: what a model of many modest layers looks like."""
    rng = np.random.default_rng(4)
    state = {f"layer{i}": rng.random(75_000 + 7 * i, dtype=np.float32) for i in range(6)}
    frozen = rng.random(100_000, dtype=np.float32)
    frozen.flags.writeable = False
    state["frozen"] = frozen
    state["bias"] = rng.random(100, dtype=np.float32)
    return state


def test_modest_tensors_that_train_share_the_packs_chunks(store: Store) -> None:
    state = medium_state()
    result = store.save("job-1", 1, state)  # reads the live tensors, copies nothing
    tensors = result.manifest.tensors
    assert all("pack" in tensors[f"state/layer{i}"] for i in range(6))
    assert "chunks" in tensors["state/frozen"]  # its own chunks, skipped while it stays frozen
    pack = result.manifest.pack
    assert pack is not None
    assert result.manifest.chunks_total == -(-pack["nbytes"] // CHUNK) + 1
    assert_same_state(state, store.load(result.ref).state)
    store.verify(result.ref)
    # A save that copies the state first (as an asynchronous one does) lays the pack out the
    # same, so it finds every chunk already stored.
    copied = Snapshot.capture(state, copy=True)
    again = store.commit("job-1", 2, copied)
    assert again.bytes_new == 0
    assert again.manifest.pack == pack


@pytest.mark.parametrize(("chunk_size", "packed"), [(16 * CHUNK, True), (CHUNK, False)])
def test_tensors_that_train_join_the_pack_up_to_the_stores_chunk_size(
    tmp_path: Path, chunk_size: int, packed: bool
) -> None:
    from migration.checkpoint import LocalStore

    # 2 MiB tensors: packed where a chunk holds several of them, their own chunks where each
    # fills two chunks anyway.
    state = {f"layer{i}": np.full(CHUNK // 2, i, np.float32) for i in range(3)}
    store = LocalStore(tmp_path / "store", chunk_size=chunk_size)
    saved = store.save("job-1", 1, state)
    ckpt = Checkpointer(store, job="job-1", async_save=False, install_signal_handlers=False)
    for manifest in (saved.manifest, ckpt.save(2, state).manifest):
        assert [("pack" in manifest.tensors[f"state/layer{i}"]) for i in range(3)] == [packed] * 3
    ckpt.close()
    assert_same_state(state, store.load(saved.ref).state)


def test_a_directory_snapshot_rereads_a_file_whose_old_chunks_are_gone(
    store: Store, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_tree(src)
    old = time.time() - 60
    os.utime(src / "model.bin", (old, old))
    first = store.save_directory("job-d", src, 1, "periodic")
    assert first.manifest.files is not None
    chunk, size = first.manifest.files["model.bin"]["chunks"][0]
    store._delete([store.chunk_key(chunk)])
    store._present.clear()
    second = store.save_directory("job-d", src, 2, "periodic", parent=first.ref)
    assert second.bytes_new == size
    store.verify(second.ref)


@pytest.mark.parametrize("damaged_part", [0, 2])
def test_a_chunk_read_in_parts_loads_identical_and_any_damaged_part_fails_the_load(
    tmp_path: Path, damaged_part: int
) -> None:
    from migration.checkpoint import LocalStore

    # 16 MiB chunks are read in 4 MiB parts by several workers; the tail is not a whole block.
    store = LocalStore(tmp_path / "store", chunk_size=16 * 1024 * 1024)
    state = {"w": np.random.default_rng(3).standard_normal(3_000_001).astype(np.float32)}
    ref = store.save("job-1", 1, state).ref
    assert_same_state(state, store.load(ref).state)

    chunk, size = store.load_manifest(ref).tensors["state/w"]["chunks"][0]
    flip_byte(store, chunk, size, offset=damaged_part * 4 * 1024 * 1024 + 5)
    with pytest.raises(CorruptChunk) as raised:
        store.load(ref)
    assert chunk in str(raised.value)


def test_gc_removes_temporaries_a_killed_writer_left_once_they_are_old(tmp_path: Path) -> None:
    from migration.checkpoint import LocalStore

    store = LocalStore(tmp_path / "store", chunk_size=CHUNK)
    store.save("job-1", 1, make_state(0, mib=2))
    chunks = tmp_path / "store" / "chunks"
    folder = next(p for p in chunks.iterdir() if p.is_dir())
    # What a writer killed mid-save leaves: a chunk written in place, and one streamed (an
    # emergency save, or a first save) that never got its name.
    old = [folder / f".{'a' * 64}.tmp-1-aaaa", chunks / ".stream.tmp-1-bbbb"]
    young = chunks / ".stream.tmp-2-cccc"
    for path in [*old, young]:
        path.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    for path in old:
        os.utime(path, (an_hour_ago, an_hour_ago))

    store.gc("job-1", keep=1, grace_s=600)

    assert [p.exists() for p in old] == [False, False]
    assert young.exists()
    store.verify(newest(store, "job-1"))

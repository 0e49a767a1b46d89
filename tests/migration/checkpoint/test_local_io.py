"""The local store's I/O paths: streamed writes handed to I/O threads, reads with O_DIRECT
through the staging ring or through the page cache, and the hash check of what is read."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from migration.checkpoint import CorruptChunk, LocalStore, SaveResult, StoreError
from migration.checkpoint import local as local_module
from migration.checkpoint import sdk as sdk_module
from migration.checkpoint.sdk import Checkpointer
from migration.checkpoint.snapshot import Gathered

from .conftest import temporaries
from .procs import in_forked_child
from .test_store_contract import assert_same_state, flip_byte, medium_state


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "page cache"])
def test_a_chunk_read_in_pieces_is_checked_whole(tmp_path: Path, direct: bool) -> None:
    # 2.5 MiB chunks: two whole 1 MiB pieces and a short one; damage in the last piece only.
    store = LocalStore(tmp_path / "store", chunk_size=5 * 512 * 1024, direct=direct)
    state = {"w": np.random.default_rng(0).random(5 * 64 * 1024 * 2)}
    result = store.save("job-1", 1, state)
    assert_same_state(state, store.load(result.ref).state)
    chunk, size = result.manifest.tensors["state/w"]["chunks"][1]
    flip_byte(store, chunk, size, offset=size - 5)
    with pytest.raises(CorruptChunk, match="does not match its hash") as caught:
        store.load(result.ref)
    assert caught.value.chunk == chunk
    assert caught.value.where == "tensor state/w"
    store.close()


def direct_store(tmp_path: Path) -> LocalStore:
    """A store of 1 MiB chunks written with O_DIRECT (the test is skipped where it cannot be)."""
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    if not store.direct:
        pytest.skip("this file system takes no O_DIRECT")
    return store


def test_a_direct_store_reads_around_the_page_cache_into_memory_of_any_alignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = direct_store(tmp_path)
    state = unaligned_state(3)  # 1 MiB chunks and a tail that is not a whole block
    ref = store.save("job-1", 1, state).ref
    chunks = store.load_manifest(ref).tensors["state/w"]["chunks"]
    opened: list[int] = []
    real_open = os.open

    def recording_open(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if "chunks" in str(path) and not flags & (os.O_WRONLY | os.O_RDWR):
            opened.append(flags)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", recording_open)
    assert_same_state(state, store.load(ref).state)
    assert len(opened) == len(chunks)
    # The three whole chunks bypass the page cache; the short last one is read through it.
    assert [bool(f & os.O_DIRECT) for f in opened].count(True) == 3
    # Into unaligned memory (a verify reads into a bytearray), every byte is still checked.
    store.verify(ref)
    chunk, size = chunks[1]
    flip_byte(store, chunk, size, offset=size - 1)
    with pytest.raises(CorruptChunk, match="does not match its hash") as caught:
        store.verify(ref)
    assert caught.value.chunk == chunk
    store.close()


def unaligned_state(mib: int) -> dict[str, np.ndarray]:
    """Integers 16 bytes past a page boundary, as live numpy memory usually is: every streamed
    piece is staged through the ring buffers; the odd length leaves a tail that is not a whole
    block."""
    nbytes = mib * 1024 * 1024 + 4004
    raw = np.empty(nbytes + 8192, np.uint8)
    start = (-raw.ctypes.data) % 4096 + 16
    w = raw[start : start + nbytes].view(np.int32)
    w[:] = np.random.default_rng(mib).integers(-(2**31), 2**31 - 1, w.size, dtype=np.int32)
    assert w.ctypes.data % 4096 == 16
    return {"w": w}


def test_a_streamed_save_from_unaligned_memory_loads_identical_and_leaves_no_temporaries(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    state = unaligned_state(5)
    assert store._streams("periodic")  # an empty store: chunks are written while hashed
    ref = store.save("job-1", 1, state).ref
    assert_same_state(state, store.load(ref).state)
    store.verify(ref)
    assert temporaries(tmp_path / "store") == []
    store.close()


def test_a_streamed_save_from_page_aligned_memory_hands_the_disk_its_staging_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Aligned memory could go to the disk as it is, but from its 4 KiB pages a virtual disk
    # split every 1 MiB write in two: a 64 MiB save took 1.46x the raw write that way and
    # 1.22x through the ring's huge pages (decision 055).
    from migration.checkpoint.snapshot import aligned_empty

    store = direct_store(tmp_path)
    source = aligned_empty(3 * 1024 * 1024)
    source[:] = np.random.default_rng(3).integers(0, 256, source.size, dtype=np.uint8)
    first, last = source.ctypes.data, source.ctypes.data + source.nbytes
    written_from: list[int] = []
    real_pwrite_all = local_module._pwrite_all

    def recording(fd: int, data: memoryview, offset: int) -> None:
        written_from.append(np.frombuffer(data, np.uint8).ctypes.data)
        real_pwrite_all(fd, data, offset)

    monkeypatch.setattr(local_module, "_pwrite_all", recording)
    ref = store.save("job-1", 1, {"w": source}).ref
    assert len(written_from) == 3  # a piece per 1 MiB chunk, each streamed
    assert not [a for a in written_from if first <= a < last]
    assert_same_state({"w": source}, store.load(ref).state)
    store.close()


@pytest.mark.parametrize("streams", [True, False], ids=["streamed", "whole chunks"])
def test_a_pack_gathered_from_live_tensors_is_written_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streams: bool
) -> None:
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    monkeypatch.setattr(store, "_streams", lambda kind: streams)
    store.direct = store.direct or streams  # streamed writes are O_DIRECT ones
    gathered: list[int] = []
    gather = Gathered.gather

    def counting_gather(self: Gathered) -> memoryview:
        gathered.append(len(self))
        return gather(self)

    monkeypatch.setattr(Gathered, "gather", counting_gather)
    state = medium_state()
    result = store.save("job-1", 1, state)
    pack = result.manifest.pack
    assert pack is not None and pack["nbytes"] > 1024 * 1024
    if streams and store.direct:
        # Streamed pieces are copied into the ring; only a tail short of a block is gathered.
        assert all(n < 4096 for n in gathered)
    else:
        assert sum(gathered) == pack["nbytes"]  # each chunk gathered once
    assert_same_state(state, store.load(result.ref).state)
    store.verify(result.ref)
    assert temporaries(tmp_path / "store") == []
    store.close()


def test_a_failed_write_on_an_io_thread_fails_the_save_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    before = store.save("job-1", 1, {"w": np.zeros(1 << 18, np.float32)}).ref
    calls = {"n": 0}
    real = local_module._pwrite_all

    def failing(fd: int, data: memoryview, offset: int) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(errno.EIO, "injected write error")
        real(fd, data, offset)

    monkeypatch.setattr(local_module, "_pwrite_all", failing)
    monkeypatch.setattr(store, "_streams", lambda kind: True)
    with pytest.raises(OSError, match="injected write error"):
        store.save("job-1", 2, unaligned_state(6))
    assert calls["n"] >= 4
    assert store.latest("job-1") == before
    assert temporaries(tmp_path / "store" / "chunks") == []
    manifests = os.listdir(tmp_path / "store" / "jobs" / "job-1" / "manifests")
    assert manifests == [before.key.rsplit("/", 1)[-1]]
    store.close()


def probe_times(
    monkeypatch: pytest.MonkeyPatch, direct: list[float], buffered: list[float]
) -> list[bool]:
    """Make the O_DIRECT probe see these write times; the kinds of writes it asked for."""
    asked: list[bool] = []
    times = {True: iter(direct), False: iter(buffered)}

    def timed(folder: Path, data: np.ndarray, use_direct: bool) -> float:
        asked.append(use_direct)
        return next(times[use_direct])

    monkeypatch.setattr(local_module, "_DIRECT_CHOICE", {})
    monkeypatch.setattr(local_module, "_timed_probe_write", timed)
    return asked


def test_a_file_system_where_buffered_writes_are_clearly_faster_gets_buffered_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = probe_times(monkeypatch, direct=[0.040, 0.050], buffered=[0.010, 0.019])
    store = LocalStore(tmp_path / "a")
    assert asked == [True, False, True, False]  # alternating, twice each
    assert not store.direct
    state = unaligned_state(2)
    ref = store.save("job-1", 1, state).ref
    assert_same_state(state, store.load(ref).state)
    # Measured once per file system and process.
    assert not LocalStore(tmp_path / "b").direct
    assert len(asked) == 4
    store.close()


def test_one_noisy_probe_does_not_give_up_o_direct(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe_times(monkeypatch, direct=[0.040, 0.012], buffered=[0.010, 0.030])
    assert LocalStore(tmp_path / "a").direct
    probe_times(monkeypatch, direct=[0.030, 0.021], buffered=[0.010, 0.011])
    assert LocalStore(tmp_path / "b").direct  # faster, but not by the margin


def test_the_real_probe_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "_DIRECT_CHOICE", {})
    store = LocalStore(tmp_path / "store")
    assert isinstance(store.direct, bool)
    assert list((tmp_path / "store" / "chunks").iterdir()) == []


def test_a_store_where_nothing_can_be_written_still_opens_and_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = unaligned_state(2)
    ref = LocalStore(tmp_path / "store").save("job-1", 1, state).ref
    probe_times(monkeypatch, direct=[], buffered=[])

    def read_only(folder: Path, data: np.ndarray, use_direct: bool) -> float:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(local_module, "_timed_probe_write", read_only)
    store = LocalStore(tmp_path / "store")
    assert store.direct
    assert local_module._DIRECT_CHOICE == {}  # measured again where it can be
    assert_same_state(state, store.load(ref).state)


def test_a_child_forked_while_a_parent_thread_probes_opens_a_store_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "_DIRECT_CHOICE", {})

    def open_and_save() -> None:
        state = unaligned_state(2)
        store = LocalStore(tmp_path / "child")
        assert_same_state(state, store.load(store.save("job-1", 1, state).ref).state)

    with local_module._DIRECT_CHOICE_LOCK:  # as a parent thread measuring a file system holds it
        code = in_forked_child(open_and_save)
    assert code == 0, "the forked child failed or never opened its store (-9)"


def test_huge_page_buffers_start_on_a_huge_page_and_small_ones_stay_ordinary() -> None:
    from migration.checkpoint.snapshot import aligned_empty

    huge = aligned_empty(5 * 1024 * 1024 + 123, huge=True)
    assert huge.nbytes == 5 * 1024 * 1024 + 123
    assert huge.ctypes.data % (2 * 1024 * 1024) == 0
    huge[:] = 7  # writable to its last byte
    assert int(huge[-1]) == 7
    small = aligned_empty(300 * 1024, huge=True)  # would take a whole huge page
    assert small.nbytes == 300 * 1024 and small.ctypes.data % 4096 == 0


def test_a_restore_reads_into_page_aligned_buffers_and_matches(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    state = unaligned_state(8)
    ref = store.save("job", 1, state).ref
    loaded = store.load(ref).state
    assert_same_state(loaded, state)
    big = max(loaded.values(), key=lambda a: a.nbytes)
    assert big.ctypes.data % 4096 == 0  # the disk reads straight into it (O_DIRECT)
    store.close()


def test_a_checkpointer_starts_its_stores_threads_before_any_save(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    before = set(threading.enumerate())
    ckpt = Checkpointer(store, job="job", install_signal_handlers=False)
    started = {t.name for t in set(threading.enumerate()) - before}
    assert any(name.startswith("baton-store") for name in started)
    assert any(name.startswith("baton-io") for name in started)
    ckpt.close()
    store.close()


def record_durability(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every fsync (of the path behind the descriptor) and rename (of its destination), in
    the order they finished."""
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        real_fsync(fd)
        with lock:
            events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))

    def replace(src: str | Path, dst: str | Path) -> None:
        real_replace(src, dst)
        with lock:
            events.append(("rename", str(src)))
            events.append(("named", str(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


@pytest.mark.parametrize("streams", [True, False])
def test_a_commit_names_a_chunk_only_once_durable_and_the_manifest_only_after_every_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, streams: bool
) -> None:
    # The manifest's temporary file is written beside the chunks' fsyncs; what a crash may
    # leave must still be a whole checkpoint or none (decision 005).
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    monkeypatch.setattr(store, "_streams", lambda kind: streams)
    events = record_durability(monkeypatch)
    result = store.save("job-1", 1, unaligned_state(4))
    store.close()
    order = {event: i for i, event in enumerate(events)}
    chunks_dir = str((tmp_path / "store" / "chunks").resolve())
    named = [(i, path) for (kind, path), i in order.items() if kind == "named"]
    chunk_names = [(i, p) for i, p in named if p.startswith(chunks_dir)]
    assert len(chunk_names) == result.chunks_new == 5
    manifest_named = max(i for i, p in named if p.endswith(result.ref.key.rsplit("/", 1)[-1]))
    for i, path in chunk_names:
        tmp = events[i - 1][1]
        assert order[("fsync", str(Path(tmp).resolve()))] < i, f"{path} named before durable"
        assert i < manifest_named
        folder = str(Path(path).parent.resolve())
        assert i < order[("fsync", folder)] < manifest_named, f"{folder} not synced in time"
    manifests = str((tmp_path / "store" / "jobs" / "job-1" / "manifests").resolve())
    assert order[("fsync", manifests)] > manifest_named


def test_a_failed_chunk_fsync_fails_the_save_and_leaves_no_manifest_or_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024)
    before = store.save("job-1", 1, {"w": np.zeros(1 << 18, np.float32)}).ref
    real = os.fsync

    def failing(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "/chunks/" in path and ".tmp-" in path:
            raise OSError(errno.EIO, "injected fsync error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="injected fsync error"):
        store.save("job-1", 2, unaligned_state(3))
    monkeypatch.setattr(os, "fsync", real)
    assert store.latest("job-1") == before
    assert temporaries(tmp_path / "store") == []
    assert store.list("job-1") == [before]
    assert_same_state({"w": np.zeros(1 << 18, np.float32)}, store.load(before).state)
    store.close()


def recycled(store: LocalStore) -> list[Path]:
    """The chunk files gc kept for later saves to write over."""
    return sorted((store.root / "chunks").glob(".recycled-*"))


def chunk_inodes(store: LocalStore, chunks: dict[str, int]) -> set[int]:
    """The inodes of these chunks' files."""
    return {store._chunk_path(chunk).stat().st_ino for chunk in chunks}


@pytest.mark.parametrize("kind", ["periodic", "emergency"], ids=["whole chunks", "streamed"])
def test_gc_recycles_the_chunk_files_it_frees_and_the_next_save_writes_over_them(
    tmp_path: Path, kind: str
) -> None:
    store = direct_store(tmp_path)
    first = store.save("job-1", 1, unaligned_state(4)).manifest.chunks()
    store.save("job-1", 2, unaligned_state(5))
    whole = {chunk: size for chunk, size in first.items() if size == store.chunk_size}
    freed = chunk_inodes(store, whole)
    assert len(freed) == 4  # and a tail of 4004 bytes, which is deleted

    stats = store.gc("job-1", keep=1, grace_s=0)
    assert stats.chunks_removed == 5
    assert stats.bytes_recycled == 4 * store.chunk_size
    assert {path.stat().st_ino for path in recycled(store)} == freed
    assert not any(store._chunk_path(chunk).exists() for chunk in first)

    state = unaligned_state(3)
    result = store.save("job-1", 3, state, kind=kind)
    written = {c: s for c, s in result.manifest.chunks().items() if s == store.chunk_size}
    assert len(written) == 3 and chunk_inodes(store, written) < freed
    assert len(recycled(store)) == 1
    assert temporaries(store.root) == []
    assert_same_state(state, store.load(result.ref).state)  # hash-checked
    store.verify(result.ref)
    store.close()


def test_recycled_files_stay_within_the_newest_checkpoint_and_go_with_the_jobs_last(
    tmp_path: Path,
) -> None:
    store = direct_store(tmp_path)
    for step, mib in ((1, 4), (2, 3), (3, 2)):
        store.save("job-1", step, unaligned_state(mib))
    stats = store.gc("job-1", keep=1, grace_s=0)
    # Steps 1 and 2 freed 7 whole chunks; the next save writes about as much as the newest
    # checkpoint holds (2 MiB and a tail), so 2 files are kept.
    assert stats.bytes_removed == 7 * store.chunk_size + 2 * 4004
    assert stats.bytes_recycled == 2 * store.chunk_size
    assert len(recycled(store)) == 2
    # Removing every checkpoint of the job frees the disk: nothing left to recycle for.
    stats = store.retain("job-1", set(), grace_s=0)
    assert stats.bytes_recycled == 0
    assert recycled(store) == []
    assert [p for p in (store.root / "chunks").rglob("*") if p.is_file()] == []
    store.close()


def test_a_failed_write_over_a_recycled_file_fails_the_save_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = direct_store(tmp_path)
    store.save("job-1", 1, unaligned_state(2))
    kept = store.save("job-1", 2, unaligned_state(3)).ref
    assert store.gc("job-1", keep=1, grace_s=0).bytes_recycled == 2 * store.chunk_size
    real = local_module._pwrite_all

    def failing(fd: int, data: memoryview, offset: int) -> None:
        if offset == 512 * 1024:
            raise OSError(errno.EIO, "injected write error")
        real(fd, data, offset)

    monkeypatch.setattr(local_module, "_pwrite_all", failing)
    monkeypatch.setattr(local_module, "_STREAM_PIECE", 256 * 1024)
    with pytest.raises(OSError, match="injected write error"):
        store.save("job-1", 3, unaligned_state(4), kind="emergency")
    assert store.latest("job-1") == kept
    assert temporaries(store.root) == []
    assert_same_state(unaligned_state(3), store.load(kept).state)
    store.close()


def test_a_store_finds_the_files_another_process_recycled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_module, "_RECYCLED_RELIST_S", 0.2)
    saver = direct_store(tmp_path)
    first = saver.save("job-1", 1, unaligned_state(2)).manifest.chunks()
    saver.save("job-1", 2, unaligned_state(3))  # looked for recycled files: none yet
    freed = chunk_inodes(saver, {c: s for c, s in first.items() if s == saver.chunk_size})
    # Retention elsewhere (the portal's, for a region's store) collects the older checkpoint.
    LocalStore(saver.root, chunk_size=saver.chunk_size).gc("job-1", keep=1, grace_s=0)
    time.sleep(0.25)
    result = saver.save("job-1", 3, unaligned_state(4), kind="emergency")
    whole = {c: s for c, s in result.manifest.chunks().items() if s == saver.chunk_size}
    assert chunk_inodes(saver, whole) & freed == freed
    assert recycled(saver) == []
    saver.close()


def test_reserved_files_are_zeros_counted_with_recycled_ones_and_a_save_writes_over_them(
    tmp_path: Path,
) -> None:
    store = direct_store(tmp_path)
    assert store.reserve(3 * store.chunk_size + 5) == 3 * store.chunk_size  # whole chunks
    files = recycled(store)
    assert len(files) == 3 and temporaries(store.root) == []
    assert all(path.read_bytes() == bytes(store.chunk_size) for path in files)
    assert store.reserve(3 * store.chunk_size) == 0  # already there
    assert store.reserve(4 * store.chunk_size) == store.chunk_size
    reserved = {path.stat().st_ino for path in recycled(store)}

    state = unaligned_state(4)
    result = store.save("job-1", 1, state, kind="emergency")
    written = {c: s for c, s in result.manifest.chunks().items() if s == store.chunk_size}
    assert chunk_inodes(store, written) == reserved
    assert recycled(store) == []
    assert_same_state(state, store.load(result.ref).state)  # hash-checked
    store.close()


def test_a_reservation_stops_when_asked_and_a_full_disk_leaves_no_half_written_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = direct_store(tmp_path)
    polls: list[int] = []

    def stop_after_two() -> bool:
        polls.append(1)
        return len(polls) > 2

    assert store.reserve(5 * store.chunk_size, stop=stop_after_two) == 2 * store.chunk_size
    assert len(recycled(store)) == 2

    real = local_module._pwrite_all
    writes: list[int] = []

    def full_disk(fd: int, data: memoryview, offset: int) -> None:
        writes.append(fd)
        if len(writes) == 2:  # the second file
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data, offset)

    monkeypatch.setattr(local_module, "_pwrite_all", full_disk)
    assert store.reserve(5 * store.chunk_size) == store.chunk_size
    assert "No space left on device" in caplog.text
    assert len(recycled(store)) == 3
    assert all(path.stat().st_size == store.chunk_size for path in recycled(store))
    assert temporaries(store.root) == []
    store.close()


def test_a_store_writing_through_the_page_cache_reserves_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store", chunk_size=1024 * 1024, direct=False)
    assert store.reserve(4 * store.chunk_size) == 0
    assert recycled(store) == []
    store.close()


def whole_chunks(result: SaveResult, store: LocalStore) -> dict[str, int]:
    """The chunks of a save's trained tensor that fill a whole chunk file."""
    return {
        chunk: size
        for chunk, size in result.manifest.tensors["state/w"]["chunks"]
        if size == store.chunk_size
    }


def emergency_save_over(
    ckpt: Checkpointer, store: LocalStore, state: dict[str, np.ndarray], step: int, room: set[int]
) -> None:
    """Change every chunk of the trained tensor `w`, save an emergency checkpoint, and check that
    its whole chunks were written over the files `room` (their inodes) and read back intact."""
    state["w"] += 1
    result = ckpt.emergency_save(step, state)
    assert chunk_inodes(store, whole_chunks(result, store)) == room
    assert_same_state(state, store.load(result.ref).state)


@contextlib.contextmanager
def checkpointer(tmp_path: Path, **options: Any) -> Iterator[tuple[LocalStore, Checkpointer]]:
    """A Checkpointer of job `job-1` over a store written with O_DIRECT, both closed after."""
    store = direct_store(tmp_path)
    ckpt = Checkpointer(store, job="job-1", install_signal_handlers=False, **options)
    try:
        yield store, ckpt
    finally:
        ckpt.close()
        store.close()


def test_a_checkpointer_reserves_room_for_its_emergency_save_after_its_first_save(
    tmp_path: Path,
) -> None:
    with checkpointer(tmp_path, every_seconds=None) as (store, ckpt):
        frozen = np.ones(2 * 1024 * 1024, np.uint8)
        frozen.flags.writeable = False  # a frozen base: the emergency save will not write it again
        state = {**unaligned_state(3), "base": frozen}
        ckpt.save(1, state)
        ckpt.wait()  # the reservation too
        reserved = {path.stat().st_ino for path in recycled(store)}
        assert len(reserved) == 3  # the trained tensor's whole chunks, not the frozen base's

        emergency_save_over(ckpt, store, state, 2, reserved)


def test_a_checkpointer_reserves_room_at_its_first_step_for_a_save_before_its_first_checkpoint(
    tmp_path: Path,
) -> None:
    with checkpointer(tmp_path, every_seconds=None) as (store, ckpt):
        state = unaligned_state(3)
        assert not ckpt.maybe_save(1, state)  # not due: no checkpoint, but the room is prepared
        ckpt.wait()
        reserved = {path.stat().st_ino for path in recycled(store)}
        assert len(reserved) == 3  # the state's whole chunks
        assert not ckpt.maybe_save(2, state)  # once: no second reservation before a save
        ckpt.wait()
        assert len(recycled(store)) == 3

        # Interrupted before its first checkpoint: the emergency save writes over that room.
        emergency_save_over(ckpt, store, state, 3, reserved)
        assert recycled(store) == []


def test_after_the_first_save_written_over_the_room_a_checkpointer_reserves_again(
    tmp_path: Path,
) -> None:
    with checkpointer(tmp_path, every_steps=2) as (store, ckpt):
        state = unaligned_state(3)
        ckpt.maybe_save(1, state)
        ckpt.wait()
        first_room = {path.stat().st_ino for path in recycled(store)}
        state["w"] += 1
        assert ckpt.maybe_save(2, state)  # due: the first save, asynchronous
        ckpt.wait()  # its persist and the reservation after it
        first = ckpt.last_committed
        assert first is not None
        assert chunk_inodes(store, whole_chunks(first, store)) == first_room
        second_room = {path.stat().st_ino for path in recycled(store)}
        assert len(second_room) == 3 and not second_room & first_room

        emergency_save_over(ckpt, store, state, 3, second_room)


def test_a_state_that_cannot_be_checkpointed_is_reported_by_the_save_not_the_first_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sized: list[object] = []

    def state_nbytes(state: object) -> int:
        sized.append(state)
        return real_state_nbytes(state)

    real_state_nbytes = sdk_module.state_nbytes
    monkeypatch.setattr(sdk_module, "state_nbytes", state_nbytes)
    with checkpointer(tmp_path, every_steps=4) as (_, ckpt):
        state = {"w": np.zeros(4, np.float32), "opt": object()}
        assert not ckpt.maybe_save(1, state)  # nothing to reserve from, nothing raised
        assert not ckpt.maybe_save(2, state)
        assert len(sized) == 1  # looked at once, not at every step
        with pytest.raises(StoreError, match="cannot checkpoint a value of type object"):
            ckpt.maybe_save(4, state)

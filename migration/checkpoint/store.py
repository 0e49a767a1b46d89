"""The store interface: content-addressed chunks plus one manifest per checkpoint and rank.

Subclasses provide a handful of object primitives (a local folder, S3); everything a caller
uses - save, list, latest, load, verify, gc, copy, directory snapshots - is written once here
on top of them, so both implementations behave the same by construction and pass one set of
contract tests.

Layout inside a store (a store URL is already a project's namespace):

    chunks/<hh>/<digest>                                    content-addressed chunk
    jobs/<job>/manifests/<step:012d>-<kind>-r<rank>.json    commit point of one checkpoint
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import CorruptChunk, CorruptManifest, ManifestNotFound, SaveCancelled, StoreError
from .forks import renew_after_fork
from .hashing import HASH_NAME, digest
from .manifest import (
    ChunkList,
    Manifest,
    ManifestRef,
    check_job,
    check_kind,
    manifests_prefix,
)
from .snapshot import Gathered, Snapshot, aligned_empty, decode, materialise, pack_limit_for

if TYPE_CHECKING:
    from .directory import RestoreStats

logger = logging.getLogger(__name__)

# Chosen by measurement (docs/decisions/002-chunk-size.md).
DEFAULT_CHUNK_SIZE = 16 * 1024 * 1024
# Chunks younger than this are never collected: a save in another process may be about to
# reference them (its manifest is written after its chunks).
DEFAULT_GC_GRACE_S = 600.0

# Added to the nice value of background workers (Linux applies it per thread), the highest
# there is: the workers weigh together, and at +10 eight of them weighed almost as much as one
# thread of the training loop's, whose parallel matrix products then waited for the core they
# shared (the steps after a checkpoint took 1.7x as long; decision 055). Even at +19 a persist
# gets a tenth of a core the loop keeps busy, and every core the loop leaves idle.
BACKGROUND_NICE = 19

Cancel = Callable[[], bool]
# Waits until something started earlier is done (and raises what failed in it).
Wait = Callable[[], None]


def lower_thread_priority() -> None:
    """Make the calling thread yield the CPU to the rest of the process (Linux only)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        nice = os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE
        os.setpriority(os.PRIO_PROCESS, tid, min(19, nice))
    except OSError as exc:
        logger.debug("could not lower the priority of a background thread: %s", exc)


@dataclass
class SaveResult:
    """What a save committed."""

    ref: ManifestRef
    manifest: Manifest
    bytes_total: int
    bytes_new: int
    chunks_total: int
    chunks_new: int
    seconds: float
    # Of `seconds`, the time until every chunk's bytes were written; the rest made the new
    # chunks durable (read them back first, with `verify`) and committed the manifest.
    write_seconds: float = 0.0

    @property
    def key(self) -> str:
        """The committed manifest's key."""
        return self.ref.key


@dataclass
class CopyStats:
    """What copying one checkpoint to another store moved and what it found already there."""

    manifest: str = ""
    chunks_copied: int = 0
    bytes_copied: int = 0
    chunks_skipped: int = 0
    bytes_skipped: int = 0
    seconds: float = 0.0


@dataclass
class GcStats:
    """What a garbage collection removed."""

    manifests_removed: list[str] = field(default_factory=list)
    chunks_removed: int = 0
    bytes_removed: int = 0
    #: Of the bytes removed, those whose files the store kept for later saves to write their
    #: new chunks over (local stores, up to the size of the job's newest checkpoints).
    bytes_recycled: int = 0


@dataclass
class VerifyStats:
    """What a verification read back."""

    chunks: int = 0
    bytes: int = 0


@dataclass
class Checkpoint:
    """A loaded checkpoint: its manifest, the nested state and the extra state."""

    ref: ManifestRef
    manifest: Manifest
    state: Any
    extra: Any

    @property
    def step(self) -> int:
        """The step the checkpoint was taken at."""
        return self.manifest.step


class Store(ABC):
    """A checkpoint store. Use `open_store(url)` rather than a subclass directly."""

    #: Whether a chunk known to exist may be assumed to still exist without asking the backend
    #: (saves a round trip per chunk on S3; a local stat is cheaper than the bookkeeping).
    _cache_presence = False
    #: Whether periodic SDK saves read their new chunks back before committing by default.
    verify_after_write = False

    def __init__(self, *, chunk_size: int = DEFAULT_CHUNK_SIZE, workers: int = 4) -> None:
        if chunk_size < 4096:
            raise StoreError("chunk_size must be at least 4096 bytes")
        self.chunk_size = chunk_size
        self.workers = workers
        self._pools: dict[bool, ThreadPoolExecutor] = {}
        self._pool_lock = threading.Lock()
        self._local = threading.local()
        self._present: set[str] = set()
        self._prepare_workers = False  # set by start()
        renew_after_fork(self)

    # ---- primitives a backend provides ------------------------------------------------------

    @property
    @abstractmethod
    def url(self) -> str:
        """The URL this store was opened from."""

    @abstractmethod
    def _has_chunk(self, chunk: str) -> bool:
        """True if the chunk exists (and, where cheap, refresh its age for gc's grace period)."""

    @abstractmethod
    def _write_chunk(self, chunk: str, data: memoryview) -> object | None:
        """Store one chunk atomically: it is either absent or complete.

        A backend may return a token instead: the chunk then exists only once the token went
        through `_finish_chunks` (which makes a batch durable and visible at once)."""

    def _finish_chunks(self, tokens: builtins.list[object]) -> None:  # noqa: B027
        """Make the chunks behind these `_write_chunk` tokens durable and visible."""

    def _start_finishing(self, tokens: builtins.list[object]) -> Wait:
        """Begin `_finish_chunks`; the call returned waits until it is done (and raises what
        failed). Backends whose finishing waits on the disk start it in the background, so a
        save builds its manifest meanwhile."""
        self._finish_chunks(tokens)
        return lambda: None

    def _abandon_chunks(self, tokens: builtins.list[object]) -> None:  # noqa: B027
        """Drop the chunks behind tokens of a save that will not commit."""

    def _streams(self, kind: str) -> bool:
        """Whether this save writes its unknown chunks while hashing them (`_write_streaming`)
        instead of hashing first and asking whether the store has them: right when they
        almost surely are new (backends that can stream override this)."""
        return False

    def _write_streaming(self, data: memoryview | Gathered) -> tuple[str, object] | None:
        """Write a chunk under a temporary name while hashing it; its digest and a token for
        `_finish_chunks` (or `_abandon_chunks`), or None when this chunk cannot stream."""
        return None

    def _stage(self, data: memoryview) -> memoryview:
        """The bytes of a chunk as `_write_chunk` prefers them (e.g. copied to an aligned
        buffer owned by the calling thread, valid until its next call)."""
        return data

    @abstractmethod
    def _sync_chunks(self, chunks: Iterable[str]) -> None:
        """Make the chunks written so far durable (called before their manifest is written)."""

    def _commit_manifest(
        self, key: str, data: bytes, new_chunks: Iterable[str], chunks_finished: Wait | None = None
    ) -> None:
        """Make the new chunks durable, then write the manifest: the commit point.

        `chunks_finished` waits for the new chunks' `_start_finishing`. Backends may overlap
        the manifest's write with the chunks' as long as the manifest becomes visible only
        after the chunks are durable and visible."""
        if chunks_finished is not None:
            chunks_finished()
        self._sync_chunks(new_chunks)
        self._put_object(key, data)

    @abstractmethod
    def _read_chunk_into(self, chunk: str, out: memoryview) -> None:
        """Fill `out` with the chunk; raise CorruptChunk when it is missing or not len(out)."""

    @abstractmethod
    def _put_object(self, key: str, data: bytes) -> None:
        """Write a small object atomically and durably (manifests)."""

    @abstractmethod
    def _get_object(self, key: str) -> bytes:
        """Read a small object; raise ManifestNotFound when it does not exist."""

    def _get_manifest(self, key: str) -> tuple[bytes, str | None]:
        """A manifest's bytes, and the id of the commit that put them where the backend keeps
        one (the S3 store)."""
        return self._get_object(key), None

    def _read_whole(self, key: str, commit: str | None, chunks: Collection[str]) -> None:
        """Every one of `chunks` was just read, after the manifest at `key` (put by `commit`,
        where the backend keeps one): they are known present. A backend may also count the
        read as its check of them after that commit (the S3 store, decision 005)."""
        self._present.update(chunks)

    @abstractmethod
    def _list(self, prefix: str) -> list[str]:
        """Keys of the objects directly under `prefix` (which ends in '/')."""

    @abstractmethod
    def _list_dirs(self, prefix: str) -> list[str]:
        """Names of the sub-folders directly under `prefix`."""

    @abstractmethod
    def _delete(self, keys: list[str]) -> None:
        """Delete objects; a key that is already gone is not an error."""

    @abstractmethod
    def _remove_job_folders(self, job: str) -> None:
        """Remove the job's folders (`job_folders`) where they are empty."""

    @abstractmethod
    def _iter_chunks(self) -> Iterator[tuple[str, int, float]]:
        """Every chunk in the store as (digest, size, modified at as a POSIX time)."""

    def _sweep_chunks(
        self, listed: dict[str, float], recycle_bytes: int
    ) -> tuple[builtins.list[str], int]:
        """Delete unreferenced chunks, each listed with its modification time; return the ones
        removed, and how many of their bytes were recycled. Backends whose presence check
        renews a chunk's age (`_has_chunk`) keep a chunk a save reused after it was listed.
        Backends that can write a new chunk over an old chunk's file may keep up to
        `recycle_bytes` of such files (the size of the job's newest checkpoints), counting
        those they kept before."""
        self._delete([self.chunk_key(chunk) for chunk in listed])
        return builtins.list(listed), 0

    def reserve(self, nbytes: int, *, stop: Cancel = lambda: False) -> int:
        """Prepare room for a later save of up to `nbytes` to write over instead of allocating
        new blocks; return the bytes prepared now (backends without such room return 0).
        `stop` is polled between files: when it returns True the reservation ends early."""
        return 0

    def _remove_stale_temporaries(self, older_than_s: float) -> None:  # noqa: B027
        """Remove temporaries left by crashed writers (backends that have them override this)."""

    # ---- shared machinery -------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        """The worker pool for the calling thread's work (low priority inside `background()`)."""
        background = bool(getattr(self._local, "background", False))
        with self._pool_lock:
            # Both pools start together: an emergency save (normal priority) that follows
            # periodic ones (low priority) then finds its threads running.
            for kind in (background, not background):
                if kind not in self._pools:
                    pool = ThreadPoolExecutor(
                        self.workers,
                        thread_name_prefix="baton-store-bg" if kind else "baton-store",
                        initializer=self._start_worker,
                        initargs=(kind,),
                    )
                    _start_all_threads(pool, self.workers)
                    self._pools[kind] = pool
            return self._pools[background]

    def _start_worker(self, background: bool) -> None:
        """Run in each worker thread as it starts."""
        if background:
            lower_thread_priority()
        elif self._prepare_workers:
            self._prepare_worker()

    def _prepare_worker(self) -> None:  # noqa: B027
        """What a backend gives each normal-priority worker (the ones an emergency save runs
        on) before its first save: buffers it would otherwise allocate inside the window."""

    def start(self) -> None:
        """Start the worker threads now rather than at the first save, which may be an
        emergency save racing a notice's window (starting them there cost a 64 MiB emergency
        save about a fifth of its time; decision 055), each ready for an emergency save. A store
        not started so (the portal's region stores) gives its workers nothing up front."""
        self._prepare_workers = True
        self._executor()

    def _after_fork(self) -> None:
        """In a forked child: drop the parent's pools (their threads did not come along) and
        locks (another thread may have held one at the fork). Nothing is shut down: there is
        nothing here to shut down."""
        self._pools = {}
        self._pool_lock = threading.Lock()

    @contextlib.contextmanager
    def background(self) -> Iterator[None]:
        """Within this block, the calling thread's store work runs on low-priority workers, so
        a periodic persist yields the CPU to the training loop it runs beside."""
        previous = getattr(self._local, "background", False)
        self._local.background = True
        try:
            yield
        finally:
            self._local.background = previous

    def close(self) -> None:
        """Release the worker threads (the store may still be used; they are recreated)."""
        with self._pool_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=True)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @staticmethod
    def chunk_key(chunk: str) -> str:
        """The key of a chunk: fanned out by its first two hex digits."""
        return f"chunks/{chunk[:2]}/{chunk}"

    def _chunk_present(self, chunk: str) -> bool:
        if self._cache_presence and chunk in self._present:
            return True
        if self._has_chunk(chunk):
            self._present.add(chunk)
            return True
        return False

    def _read_checked(self, chunk: str, out: memoryview, where: str, check: bool = True) -> None:
        self._read_chunk_into(chunk, out)
        if check and digest(out) != chunk:
            raise CorruptChunk(chunk, "content does not match its hash", where)

    def _run_all(self, futures: list[Future[Any]], abort: threading.Event | None = None) -> None:
        """Wait for the futures; on the first failure stop the rest, then re-raise it."""
        _, not_done = wait(futures, return_when=FIRST_EXCEPTION)
        if not_done:
            if abort is not None:
                abort.set()
            for future in not_done:
                future.cancel()
            wait(not_done)
        errors: builtins.list[BaseException] = [
            exc for f in futures if not f.cancelled() and (exc := f.exception()) is not None
        ]
        # The cause, not the tasks that stopped because of it.
        errors.sort(key=lambda e: isinstance(e, SaveCancelled))
        if errors:
            raise errors[0]

    # ---- saving -----------------------------------------------------------------------------

    def save(
        self,
        job: str,
        step: int,
        state: object,
        *,
        kind: str = "periodic",
        extra: object = None,
        rank: int = 0,
        world_size: int = 1,
        parent: ManifestRef | str | None = None,
        validation_reference: float | None = None,
        meta: dict[str, Any] | None = None,
        verify: bool = False,
    ) -> SaveResult:
        """Save a nested state of numpy arrays / torch tensors synchronously and commit it.

        The caller must not modify the arrays until this returns (they are read in place).
        """
        snapshot = Snapshot.capture(
            state, extra, copy=False, pack_limit=pack_limit_for(self.chunk_size)
        )
        return self.commit(
            job,
            step,
            snapshot,
            kind=kind,
            rank=rank,
            world_size=world_size,
            parent=parent,
            validation_reference=validation_reference,
            meta=meta,
            verify=verify,
        )

    def commit(
        self,
        job: str,
        step: int,
        snapshot: Snapshot,
        *,
        kind: str = "periodic",
        rank: int = 0,
        world_size: int = 1,
        parent: ManifestRef | str | None = None,
        validation_reference: float | None = None,
        meta: dict[str, Any] | None = None,
        verify: bool = False,
        cancel: Cancel | None = None,
    ) -> SaveResult:
        """Persist a captured snapshot: missing chunks first, then the manifest (the commit).

        `verify` reads every new chunk back before committing. `cancel` is polled between
        chunks; when it returns True the save stops with SaveCancelled and commits nothing.
        """
        started = time.perf_counter()
        ref = ManifestRef(check_job(job), int(step), check_kind(kind), int(rank))
        writer = _ChunkWriter(self, cancel, stream=self._streams(ref.kind))
        try:
            # The large tensors first: their writes set the pace, the small ones' pack waits.
            tensor_chunks = [
                writer.add(source.data, known=source.known_chunks) for source in snapshot.tensors
            ]
            pack_chunks = writer.add(snapshot.pack) if snapshot.pack is not None else None
            writer.finish()
            if verify:
                writer.finished()
                self._verify_chunks(writer.new_chunks)
            if cancel is not None and cancel():
                raise SaveCancelled(f"save of {ref} cancelled before its manifest")
        except BaseException:
            writer.abandon()
            raise
        tensors: dict[str, dict[str, Any]] = {}
        for source, handle in zip(snapshot.tensors, tensor_chunks, strict=True):
            tensors[source.name] = {**source.describe(), "chunks": writer.result(handle)}
        for name, (entry, offset) in snapshot.small.items():
            tensors[name] = {**entry, "pack": offset}
        pack = None
        if pack_chunks is not None and snapshot.pack is not None:
            pack = {"nbytes": len(snapshot.pack), "chunks": writer.result(pack_chunks)}
        return self._commit_save(
            ref,
            writer,
            started,
            world_size=world_size,
            parent=parent,
            validation_reference=validation_reference,
            bytes_total=snapshot.bytes_total,
            chunks_total=writer.chunks_total,
            meta=dict(meta or {}),
            tensors=tensors,
            pack=pack,
            tree=snapshot.tree,
        )

    def _commit_save(
        self,
        ref: ManifestRef,
        writer: _ChunkWriter,
        started: float,
        *,
        world_size: int,
        parent: ManifestRef | str | None,
        validation_reference: float | None,
        bytes_total: int,
        chunks_total: int,
        meta: dict[str, Any],
        **content: Any,
    ) -> SaveResult:
        """Write the manifest of a save whose chunks are all in (the commit point) and say
        what it committed. `content` is what the manifest describes: tensors or files."""
        manifest = Manifest(
            job=ref.job,
            step=ref.step,
            kind=ref.kind,
            rank=ref.rank,
            world_size=int(world_size),
            parent=str(parent) if parent else None,
            chunk_size=self.chunk_size,
            hash=HASH_NAME,
            validation_reference=validation_reference,
            bytes_total=bytes_total,
            bytes_new=writer.bytes_new,
            chunks_total=chunks_total,
            chunks_new=len(writer.new_chunks),
            meta=meta,
            **content,
        )
        try:
            self._commit_manifest(ref.key, manifest.to_json(), writer.new_chunks, writer.finished)
        except BaseException:
            writer.abandon()
            raise
        seconds = time.perf_counter() - started
        write_seconds = writer.written_at - started
        logger.debug(
            "committed %s: %d of %d bytes new in %.3fs (%.3fs writing, %.3fs durable and "
            "committed)",
            ref,
            manifest.bytes_new,
            manifest.bytes_total,
            seconds,
            write_seconds,
            seconds - write_seconds,
        )
        return SaveResult(
            ref,
            manifest,
            manifest.bytes_total,
            manifest.bytes_new,
            manifest.chunks_total,
            manifest.chunks_new,
            seconds,
            write_seconds,
        )

    def _verify_chunks(self, chunks: dict[str, int]) -> None:
        def check(chunk: str, size: int) -> None:
            buf = bytearray(size)
            self._read_checked(chunk, memoryview(buf), "verification pass")

        pool = self._executor()
        self._run_all([pool.submit(check, c, s) for c, s in chunks.items()])

    # ---- listing and loading ----------------------------------------------------------------

    def list(self, job: str, rank: int | None = None) -> list[ManifestRef]:
        """Committed checkpoints of `job` (of one rank, or all), ascending by step."""
        refs = []
        for key in self._list(manifests_prefix(job)):
            ref = ManifestRef.from_name(job, key.rsplit("/", 1)[-1])
            if ref is not None and (rank is None or ref.rank == rank):
                refs.append(ref)
        return sorted(refs, key=lambda r: r.sort_key)

    def latest(self, job: str, rank: int | None = None) -> ManifestRef | None:
        """The newest committed checkpoint of `job` (of one rank, or any), or None."""
        refs = self.list(job, rank)
        return refs[-1] if refs else None

    def latest_complete(self, job: str, world_size: int) -> ManifestRef | None:
        """Rank 0's ref of the newest step and kind that every rank of the gang committed."""
        by_point: dict[tuple[int, str], set[int]] = {}
        for ref in self.list(job):
            by_point.setdefault((ref.step, ref.kind), set()).add(ref.rank)
        complete = [
            ManifestRef(job, step, kind, 0)
            for (step, kind), ranks in by_point.items()
            if ranks >= set(range(world_size))
        ]
        return max(complete, key=lambda r: r.sort_key) if complete else None

    def jobs(self) -> builtins.list[str]:
        """Every job that has a folder in this store."""
        return sorted(self._list_dirs("jobs/"))

    def load_manifest(self, ref: ManifestRef | str) -> Manifest:
        """Read and check one manifest."""
        return self._read_manifest(ManifestRef.parse(ref))[0]

    def _read_manifest(self, ref: ManifestRef) -> tuple[Manifest, str | None]:
        """One manifest, checked, and the commit that put it (`_get_manifest`)."""
        raw, commit = self._get_manifest(ref.key)
        manifest = Manifest.from_json(ref.key, raw)
        if manifest.ref != ref:
            raise CorruptManifest(ref.key, f"it describes {manifest.ref}")
        return manifest, commit

    def load(self, ref: ManifestRef | str, *, check: bool = True) -> Checkpoint:
        """Load a checkpoint: every tensor (hash-checked unless `check` is False) and the tree."""
        ref = ManifestRef.parse(ref)
        manifest, commit = self._read_manifest(ref)
        if manifest.tree is None:
            raise StoreError(f"{ref} is a directory checkpoint; use restore_directory")
        futures: list[Future[None]] = []
        raws: dict[str, np.ndarray] = {}
        pool = self._executor()

        def read_into(buf: np.ndarray, chunk_list: ChunkList, where: str) -> None:
            offset = 0
            for chunk, size in chunk_list:
                view = buf.data[offset : offset + size]
                futures.append(pool.submit(self._read_checked, chunk, view, where, check))
                offset += size
            if offset != buf.nbytes:
                raise CorruptManifest(ref.key, f"{where}: chunks hold {offset} of {buf.nbytes}")

        # Ordinary pages, not huge ones: fresh huge pages for every restore were fast on one
        # machine and took twice as long, from one restore to the next, on another (decision
        # 055); the staging rings of writes keep theirs, allocated once.
        pack = np.empty(0, np.uint8)
        if manifest.pack:
            pack = aligned_empty(manifest.pack["nbytes"])
            read_into(pack, manifest.pack["chunks"], "pack")
        for name, entry in manifest.tensors.items():
            if "chunks" in entry:
                raws[name] = aligned_empty(entry["nbytes"])
                read_into(raws[name], entry["chunks"], f"tensor {name}")
        self._run_all(futures)
        self._read_whole(ref.key, commit, manifest.chunks().keys())
        tensors: dict[str, Any] = {}
        for name, entry in manifest.tensors.items():
            if "pack" in entry:
                # A view: tensors of up to 1 MiB are packed, and copying them out of the pack
                # cost a restore of 1 MiB tensors half its time again (decision 055).
                start = entry["pack"]
                raw = pack[start : start + entry["nbytes"]]
            else:
                raw = raws[name]
            tensors[name] = materialise(entry, raw)
        state = decode(manifest.tree.get("state"), tensors)
        extra = decode(manifest.tree.get("extra"), tensors)
        return Checkpoint(ref, manifest, state, extra)

    # ---- integrity, retention, replication --------------------------------------------------

    def verify(self, ref: ManifestRef | str) -> VerifyStats:
        """Read back every chunk of a checkpoint; raise CorruptChunk naming the first bad one."""
        ref = ManifestRef.parse(ref)
        manifest, commit = self._read_manifest(ref)
        pool = self._executor()
        futures: list[Future[None]] = []
        seen: set[str] = set()
        stats = VerifyStats()
        for where, chunk_list in manifest.chunk_lists():
            for chunk, size in chunk_list:
                if chunk in seen:
                    continue
                seen.add(chunk)
                stats.chunks += 1
                stats.bytes += size

                def check(chunk: str = chunk, size: int = size, where: str = where) -> None:
                    self._read_checked(chunk, memoryview(bytearray(size)), where)

                futures.append(pool.submit(check))
        self._run_all(futures)
        self._read_whole(ref.key, commit, seen)
        return stats

    def gc(self, job: str, keep: int, *, grace_s: float = DEFAULT_GC_GRACE_S) -> GcStats:
        """Keep the newest `keep` checkpoints of each rank of `job`; remove unreferenced chunks.

        A chunk is removed only if no remaining manifest of any job in this store references it
        and it is older than `grace_s` (a save elsewhere may be about to reference it).
        """
        if keep < 0:
            raise StoreError("keep must be >= 0")
        by_rank: dict[int, list[ManifestRef]] = {}
        for ref in self.list(job):
            by_rank.setdefault(ref.rank, []).append(ref)
        kept = {ref.key for refs in by_rank.values() for ref in refs[max(len(refs) - keep, 0) :]}
        return self.retain(job, kept, grace_s=grace_s)

    def retain(
        self, job: str, keep: Collection[str], *, grace_s: float = DEFAULT_GC_GRACE_S
    ) -> GcStats:
        """Remove every checkpoint of `job` whose manifest key is not in `keep`, then the chunks
        that no remaining manifest of any job in this store references (older than `grace_s`).
        """
        return self.remove_checkpoints(
            job, [ref for ref in self.list(job) if ref.key not in keep], grace_s=grace_s
        )

    def _named_chunks(self) -> Iterator[tuple[ManifestRef, dict[str, int]]]:
        """Every manifest of every job in this store, with the chunks it names. An unreadable
        one is skipped with a warning: its chunks are unknown, and gc may sweep them."""
        for job in self.jobs():
            for ref in self.list(job):
                try:
                    chunks = self.load_manifest(ref).chunks()
                except (CorruptManifest, ManifestNotFound) as exc:
                    logger.warning("gc: skipping unreadable manifest %s: %s", ref, exc)
                    continue
                yield ref, chunks

    def remove_checkpoints(
        self, job: str, doomed: Collection[ManifestRef], *, grace_s: float = DEFAULT_GC_GRACE_S
    ) -> GcStats:
        """Remove these manifests of `job`, then the chunks that no remaining manifest of any
        job in this store references (older than `grace_s`)."""
        stats = GcStats()
        self._delete([ref.key for ref in doomed])
        stats.manifests_removed = [ref.key for ref in doomed]
        referenced: set[str] = set()
        # The bytes of this job's newest checkpoint of each rank: what its next save may write.
        newest: dict[int, tuple[tuple[int, int, int], int]] = {}
        for ref, chunks in self._named_chunks():
            referenced.update(chunks)
            if ref.job == job and ref.sort_key > newest.get(ref.rank, ((-1, -1, -1), 0))[0]:
                newest[ref.rank] = (ref.sort_key, sum(chunks.values()))
        now = time.time()
        sizes: dict[str, int] = {}
        listed: dict[str, float] = {}
        for chunk, size, modified in self._iter_chunks():
            if chunk not in referenced and now - modified >= grace_s:
                sizes[chunk], listed[chunk] = size, modified
        removed, stats.bytes_recycled = self._sweep_chunks(
            listed, sum(size for _, size in newest.values())
        )
        stats.chunks_removed = len(removed)
        stats.bytes_removed = sum(sizes[chunk] for chunk in removed)
        self._present.clear()
        self._remove_stale_temporaries(grace_s)
        logger.info(
            "gc %s: removed %d manifests and %d chunks (%d bytes, %d of them kept as files for "
            "later saves to write over)",
            job,
            len(doomed),
            stats.chunks_removed,
            stats.bytes_removed,
            stats.bytes_recycled,
        )
        return stats

    def remove_job(self, job: str, *, grace_s: float = DEFAULT_GC_GRACE_S) -> GcStats:
        """Remove every checkpoint of `job`, a job that will save no more (it was deleted), as
        `remove_checkpoints` does, and then the folders a folder store kept for it."""
        stats = self.remove_checkpoints(job, self.list(job), grace_s=grace_s)
        self._remove_job_folders(job)
        return stats

    def remove_chunks(self, chunks: Iterable[str]) -> None:
        """Delete chunks (a corrupt copy, so that the next copy of a checkpoint brings a good one
        again); a manifest that names them fails verification until then."""
        names = sorted(set(chunks))
        self._delete([self.chunk_key(chunk) for chunk in names])
        self._present.difference_update(names)

    def copy(
        self, ref: ManifestRef | str, target: Store, *, cancel: Cancel | None = None
    ) -> CopyStats:
        """Copy one checkpoint to `target`: only the chunks it lacks, then the manifest.

        Chunks are hash-checked on the way, so a corrupt source never produces a replica.
        `cancel` is polled between chunks; when it returns True the copy stops with
        SaveCancelled and writes no manifest.
        """
        started = time.perf_counter()
        ref = ManifestRef.parse(ref)
        raw = self._get_object(ref.key)
        manifest = Manifest.from_json(ref.key, raw)
        stats = CopyStats(manifest=ref.key)
        lock = threading.Lock()
        copied: list[str] = []
        tokens: list[object] = []

        def copy_one(chunk: str, size: int) -> None:
            if cancel is not None and cancel():
                raise SaveCancelled(f"copy of {ref} cancelled")
            if target._chunk_present(chunk):
                with lock:
                    stats.chunks_skipped += 1
                    stats.bytes_skipped += size
                return
            buf = memoryview(bytearray(size))
            self._read_checked(chunk, buf, f"copy of {ref.key}")
            token = target._write_chunk(chunk, buf)
            with lock:
                if token is not None:
                    tokens.append(token)
                stats.chunks_copied += 1
                stats.bytes_copied += size
                copied.append(chunk)

        pool = self._executor()
        try:
            self._run_all([pool.submit(copy_one, c, s) for c, s in manifest.chunks().items()])
            target._finish_chunks(tokens)
        except BaseException:
            target._abandon_chunks(tokens)
            raise
        target._present.update(copied)
        if cancel is not None and cancel():
            raise SaveCancelled(f"copy of {ref} cancelled before its manifest")
        target._commit_manifest(ref.key, raw, copied)
        stats.seconds = time.perf_counter() - started
        return stats

    # ---- directory mode ---------------------------------------------------------------------

    def save_directory(
        self,
        job: str,
        path: str | Path,
        step: int,
        kind: str = "periodic",
        *,
        rank: int = 0,
        world_size: int = 1,
        parent: ManifestRef | str | None = None,
        validation_reference: float | None = None,
        meta: dict[str, Any] | None = None,
        cancel: Cancel | None = None,
    ) -> SaveResult:
        """Snapshot a folder's files as a checkpoint (incremental: unchanged data is not sent).

        Files whose size and modification time match the parent manifest (default: the latest
        of this job and rank) are not even read.
        """
        from .directory import save_directory

        return save_directory(
            self,
            job,
            Path(path),
            step,
            kind,
            rank=rank,
            world_size=world_size,
            parent=parent,
            validation_reference=validation_reference,
            meta=meta,
            cancel=cancel,
        )

    def restore_directory(
        self, ref: ManifestRef | str, path: str | Path, *, clean: bool = True
    ) -> RestoreStats:
        """Make folder `path` hold exactly the files of a directory checkpoint.

        Files already there with the right content are kept; with `clean`, files and folders
        the checkpoint does not have are removed.
        """
        from .directory import restore_directory

        return restore_directory(self, ManifestRef.parse(ref), Path(path), clean=clean)


def _start_all_threads(pool: ThreadPoolExecutor, workers: int) -> None:
    """Start every thread of a new pool now. A pool starts them one per submit otherwise, and
    each start waits for the GIL behind the workers already hashing: at the first save that
    cost a third of the time of a 64 MiB save."""
    barrier = threading.Barrier(workers + 1)
    for _ in range(workers):
        pool.submit(barrier.wait)
    barrier.wait()


class _ChunkWriter:
    """Hashes, deduplicates and writes the chunks of one save on the store's worker threads."""

    def __init__(self, store: Store, cancel: Cancel | None, *, stream: bool = False) -> None:
        self.store = store
        self.cancel = cancel
        self.stream = stream
        self.abort = threading.Event()
        self.lock = threading.Lock()
        self.claimed: set[str] = set()
        self.new_chunks: dict[str, int] = {}
        self.bytes_new = 0
        self.chunks_total = 0
        self.futures: list[Future[tuple[str, int]]] = []
        self.tokens: list[object] = []
        self.token_of: dict[str, object] = {}
        self.finishing: list[object] = []
        self.wait_finishing: Wait | None = None
        self.written_at = 0.0  # perf_counter() when `finish` saw every chunk written

    def add(
        self, data: memoryview | Gathered | None, known: ChunkList | None = None
    ) -> tuple[int, int]:
        """Queue one byte range; returns a handle for `result`.

        `known` (the chunks this very data had at the previous save) skips hashing; the data is
        still needed in case a chunk has been collected since.
        """
        if data is None:
            raise StoreError("a tensor source without data cannot be saved")
        first = len(self.futures)
        pool = self.store._executor()
        size = self.store.chunk_size
        if known is not None:
            offset = 0
            for chunk, length in known:
                self.futures.append(pool.submit(self._store, data[offset : offset + length], chunk))
                offset += length
        else:
            for offset in range(0, len(data), size):
                self.futures.append(pool.submit(self._store, data[offset : offset + size], None))
        return first, len(self.futures)

    def _store(self, view: memoryview | Gathered, known: str | None) -> tuple[str, int]:
        if self.abort.is_set():
            raise SaveCancelled("save aborted")
        if self.cancel is not None and self.cancel():
            self.abort.set()
            raise SaveCancelled("save cancelled")
        nbytes = len(view)
        staged: memoryview | None = None
        token: object | None = None
        whole: memoryview | None = None  # the chunk's bytes, when it is not streamed
        streamed = self.store._write_streaming(view) if known is None and self.stream else None
        if streamed is not None:
            chunk, token = streamed
        else:
            # A gathered pack chunk is gathered once, here, on the worker that writes it.
            whole = view.gather() if isinstance(view, Gathered) else view
            if known is None:
                # Staging first (a copy into an aligned buffer, where the backend needs one)
                # lets the hash read the copy while it is still in the CPU cache.
                staged = self.store._stage(whole)
                chunk = digest(staged)
            else:
                chunk = known
        with self.lock:
            self.chunks_total += 1
            duplicate = chunk in self.claimed
            self.claimed.add(chunk)
        if duplicate or self.store._chunk_present(chunk):
            if streamed is not None:
                self.store._abandon_chunks([token])
            return chunk, nbytes
        if whole is not None:
            data = staged if staged is not None else self.store._stage(whole)
            token = self.store._write_chunk(chunk, data)
        with self.lock:
            if token is not None:
                self.tokens.append(token)
                self.token_of[chunk] = token
            self.new_chunks[chunk] = nbytes
            self.bytes_new += nbytes
        return chunk, nbytes

    def finish(self) -> None:
        """Wait for every queued chunk to be written, then start making the new ones durable
        and visible: the save builds its manifest meanwhile, and `finished` (called by the
        manifest's commit before the manifest becomes visible) waits for it."""
        try:
            self.store._run_all(list(self.futures), self.abort)
        except BaseException:
            self.abort.set()
            raise
        self.written_at = time.perf_counter()
        self.finishing, self.tokens = self.tokens, []
        self.wait_finishing = self.store._start_finishing(self.finishing)

    def finished(self) -> None:
        """Wait until the new chunks are durable and visible (after `finish`)."""
        if self.wait_finishing is None:
            raise StoreError("finished() before finish()")
        self.wait_finishing()
        self.finishing = []
        self.store._present.update(self.new_chunks)

    def drop(self, chunks: Iterable[str]) -> None:
        """Before `finish`: forget new chunks the manifest will not reference (a directory
        save's read of a file that changed under it). They are not counted as new, and a
        backend that names chunks at `finish` (a local folder) never makes them visible."""
        with self.lock:
            for chunk in chunks:
                self.bytes_new -= self.new_chunks.pop(chunk, 0)
                token = self.token_of.pop(chunk, None)
                if token is not None:
                    self.tokens.remove(token)
                    self.store._abandon_chunks([token])

    def abandon(self) -> None:
        """Drop what a save that will not commit wrote but did not finish (a chunk that got
        its name is durable and stays, for gc)."""
        self.abort.set()
        if self.wait_finishing is not None:
            with contextlib.suppress(Exception):  # its error is the one already raised
                self.wait_finishing()
        tokens, self.tokens, self.finishing = [*self.tokens, *self.finishing], [], []
        self.store._abandon_chunks(tokens)

    def result(self, handle: tuple[int, int]) -> ChunkList:
        """The chunk list of a byte range queued with `add`."""
        first, last = handle
        return [f.result() for f in self.futures[first:last]]

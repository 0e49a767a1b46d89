"""A store in a local folder (the instance's fast disk, or a region's store on one machine).

Every write goes to a temporary file in the destination folder and is renamed into place, so a
reader (or a crash) sees either nothing or the whole object. Chunk files are fsynced before
they are renamed, their folders before the manifest is written, and the manifest and its
folder last: after a power cut a manifest never names a chunk that did not reach the disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import cast

import numpy as np

from .errors import CorruptChunk, ManifestNotFound, StoreError
from .hashing import Hasher, new_hasher
from .manifest import EMERGENCY, job_folders
from .snapshot import Gathered, aligned_empty, staging_buffer
from .store import DEFAULT_CHUNK_SIZE, Cancel, Store, Wait, _start_all_threads

logger = logging.getLogger(__name__)

_TMP_MARK = ".tmp-"
# O_DIRECT wants the buffer, the length and the file offset aligned to the logical block size;
# 4096 covers every common device.
_ALIGN = 4096
_DIRECT_MIN = 256 * 1024
# What a streamed chunk is copied, hashed and written in: small enough to stay in the CPU cache
# between the copy and the hash, large enough for the disk (measured: 1 MiB beat 4 MiB).
_STREAM_PIECE = 1024 * 1024
# What a chunk is read and hashed in through the page cache (a store without O_DIRECT): the
# hash reads each piece while it is in the CPU cache, and the kernel's readahead fetches the
# next ones meanwhile (1 MiB beat 2 and 4 MiB pieces; decision 055). With O_DIRECT, reads
# come in `_STREAM_PIECE`s through the staging ring (1 MiB beat 4 MiB and whole chunks).
_READ_PIECE = 1024 * 1024
# Writes of one streamed chunk kept in flight on the I/O threads while its next pieces are
# copied and hashed, and the I/O threads of a store (they wait on the disk, not the CPU).
_STREAM_DEPTH = 2
_IO_THREADS = 8
_RING_BYTES = -(-(_STREAM_DEPTH + 1) * _STREAM_PIECE // (2 * 1024 * 1024)) * 2 * 1024 * 1024
_ring_of_thread = threading.local()
# What `LocalStore.reserve` writes its files in (allocated at first use, then kept).
_ZERO_PIECE = 2 * 1024 * 1024
_ZEROS: memoryview | None = None


def _zero_piece() -> memoryview:
    """A piece of zeros aligned for O_DIRECT, in huge pages (what `LocalStore.reserve` writes)."""
    global _ZEROS
    if _ZEROS is None:
        zeros = aligned_empty(_ZERO_PIECE, huge=True)
        zeros.fill(0)
        _ZEROS = zeros.data
    return _ZEROS


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, out: memoryview, offset: int, chunk: str) -> None:
    filled = 0
    while filled < len(out):
        n = os.preadv(fd, [out[filled:]], offset + filled)
        if n == 0:
            raise CorruptChunk(chunk, f"truncated at {offset + filled} bytes")
        filled += n


def _clear_direct(fd: int) -> None:
    """Go on through the page cache on this descriptor (for a tail that is not a whole block)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _stream_ring() -> list[np.ndarray]:
    """The calling thread's aligned buffers that the pieces of a streamed chunk are copied
    into (and the first of them, what a direct read lands in before it is copied out):
    one per write a stream keeps in flight, and one being filled, in huge pages
    (two of 2 MiB: a virtual disk split each 1 MiB direct write from 4 KiB pages in two, and
    eight threads writing 1 MiB pieces took 1.31x the raw write through 4 KiB pages against
    0.98x through huge pages; decision 055)."""
    ring = getattr(_ring_of_thread, "ring", None)
    if ring is None:
        pieces = aligned_empty(_RING_BYTES, huge=True)
        pieces.fill(0)  # faulted in now, not inside the first save that streams
        ring = [
            pieces[i * _STREAM_PIECE : (i + 1) * _STREAM_PIECE] for i in range(_STREAM_DEPTH + 1)
        ]
        _ring_of_thread.ring = ring
    return cast(list[np.ndarray], ring)


def _read_staged(fd: int, out: memoryview, hasher: Hasher | None, chunk: str) -> None:
    """Fill `out` from `fd` (opened with O_DIRECT) a ring piece at a time: each lands in the
    calling thread's first ring buffer, is copied into `out` (of any alignment) and hashed
    from the buffer while it is in the CPU cache. The tail that is not a whole block is read
    through the page cache, straight into `out`."""
    stage = _stream_ring()[0]
    dest = np.frombuffer(out, dtype=np.uint8)
    body = len(out) - len(out) % _ALIGN
    for start in range(0, body, _STREAM_PIECE):
        piece = stage[: min(_STREAM_PIECE, body - start)]
        _read_exactly(fd, piece.data, start, chunk)
        dest[start : start + piece.nbytes] = piece
        if hasher is not None:
            hasher.update(piece.data)
    if body < len(out):
        _clear_direct(fd)
        _read_exactly(fd, out[body:], body, chunk)
        if hasher is not None:
            hasher.update(out[body:])


class _PieceWrites:
    """The writes of one streamed chunk in flight on the store's I/O threads, at most
    `_STREAM_DEPTH` at a time."""

    def __init__(self, pool: ThreadPoolExecutor, fd: int) -> None:
        self.pool = pool
        self.fd = fd
        self.in_flight: deque[Future[None]] = deque()

    def make_room(self) -> None:
        """Wait until fewer than `_STREAM_DEPTH` writes are in flight."""
        while len(self.in_flight) >= _STREAM_DEPTH:
            self.in_flight.popleft().result()

    def submit(self, piece: memoryview, offset: int) -> None:
        """Write `piece` at `offset` of the file (the piece must stay valid until then)."""
        self.in_flight.append(self.pool.submit(_pwrite_all, self.fd, piece, offset))

    def drain(self, *, quiet: bool = False) -> None:
        """Wait for every write in flight; raise the first failure unless `quiet` (the file is
        being given up: only the writes must be over before its descriptor is closed)."""
        first: BaseException | None = None
        while self.in_flight:
            try:
                self.in_flight.popleft().result()
            except BaseException as exc:  # every write must be waited for, whatever failed
                first = first or exc
        if first is not None and not quiet:
            raise first


def fsync_dir(path: Path) -> None:
    """fsync a folder so the renames inside it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: memoryview | bytes, *, fsync: bool = True) -> None:
    """Write `path` as a whole or not at all: temporary file, fsync, rename, fsync folder."""
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            _write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if fsync:
        fsync_dir(path.parent)


# A chunk file gc recycled: kept in the chunks folder under this prefix until a save writes a
# new chunk over it. Writing over blocks a file already holds skips the allocation of new ones
# (and, on a disk that frees discarded blocks, their provisioning again): half the time of a
# write to a new file on some virtual disks (decision 055, thirteenth pass).
_RECYCLED = ".recycled-"
# How often a store that found no recycled file looks again (gc may run in another process:
# the portal's retention collects the stores of regions).
_RECYCLED_RELIST_S = 1.0
# What gc renames a chunk to while it decides, and how long a read waits for it to come back.
_GC_ASIDE = f"{_TMP_MARK}gc-"
_GC_ASIDE_WAIT_S = 1.0


def _gc_aside(path: Path) -> Path:
    """A name for gc to move the file at `path` to while it decides (a temporary)."""
    return path.with_name(f".{path.name}{_GC_ASIDE}{os.getpid()}-{secrets.token_hex(4)}")


# File systems measured in this process: device -> whether O_DIRECT writes are kept.
_DIRECT_CHOICE: dict[int, bool] = {}
_DIRECT_CHOICE_LOCK = threading.Lock()
_PROBE_BYTES = 8 * 1024 * 1024
# Buffered writes are chosen only when every buffered probe beats the best O_DIRECT one by
# this factor: O_DIRECT costs a fifth of the CPU (decision 005), which a persist beside a
# training loop needs more than a small gain in speed; small probes on a busy machine spread
# by up to 3x, and large writes favour O_DIRECT more than 8 MiB ones (decision 055).
_BUFFERED_MARGIN = 2.0


def _forget_direct_choice_lock() -> None:
    """In a forked child: a thread of the parent may have held the lock, probing, at the fork."""
    global _DIRECT_CHOICE_LOCK
    _DIRECT_CHOICE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_direct_choice_lock)


def _timed_probe_write(folder: Path, data: np.ndarray, direct: bool) -> float:
    """Seconds to write `data` as a new file in `folder` and fsync it (the file is removed)."""
    tmp = folder / f".probe{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
    started = time.perf_counter()
    fd = os.open(tmp, flags, 0o600)
    try:
        _write_all(fd, data.data)
        os.fsync(fd)
    finally:
        os.close(fd)
        os.unlink(tmp)
    return time.perf_counter() - started


def direct_writes_pay(folder: Path) -> bool:
    """Whether chunk writes in `folder` should use O_DIRECT: measured once per file system and
    process by writing 8 MiB each way, twice, alternating. False when the file system refuses
    O_DIRECT or when buffered writes are clearly faster there (some network and copy-on-write
    file systems emulate O_DIRECT through a bounce of their own)."""
    device = os.stat(folder).st_dev
    with _DIRECT_CHOICE_LOCK:
        if device in _DIRECT_CHOICE:
            return _DIRECT_CHOICE[device]
        data = aligned_empty(_PROBE_BYTES)
        data[:] = np.frombuffer(secrets.token_bytes(4096), np.uint8).repeat(_PROBE_BYTES // 4096)
        direct: list[float] = []
        buffered: list[float] = []
        try:
            for _ in range(2):
                direct.append(_timed_probe_write(folder, data, True))
                buffered.append(_timed_probe_write(folder, data, False))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                # Not writable here (a read-only store, a full disk): nothing to measure, and
                # nothing to write. Asked again by the next store opened.
                logger.debug("%s: cannot measure O_DIRECT writes: %s", folder, exc)
                return True
            direct = []  # this file system refuses O_DIRECT
        choice = bool(direct) and max(buffered) * _BUFFERED_MARGIN >= min(direct)
        logger.debug("%s: chunk writes %s", folder, "O_DIRECT" if choice else "buffered")
        _DIRECT_CHOICE[device] = choice
        return choice


class LocalStore(Store):
    """A store rooted at a folder: `file:///path`."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fsync: bool = True,
        direct: bool = True,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        workers: int = 8,
    ) -> None:
        super().__init__(chunk_size=chunk_size, workers=workers)
        self.root = Path(root).absolute()
        self.fsync = fsync
        self.direct = direct and hasattr(os, "O_DIRECT")
        try:
            (self.root / "chunks").mkdir(parents=True, exist_ok=True)
            (self.root / "jobs").mkdir(exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create a store at {self.root}: {exc}") from exc
        if self.direct:
            self.direct = direct_writes_pay(self.root / "chunks")
        self._dirs_made: set[str] = set()
        self._dirs_lock = threading.Lock()
        self._new_dirs = False
        self._io_pool: ThreadPoolExecutor | None = None
        # Recycled chunk files (`_RECYCLED`), listed at first need, after each gc, and when
        # none is left (at most every `_RECYCLED_RELIST_S`).
        self._recycled: list[Path] = []
        self._recycled_listed = -math.inf
        self._recycled_lock = threading.Lock()

    def _io_executor(self) -> ThreadPoolExecutor:
        """Threads that only wait on the disk (the writes of streamed chunks): apart from the
        workers, so a worker waiting for its writes never waits behind its own queue."""
        with self._pool_lock:
            if self._io_pool is None:
                self._io_pool = ThreadPoolExecutor(_IO_THREADS, thread_name_prefix="baton-io")
                _start_all_threads(self._io_pool, _IO_THREADS)
            return self._io_pool

    def _prepare_worker(self) -> None:
        if self.direct:
            # Allocated when the worker starts, not inside its first save or restore.
            _stream_ring()

    def _executor(self) -> ThreadPoolExecutor:
        # The I/O threads start with the workers, not inside the first save that needs them.
        pool = super()._executor()
        self._io_executor()
        return pool

    def _after_fork(self) -> None:
        super()._after_fork()
        self._io_pool = None
        self._dirs_lock = threading.Lock()
        self._recycled_lock = threading.Lock()

    def close(self) -> None:
        """Release the worker and I/O threads (recreated if the store is used again)."""
        super().close()
        with self._pool_lock:
            pool, self._io_pool = self._io_pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    @property
    def url(self) -> str:
        """`file://` URL of the root folder."""
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / key

    def _chunk_path(self, chunk: str) -> Path:
        return self.root / "chunks" / chunk[:2] / chunk

    def _has_chunk(self, chunk: str) -> bool:
        try:
            # Touching a reused chunk renews gc's grace period for it: a concurrent gc in
            # another process will not sweep a chunk a save is about to reference.
            os.utime(self._chunk_path(chunk))
        except FileNotFoundError:
            return False
        except PermissionError:
            return self._chunk_path(chunk).exists()
        return True

    def _chunk_folder(self, chunk: str) -> Path:
        """The folder of a chunk, created on first use (synced with the next manifest)."""
        folder = self._chunk_path(chunk).parent
        if folder.name not in self._dirs_made:
            with self._dirs_lock:
                if not folder.exists():
                    folder.mkdir(exist_ok=True)
                    self._new_dirs = True
                self._dirs_made.add(folder.name)
        return folder

    def _write_chunk(self, chunk: str, data: memoryview) -> object | None:
        folder = self._chunk_folder(chunk)
        path = folder / chunk
        tmp = folder / f".{chunk}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            if not (self.direct and len(data) >= _DIRECT_MIN and self._write_direct(tmp, data)):
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                try:
                    _write_all(fd, data)
                finally:
                    os.close(fd)
            if not self.fsync:
                os.replace(tmp, path)
                return None
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        # The fsync and the rename come later, for all chunks of the save at once: fsyncs
        # issued together share journal commits and device-cache flushes; one per chunk as it
        # is written made them the largest cost of a full save.
        return (tmp, path)

    def _streams(self, kind: str) -> bool:
        # An emergency save races the notice window, and trained tensors have changed since
        # the last save; an empty store can hold none of the chunks.
        return self.direct and self.fsync and (kind == EMERGENCY or not self._list_dirs("chunks/"))

    def _list_recycled(self, *, prune_others: bool = False) -> list[Path]:
        """Read the recycled chunk files of this store's chunk size from the folder (call with
        the lock held); `prune_others` deletes those of another size, left by a store opened
        with another chunk size."""
        self._recycled_listed = time.monotonic()
        self._recycled = []
        for entry in os.scandir(self.root / "chunks"):
            if not entry.name.startswith(_RECYCLED):
                continue
            if entry.stat(follow_symlinks=False).st_size == self.chunk_size:
                self._recycled.append(Path(entry.path))
            elif prune_others:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        return self._recycled

    def _recycled_files(self) -> list[Path]:
        """The recycled chunk files of this store's chunk size (call with the lock held)."""
        if not self._recycled and time.monotonic() - self._recycled_listed >= _RECYCLED_RELIST_S:
            return self._list_recycled()
        return self._recycled

    def _claim_recycled(self, tmp: Path) -> bool:
        """Move a recycled chunk file to `tmp`; False when there is none."""
        with self._recycled_lock:
            files = self._recycled_files()
            while files:
                with contextlib.suppress(FileNotFoundError):  # another process took it
                    os.rename(files.pop(), tmp)
                    return True
        return False

    def reserve(self, nbytes: int, *, stop: Cancel = lambda: False) -> int:
        """Write zero-filled chunk files until the recycled ones hold `nbytes` (in whole chunks),
        so that a save with nothing recycled yet (a job's first checkpoint interval) writes over
        blocks the files already hold instead of allocating new ones (decision 055, fourteenth
        pass). Each file is written and fsynced as a temporary and then renamed, so a failure or
        a kill leaves no half-written recycled file. Nothing is reserved without O_DIRECT or
        fsync (the saves then go through the page cache). A disk without room ends the
        reservation with a warning; what was written stays."""
        if not (self.direct and self.fsync) or self.chunk_size % _ALIGN:
            return 0
        with self._recycled_lock:
            missing = nbytes // self.chunk_size - len(self._list_recycled())
        zeros = _zero_piece()
        written = 0
        for _ in range(missing):
            if stop():
                break
            tmp = self.root / "chunks" / f".reserve{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
            name = self.root / "chunks" / f"{_RECYCLED}{secrets.token_hex(8)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_DIRECT)
                try:
                    for offset in range(0, self.chunk_size, len(zeros)):
                        _pwrite_all(fd, zeros[: self.chunk_size - offset], offset)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, name)
            except OSError as exc:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                logger.warning(
                    "%s: stopped reserving room after %d bytes: %s", self.root, written, exc
                )
                break
            with self._recycled_lock:
                self._recycled.append(name)
            written += self.chunk_size
        return written

    def _open_direct(self, tmp: Path, size: int) -> int | None:
        """A file for the O_DIRECT writes of a chunk of `size` bytes, or None once this file
        system refused O_DIRECT (the store then writes buffered from now on). A whole chunk
        is written over a recycled file when there is one: every byte of it, as the file
        already has the chunk's size."""
        flags = os.O_WRONLY | os.O_CLOEXEC | os.O_DIRECT
        recycled = size == self.chunk_size and self._claim_recycled(tmp)
        try:
            return os.open(tmp, flags if recycled else flags | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as exc:
            if recycled:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            if exc.errno != errno.EINVAL:
                raise
            self.direct = False
            logger.debug("%s: no O_DIRECT on this file system; writing buffered", self.root)
            return None

    def _write_streaming(self, data: memoryview | Gathered) -> tuple[str, object] | None:
        """Copy, hash and write a chunk a piece at a time. Each piece is hashed while it is in
        the CPU cache, then its write goes to the store's I/O threads (O_DIRECT, at its offset)
        while this thread copies and hashes the next pieces: hashing and writing overlap, so
        the slower of the two sets the pace, and the disk sees several writes at once even
        when a save has only a few chunks."""
        if not self.direct or len(data) < _DIRECT_MIN:
            return None
        tmp = self.root / "chunks" / f".stream{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        fd = self._open_direct(tmp, len(data))
        if fd is None:
            return None
        hasher = new_hasher()
        gathered = data if isinstance(data, Gathered) else None
        source = None if isinstance(data, Gathered) else np.frombuffer(data, dtype=np.uint8)
        body = len(data) - len(data) % _ALIGN
        ring = _stream_ring()
        writes = _PieceWrites(self._io_executor(), fd)
        try:
            try:
                for index, start in enumerate(range(0, body, _STREAM_PIECE)):
                    end = min(start + _STREAM_PIECE, body)
                    # Every piece is written from the ring, even one already aligned for
                    # O_DIRECT: the disk reads huge pages faster than the source's own.
                    # The ring buffer this piece takes was last written from by a piece
                    # whose write was seen finished before the previous piece went out.
                    staged = ring[index % len(ring)][: end - start]
                    if gathered is not None:
                        gathered[start:end].copy_into(staged)
                    else:
                        staged[:] = cast(np.ndarray, source)[start:end]
                    piece = staged.data
                    hasher.update(piece)
                    writes.make_room()
                    writes.submit(piece, start)
                writes.drain()
                if body < len(data):
                    _clear_direct(fd)
                    tail = data[body:]
                    tail_bytes = tail.gather() if isinstance(tail, Gathered) else tail
                    hasher.update(tail_bytes)
                    _pwrite_all(fd, tail_bytes, body)
            finally:
                writes.drain(quiet=True)
                os.close(fd)
            chunk = hasher.hexdigest()
            return chunk, (tmp, self._chunk_folder(chunk) / chunk)
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if not (isinstance(exc, OSError) and exc.errno == errno.EINVAL):
                raise
            # The file system took the O_DIRECT open but refuses the writes, as `_write_direct`
            # also handles: from now on this store writes buffered, this chunk included.
            self.direct = False
            return None

    def _finish_chunks(self, tokens: list[object]) -> None:
        self._start_finishing(tokens)()

    def _start_finishing(self, tokens: list[object]) -> Wait:
        # Each chunk's fsync on a worker of its own: fsyncs issued together share journal
        # commits and device-cache flushes; one per chunk as it is written made them the
        # largest cost of a full save (decision 005).
        def finish(token: object) -> None:
            tmp, path = cast(tuple[Path, Path], token)
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            # Only a chunk whose bytes are durable gets its name: a later save that finds the
            # name may trust the content.
            os.replace(tmp, path)

        pool = self._executor()
        futures = [pool.submit(finish, token) for token in tokens]
        return lambda: self._run_all(futures)

    def _abandon_chunks(self, tokens: list[object]) -> None:
        for token in tokens:
            tmp, _ = cast(tuple[Path, Path], token)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _stage(self, data: memoryview) -> memoryview:
        if not self.direct or len(data) < _DIRECT_MIN:
            return data
        source = np.frombuffer(data, dtype=np.uint8)
        if source.ctypes.data % _ALIGN == 0:
            return data
        bounce = staging_buffer(len(data))
        bounce[:] = source
        return bounce.data

    def _write_direct(self, tmp: Path, data: memoryview) -> bool:
        """Write a chunk with O_DIRECT: the disk reads our buffer, no page-cache copy (a fifth
        of the CPU of a buffered write, which a training loop beside a persist notices).
        False if this file system refuses O_DIRECT (the caller then writes buffered)."""
        fd = self._open_direct(tmp, len(data))
        if fd is None:
            return False
        try:
            body = len(data) - len(data) % _ALIGN
            source = np.frombuffer(self._stage(data), dtype=np.uint8)
            try:
                _write_all(fd, source[:body].data)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False
                return self._unlink_and_refuse(fd, tmp)
            if body < len(data):
                _clear_direct(fd)  # the tail is not a whole block
                _write_all(fd, data[body:])
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return True

    @staticmethod
    def _unlink_and_refuse(fd: int, tmp: Path) -> bool:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        return False

    def _sync_chunks(self, chunks: Iterable[str]) -> None:
        if not self.fsync:
            return
        folders = [self.root / "chunks" / name for name in sorted({c[:2] for c in chunks})]
        if self._new_dirs:
            self._new_dirs = False
            folders.append(self.root / "chunks")
        # Concurrent fsyncs share one journal commit; one after the other, each pays for one.
        list(self._executor().map(fsync_dir, folders))

    def _commit_manifest(
        self, key: str, data: bytes, new_chunks: Iterable[str], chunks_finished: Wait | None = None
    ) -> None:
        if not self.fsync:
            super()._commit_manifest(key, data, new_chunks, chunks_finished)
            return
        # Each durability barrier costs a journal commit and waits for the device's cache, so
        # the manifest's temporary file is written and synced beside the new chunks' fsyncs,
        # and the chunk folders are synced together once the chunks have their names; only
        # the rename that publishes the manifest waits for all of it.
        path = self._path(key)
        folders = [self.root / "chunks" / name for name in sorted({c[:2] for c in new_chunks})]
        if self._new_dirs:
            self._new_dirs = False
            folders.append(self.root / "chunks")
        missing = [p for p in (path.parent, path.parent.parent) if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        folders += [p.parent for p in missing]
        tmp = path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")

        def write_tmp() -> None:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)

        # On the I/O threads: the workers may all be waiting in the chunks' fsyncs.
        written = self._io_executor().submit(write_tmp)
        try:
            if chunks_finished is not None:
                chunks_finished()
            pool = self._executor()
            self._run_all([written, *(pool.submit(fsync_dir, f) for f in folders)])
            os.replace(tmp, path)
        except BaseException:
            wait([written])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        fsync_dir(path.parent)

    def _read_checked(self, chunk: str, out: memoryview, where: str, check: bool = True) -> None:
        self._read_pieces(chunk, out, new_hasher() if check else None, where)

    def _read_chunk_into(self, chunk: str, out: memoryview) -> None:
        self._read_pieces(chunk, out, None, "")

    def _open_chunk(self, chunk: str, where: str, direct: bool) -> int:
        """Open a chunk for reading (with O_DIRECT if `direct`). One that gc has moved aside
        while it decides (a save may have reused it, and then gc puts it back) is waited for,
        up to `_GC_ASIDE_WAIT_S`."""
        path = self._chunk_path(chunk)
        flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
        deadline = time.monotonic() + _GC_ASIDE_WAIT_S
        put_back = False  # gc may put it back between the open and the look for it aside
        while True:
            try:
                return os.open(path, flags)
            except FileNotFoundError:
                aside = next(path.parent.glob(f".{path.name}{_GC_ASIDE}*"), None)
                if (aside is None and put_back) or time.monotonic() > deadline:
                    raise CorruptChunk(chunk, "missing", where) from None
                put_back = aside is None
            if not put_back:
                time.sleep(0.005)

    def _read_pieces(self, chunk: str, out: memoryview, hasher: Hasher | None, where: str) -> None:
        """Fill `out` with the chunk, read from its start one piece at a time, each piece hashed
        as it lands; raise CorruptChunk when the chunk is missing, not len(out) bytes, or (with
        `hasher`) not what its name says.

        Where this store writes with O_DIRECT, each piece is read with O_DIRECT into the
        thread's staging ring (huge pages, faulted in once) and copied into `out` while the
        hash reads it from the CPU cache: the disk fills memory that is already mapped, in
        requests as large as the piece. Elsewhere the pieces come through the page cache,
        with the kernel reading ahead (decision 055)."""
        direct = self.direct and len(out) >= _DIRECT_MIN
        fd = self._open_chunk(chunk, where, direct)
        try:
            actual = os.fstat(fd).st_size
            if actual != len(out):
                raise CorruptChunk(chunk, f"{actual} bytes instead of {len(out)}", where)
            if direct:
                _read_staged(fd, out, hasher, chunk)
            else:
                # Sequential: the kernel reads ahead while this thread copies and hashes.
                with contextlib.suppress(OSError):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                for start in range(0, len(out), _READ_PIECE):
                    piece = out[start : start + _READ_PIECE]
                    _read_exactly(fd, piece, start, chunk)
                    if hasher is not None:
                        hasher.update(piece)
        finally:
            os.close(fd)
        if hasher is not None and hasher.hexdigest() != chunk:
            raise CorruptChunk(chunk, "content does not match its hash", where)

    def _put_object(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, fsync=self.fsync)

    def _get_object(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ManifestNotFound(f"{key} not found in {self.url}") from None

    def _list(self, prefix: str) -> list[str]:
        try:
            names = os.listdir(self._path(prefix))
        except FileNotFoundError:
            return []
        return [prefix + name for name in names if not name.startswith(".")]

    def _list_dirs(self, prefix: str) -> list[str]:
        try:
            entries = list(os.scandir(self._path(prefix)))
        except FileNotFoundError:
            return []
        return [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]

    def _delete(self, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))

    def _remove_job_folders(self, job: str) -> None:
        # rmdir takes only an empty folder: one that still holds a temporary (a save cut short,
        # which the stale-temporary sweep removes later) stays until a later run.
        for folder in job_folders(job):
            with contextlib.suppress(OSError):
                self._path(folder).rmdir()

    def _iter_chunks(self) -> Iterator[tuple[str, int, float]]:
        for folder in os.scandir(self.root / "chunks"):
            if not folder.is_dir():
                continue
            for entry in os.scandir(folder.path):
                if entry.name.startswith("."):
                    continue
                st = entry.stat()
                yield entry.name, st.st_size, st.st_mtime

    def _sweep_chunks(self, listed: dict[str, float], recycle_bytes: int) -> tuple[list[str], int]:
        # A save reuses a chunk by touching it (`_has_chunk`), and may do so after gc listed the
        # chunk as old. So a chunk is first moved aside: a save that touches it after the move
        # finds it missing and writes it again, and a touch before the move shows in its
        # modification time, in which case the chunk goes back. Either way a manifest never
        # names a chunk that gc removed. A removed chunk's file is recycled while the recycled
        # files stay within `recycle_bytes`; the rest, and recycled files beyond it, are deleted.
        # The lock is held only around the list: a save meanwhile does not wait for the sweep.
        with self._recycled_lock:
            kept = self._list_recycled(prune_others=True)
            while len(kept) * self.chunk_size > recycle_bytes:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(kept.pop())
            room = recycle_bytes - len(kept) * self.chunk_size
        removed, recycled = [], []
        for chunk, modified in listed.items():
            path = self._chunk_path(chunk)
            doomed = _gc_aside(path)
            try:
                os.rename(path, doomed)
            except FileNotFoundError:
                continue
            st = os.stat(doomed)
            if st.st_mtime != modified:
                os.rename(doomed, path)  # the same content as any copy written meanwhile
                continue
            if st.st_size == self.chunk_size <= room:
                recycled.append(self.root / "chunks" / f"{_RECYCLED}{secrets.token_hex(8)}")
                os.rename(doomed, recycled[-1])
                room -= self.chunk_size
            else:
                os.unlink(doomed)
            removed.append(chunk)
        with self._recycled_lock:
            self._recycled.extend(recycled)
        return removed, len(recycled) * self.chunk_size

    def _remove_stale_temporaries(self, older_than_s: float) -> None:
        now = time.time()
        folders = [self.root / "chunks" / d for d in self._list_dirs("chunks/")]
        folders += [self.root / "chunks"]
        folders += [self.root / "jobs" / job / "manifests" for job in self.jobs()]
        for folder in folders:
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(folder):
                    if _TMP_MARK in entry.name and now - entry.stat().st_mtime > older_than_s:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)

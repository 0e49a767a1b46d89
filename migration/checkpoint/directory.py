"""Directory mode: a folder's files as a checkpoint, and back.

A workload that writes its own checkpoints into a folder gets the same store guarantees as an
SDK workload: content-addressed chunks (a file that did not change costs nothing; a file that
only grew costs its new chunks), a manifest as commit point, and verification on restore.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from . import cdc
from .errors import CorruptManifest, ManifestNotFound, SaveCancelled, StoreError
from .hashing import digest
from .manifest import ChunkList, ManifestRef, check_job, check_kind

if TYPE_CHECKING:
    from .store import Cancel, SaveResult, Store

logger = logging.getLogger(__name__)

# A file modified less than this before the previous scan started may have changed again in
# the same timestamp tick; it is re-read rather than trusted (the "racy git" problem).
_RACY_NS = 2_000_000_000
_ATTEMPTS = 3
RESTORE_TMP = ".baton-tmp-"


class NothingSettled(SaveCancelled):
    """A directory save found no file it could record (each was being written, or changed
    when its writer died, with no earlier version): nothing was committed."""


@dataclass
class RestoreStats:
    """What restoring a directory checkpoint did."""

    files_written: int = 0
    files_unchanged: int = 0
    bytes_written: int = 0
    removed: int = 0


def _scan(root: Path) -> dict[str, os.stat_result]:
    """Every entry under root (not following symlinks), by relative POSIX path, sorted."""
    found: dict[str, os.stat_result] = {}

    def walk(folder: Path, rel: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.name.startswith(RESTORE_TMP):
                    continue
                path = f"{rel}{entry.name}"
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    found[path] = st
                    walk(Path(entry.path), path + "/")
                elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    found[path] = st
                else:
                    logger.debug("directory snapshot: skipping special file %s", entry.path)

    walk(root, "")
    return found


def save_directory(
    store: Store,
    job: str,
    root: Path,
    step: int | Callable[[dict[str, dict[str, Any]]], int],
    kind: str,
    *,
    rank: int,
    world_size: int,
    parent: ManifestRef | str | None,
    validation_reference: float | None,
    meta: dict[str, Any] | None,
    cancel: Cancel | None,
    busy: Callable[[str], bool] | None = None,
    hold: Collection[str] = (),
    allow_empty: bool = True,
) -> SaveResult:
    """See Store.save_directory.

    A file is never recorded half-written: one that `busy(rel)` says a process is writing
    (before or after it is read), one named in `hold` (its content is not trusted: its writer
    died while it changed), and one that kept changing while it was read keep the version the
    parent checkpoint recorded, or are left out when the parent has none (decision 060).
    Without `allow_empty`, a save that would record no file at all raises NothingSettled.
    `step` may be a function of the files the save records, called just before the commit.
    """
    from .store import _ChunkWriter

    started = time.perf_counter()
    label = step if callable(step) else None
    first_step = 0 if callable(step) else int(step)
    ref = ManifestRef(check_job(job), first_step, check_kind(kind), int(rank))
    if not root.is_dir():
        raise StoreError(f"{root} is not a folder")
    parent_ref = ManifestRef.parse(parent) if parent else store.latest(job, rank)
    previous: dict[str, dict[str, Any]] = {}
    previous_scan = 0
    if parent_ref is not None:
        try:
            parent_manifest = store.load_manifest(parent_ref)
            previous = parent_manifest.files or {}
            previous_scan = int(parent_manifest.meta.get("scan_started_ns", 0))
        except (ManifestNotFound, CorruptManifest) as exc:
            logger.info("directory snapshot: parent %s unusable (%s); reading all", parent_ref, exc)
    scan_started = time.time_ns()
    writer = _ChunkWriter(store, cancel, stream=store._streams(ref.kind))
    is_busy = busy or (lambda rel: False)
    files: dict[str, dict[str, Any]] = {}
    # Per file: its entry-to-be and the futures of its chunks (reused or read).
    pending: dict[str, tuple[dict[str, Any], list[Future[tuple[str, int]]]]] = {}

    def reuse(rel: str, entry: dict[str, Any]) -> None:
        pool = store._executor()
        futures = [pool.submit(_ensure_present, store, c, size) for c, size in entry["chunks"]]
        writer.futures.extend(futures)
        pending[rel] = (entry, futures)

    def keep_previous(rel: str, why: str) -> None:
        old = previous.get(rel)
        if old is not None and old.get("type") == "file":
            logger.info(
                "directory snapshot: %s %s; keeping the version of %s", rel, why, parent_ref
            )
            reuse(rel, {**old, "held": True})
        else:
            logger.info("directory snapshot: %s %s and has no earlier version; left out", rel, why)

    def read(rel: str, st: os.stat_result) -> None:
        for _ in range(_ATTEMPTS):
            if is_busy(rel):
                keep_previous(rel, "is being written")
                return
            futures, size = _read_file(store, writer, root / rel, st.st_size)
            try:
                now = os.stat(root / rel, follow_symlinks=False)
            except FileNotFoundError:
                logger.info("directory snapshot: %s vanished while being read", rel)
                return
            same = (now.st_size, now.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
            if same and size == st.st_size and not is_busy(rel):
                entry = {
                    "type": "file",
                    "size": size,
                    "mode": stat.S_IMODE(now.st_mode),
                    "mtime_ns": now.st_mtime_ns,
                }
                pending[rel] = (entry, futures)
                return
            st = now  # changed while read: what was read is dropped unless still referenced
        keep_previous(rel, "kept changing while it was read")

    def settle() -> list[str]:
        """Wait for the pending files' chunks; record each whole one, return the others."""
        store._run_all(writer.futures, writer.abort)
        missing = []
        for rel, (entry, futures) in pending.items():
            chunks: ChunkList = [f.result() for f in futures]
            if all(size >= 0 for _, size in chunks):
                files[rel] = {k: v for k, v in entry.items() if k != "held"} | {"chunks": chunks}
            elif entry.get("held"):
                logger.warning("directory snapshot: the earlier version of %s is gone", rel)
            else:
                missing.append(rel)
        pending.clear()
        return missing

    try:
        for rel, st in _scan(root).items():
            if stat.S_ISDIR(st.st_mode):
                files[rel] = {"type": "dir", "mode": stat.S_IMODE(st.st_mode)}
            elif stat.S_ISLNK(st.st_mode):
                files[rel] = {"type": "symlink", "target": os.readlink(root / rel)}
            elif rel in hold:
                keep_previous(rel, "changed when its writer died")
            else:
                old = previous.get(rel)
                if (
                    old is not None
                    and old.get("type") == "file"
                    and old["size"] == st.st_size
                    and old["mtime_ns"] == st.st_mtime_ns
                    and previous_scan - st.st_mtime_ns > _RACY_NS
                ):
                    # Unchanged since the parent read it: reuse its chunks without reading.
                    reuse(rel, {**old, "mode": stat.S_IMODE(st.st_mode)})
                else:
                    read(rel, st)
        for rel in settle():
            # A reused chunk is gone (its manifest was collected): read the file after all.
            with contextlib.suppress(FileNotFoundError):
                read(rel, os.stat(root / rel, follow_symlinks=False))
        for rel in settle():
            logger.warning("directory snapshot: chunks of %s are gone; left out", rel)
        if not allow_empty and not any(e["type"] == "file" for e in files.values()):
            raise NothingSettled(f"no file of {root} is settled yet; nothing to save")
        referenced = {chunk for e in files.values() for chunk, _ in e.get("chunks", ())}
        writer.drop([chunk for chunk in list(writer.new_chunks) if chunk not in referenced])
        writer.finish()
        if cancel is not None and cancel():
            raise SaveCancelled(f"directory save {ref} cancelled before its manifest")
    except BaseException:
        writer.abandon()
        raise
    files = dict(sorted(files.items()))
    if label is not None:
        ref = ManifestRef(ref.job, int(label(files)), ref.kind, ref.rank)
    return store._commit_save(
        ref,
        writer,
        started,
        world_size=world_size,
        parent=parent_ref,
        validation_reference=validation_reference,
        bytes_total=sum(e["size"] for e in files.values() if e["type"] == "file"),
        chunks_total=sum(len(e.get("chunks", [])) for e in files.values()),
        meta={**(meta or {}), "scan_started_ns": scan_started, "chunking": cdc.ALGORITHM},
        files=files,
    )


def _ensure_present(store: Store, chunk: str, size: int) -> tuple[str, int]:
    """A chunk reused from the parent must still exist (gc may have removed the parent);
    the size is -1 when it does not."""
    return chunk, size if store._chunk_present(chunk) else -1


# Bytes read but not yet hashed and written: bounds the memory of reading a large file.
_IN_FLIGHT = 64 * 1024 * 1024


def _read_file(
    store: Store, writer: Any, path: Path, size: int
) -> tuple[list[Future[tuple[str, int]]], int]:
    """Read one file in content-defined chunks and queue each to be hashed and stored.

    Returns the futures and the bytes read (less than `size` if the file shrank meanwhile).
    """
    pool = store._executor()
    futures: list[Future[tuple[str, int]]] = []
    in_flight: list[tuple[Future[tuple[str, int]], int]] = []
    held = 0
    read = 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], 0
    try:
        for piece in cdc.read_chunks(fd, size):
            future = pool.submit(writer._store, piece, None)
            futures.append(future)
            writer.futures.append(future)
            in_flight.append((future, len(piece)))
            held += len(piece)
            read += len(piece)
            while held > _IN_FLIGHT:
                done, length = in_flight.pop(0)
                done.exception()  # waits; a failure is raised by the caller's _run_all
                held -= length
    finally:
        os.close(fd)
    return futures, read


def _safe_relative(rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not rel or rel != str(path):
        raise StoreError(f"refusing to restore suspicious path {rel!r}")
    return path


def _matches(path: Path, entry: dict[str, Any]) -> bool:
    """True if the regular file at `path` already holds exactly the entry's chunks."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != entry["size"]:
        return False
    with open(path, "rb", buffering=0) as f:
        for chunk, size in entry["chunks"]:
            if digest(f.read(size)) != chunk:
                return False
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def restore_directory(store: Store, ref: ManifestRef, root: Path, *, clean: bool) -> RestoreStats:
    """See Store.restore_directory."""
    manifest = store.load_manifest(ref)
    if manifest.files is None:
        raise StoreError(f"{ref} is not a directory checkpoint; use load")
    entries = {str(_safe_relative(rel)): entry for rel, entry in manifest.files.items()}
    stats = RestoreStats()
    root.mkdir(parents=True, exist_ok=True)
    for rel, entry in sorted(entries.items()):
        if entry["type"] == "dir":
            target = root / rel
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                _remove(target)
            target.mkdir(parents=True, exist_ok=True)
    pool = store._executor()
    futures: list[Future[None]] = []
    finishing: list[tuple[Path, Path, dict[str, Any]]] = []
    for rel, entry in sorted(entries.items()):
        target = root / rel
        if entry["type"] == "symlink":
            if target.is_symlink() and os.readlink(target) == entry["target"]:
                stats.files_unchanged += 1
                continue
            if target.exists() or target.is_symlink():
                _remove(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(entry["target"], target)
            stats.files_written += 1
        elif entry["type"] == "file":
            if _matches(target, entry):
                os.chmod(target, entry["mode"])
                stats.files_unchanged += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f"{RESTORE_TMP}{target.name}-{secrets.token_hex(4)}")
            with open(tmp, "wb") as f:
                f.truncate(entry["size"])
            offset = 0
            for chunk, size in entry["chunks"]:
                futures.append(pool.submit(_fetch_range, store, chunk, size, tmp, offset, rel))
                offset += size
            finishing.append((tmp, target, entry))
            stats.files_written += 1
            stats.bytes_written += entry["size"]
    try:
        store._run_all(futures)
    except BaseException:
        for tmp, _, _ in finishing:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        raise
    for tmp, target, entry in finishing:
        # No fsync: an interrupted restore is simply run again from the store.
        os.chmod(tmp, entry["mode"])
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(tmp, target)
        os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]), follow_symlinks=False)
    for rel, entry in entries.items():
        if entry["type"] == "dir":
            os.chmod(root / rel, entry["mode"])
    if clean:
        for rel in sorted(_scan(root), reverse=True):
            if rel not in entries:
                target = root / rel
                if target.exists() or target.is_symlink():
                    _remove(target)
                    stats.removed += 1
    logger.info(
        "restored %s into %s: %d files written, %d unchanged, %d removed",
        ref,
        root,
        stats.files_written,
        stats.files_unchanged,
        stats.removed,
    )
    return stats


def _fetch_range(store: Store, chunk: str, size: int, tmp: Path, offset: int, rel: str) -> None:
    buf = memoryview(bytearray(size))
    store._read_checked(chunk, buf, f"file {rel}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    try:
        written = 0
        while written < size:
            written += os.pwrite(fd, buf[written:], offset + written)
    finally:
        os.close(fd)

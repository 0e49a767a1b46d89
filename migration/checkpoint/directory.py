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
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

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
    step: int,
    kind: str,
    *,
    rank: int,
    world_size: int,
    parent: ManifestRef | str | None,
    validation_reference: float | None,
    meta: dict[str, Any] | None,
    cancel: Cancel | None,
) -> SaveResult:
    """See Store.save_directory."""
    from .store import _ChunkWriter

    started = time.perf_counter()
    ref = ManifestRef(check_job(job), int(step), check_kind(kind), int(rank))
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

    def collect() -> tuple[dict[str, dict[str, Any]], int]:
        files: dict[str, dict[str, Any]] = {}
        pending: dict[str, tuple[os.stat_result, list[Future[tuple[str, int]]], int]] = {}
        entries = _scan(root)
        for rel, st in entries.items():
            if stat.S_ISDIR(st.st_mode):
                files[rel] = {"type": "dir", "mode": stat.S_IMODE(st.st_mode)}
            elif stat.S_ISLNK(st.st_mode):
                files[rel] = {"type": "symlink", "target": os.readlink(root / rel)}
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
                    files[rel] = {**old, "mode": stat.S_IMODE(st.st_mode)}
                    first = len(writer.futures)
                    pool = store._executor()
                    for chunk, _ in old["chunks"]:
                        writer.futures.append(pool.submit(_ensure_present, store, chunk))
                    pending[rel] = (st, writer.futures[first:], -1)
                else:
                    pending[rel] = (st, _queue_file(store, writer, root / rel, st.st_size), 0)
        bytes_total = 0
        for attempt in range(_ATTEMPTS):
            store._run_all([f for _, futures, _ in pending.values() for f in futures], writer.abort)
            changed: dict[str, tuple[os.stat_result, list[Future[tuple[str, int]]], int]] = {}
            for rel, (st, futures, tries) in pending.items():
                chunks: ChunkList = [f.result() for f in futures]
                if tries < 0:
                    if all(size >= 0 for _, size in chunks):
                        bytes_total += files[rel]["size"]
                        continue
                    # A reused chunk is gone (its manifest was collected): read the file after all.
                    changed[rel] = (st, _queue_file(store, writer, root / rel, st.st_size), 0)
                    continue
                try:
                    now = os.stat(root / rel, follow_symlinks=False)
                except FileNotFoundError:
                    logger.info("directory snapshot: %s vanished while being read", rel)
                    files.pop(rel, None)
                    continue
                size = sum(s for _, s in chunks)
                moved = (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns)
                if (moved or size != st.st_size) and attempt + 1 < _ATTEMPTS:
                    again = _queue_file(store, writer, root / rel, now.st_size)
                    changed[rel] = (now, again, tries + 1)
                    continue
                if moved or size != st.st_size:
                    logger.warning("directory snapshot: %s kept changing; saved as last read", rel)
                files[rel] = {
                    "type": "file",
                    "size": size,
                    "mode": stat.S_IMODE(now.st_mode),
                    "mtime_ns": now.st_mtime_ns,
                    "chunks": chunks,
                }
                bytes_total += size
            if not changed:
                break
            pending = changed
        return files, bytes_total

    try:
        files, bytes_total = collect()
        writer.finish()
    except BaseException:
        writer.abandon()
        raise
    if cancel is not None and cancel():
        raise SaveCancelled(f"directory save {ref} cancelled before its manifest")
    return store._commit_save(
        ref,
        writer,
        started,
        world_size=world_size,
        parent=parent_ref,
        validation_reference=validation_reference,
        bytes_total=bytes_total,
        chunks_total=sum(len(e.get("chunks", [])) for e in files.values()),
        meta={**(meta or {}), "scan_started_ns": scan_started},
        files=files,
    )


def _ensure_present(store: Store, chunk: str) -> tuple[str, int]:
    """A chunk reused from the parent must still exist (gc may have removed the parent);
    the size is -1 when it does not."""
    return chunk, 0 if store._chunk_present(chunk) else -1


def _queue_file(store: Store, writer: Any, path: Path, size: int) -> list[Future[tuple[str, int]]]:
    """Queue the chunks of one file; each worker reads its own range (bounded memory)."""
    pool = store._executor()
    futures = []
    for offset in range(0, size, store.chunk_size):
        length = min(store.chunk_size, size - offset)
        futures.append(pool.submit(_store_range, writer, path, offset, length))
    return futures


def _store_range(writer: Any, path: Path, offset: int, length: int) -> tuple[str, int]:
    with open(path, "rb", buffering=0) as f:
        data = os.pread(f.fileno(), length, offset)
    return writer._store(memoryview(data), None)


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

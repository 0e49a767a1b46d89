"""Two tiers on the instance: checkpoints commit to fast local disk, then go to the region's store.

With `BATON_LOCAL_STORE_URL` (a `file:///...` folder on the instance's own disk) set beside
`BATON_STORE_URL` (the region's store), a periodic save of the SDK commits to the local tier,
which is all the training loop waits for; an `Uploader` thread then copies that checkpoint to
the region's store (`Store.copy`: only the chunks the region lacks, each hash-checked on the
way, the manifest last) and only then reports it to the agent. The portal hears of a
checkpoint once it is in the region's store, where a restore elsewhere can find it.

- Newest wins: one upload runs at a time and one waits; a newer local commit replaces the one
  waiting (it is skipped, never queued for ever behind a slow store).
- The local tier stays small: after every local commit and every upload, only the newest local
  commit, the one being uploaded and (when none is) the last one uploaded are kept.
- A checkpoint the workload committed locally but did not upload (it was killed first) is
  uploaded by the agent after the workload exits (`upload_after_exit`).

Nothing else may write into a local tier: it belongs to one rank of one instance, so its
retention can sweep chunks at once instead of after a grace period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SaveCancelled, StoreConfigError, StoreError
from .forks import renew_after_fork
from .local import LocalStore
from .manifest import Manifest, ManifestRef, check_job
from .store import CopyStats, SaveResult, Store
from .urls import open_store

logger = logging.getLogger(__name__)

LOCAL_STORE_ENV = "BATON_LOCAL_STORE_URL"
Report = Callable[[dict[str, Any]], None]


def checkpoint_event(manifest: Manifest, **fields: Any) -> dict[str, Any]:
    """The body of a `checkpoint` report for a committed manifest, plus `fields`."""
    return {
        "manifest": manifest.ref.key,
        "step": manifest.step,
        "kind": manifest.kind,
        "bytes_new": manifest.bytes_new,
        "bytes_total": manifest.bytes_total,
        "validation_reference": manifest.validation_reference,
        "rank": manifest.rank,
        "world_size": manifest.world_size,
        **fields,
    }


def upload_fields(stats: CopyStats, uploaded_by: str) -> dict[str, Any]:
    """What an upload adds to a `checkpoint` report."""
    return {
        "bytes_uploaded": stats.bytes_copied,
        "upload_seconds": round(stats.seconds, 3),
        "uploaded_by": uploaded_by,
    }


def open_local_tier(environ: Mapping[str, str], region: Store) -> LocalStore | None:
    """The local tier named by BATON_LOCAL_STORE_URL, or None when it is not set.

    Raises StoreConfigError naming the variable when it is not a folder or is the region's
    store itself.
    """
    url = environ.get(LOCAL_STORE_ENV, "").strip()
    if not url:
        return None
    if not url.startswith("file:"):
        raise StoreConfigError(
            f"{LOCAL_STORE_ENV}={url!r}: the local tier is a folder on the instance's own disk "
            "(file:///absolute/path)"
        )
    try:
        local = open_store(url)
    except StoreConfigError as exc:
        raise StoreConfigError(f"{LOCAL_STORE_ENV}: {exc}") from None
    assert isinstance(local, LocalStore)
    if local.url == region.url:
        local.close()
        raise StoreConfigError(
            f"{LOCAL_STORE_ENV} names the region's store itself ({region.url}); "
            "the local tier must be a folder of its own"
        )
    return local


@dataclass
class _Pending:
    """A checkpoint committed in the local tier and not yet in the region's store."""

    result: SaveResult
    committed_at: float


class Uploader:
    """Copies checkpoints committed in the local tier to the region's store, newest first.

    `submit` is called by whoever committed to the local tier, holding `lock`; every write to
    the local tier holds `lock`, so the tier's retention never runs beside a write.
    `report` is called with the `checkpoint` report of every checkpoint uploaded.
    `stop_requested` (e.g. "a final notice came") is polled between chunks: when it returns True
    the upload in flight stops and nothing more is uploaded.
    """

    def __init__(
        self,
        local: Store,
        region: Store,
        job: str,
        report: Report,
        *,
        stop_requested: Callable[[], bool] = lambda: False,
    ) -> None:
        self.local = local
        # The upload reads the local tier through a handle of its own, so its worker threads
        # are not the ones local commits use: a region that stalls holds up only the upload.
        self._source = open_store(local.url, chunk_size=local.chunk_size, workers=region.workers)
        self.region = region
        self.job = check_job(job)
        self.report = report
        self.lock = threading.RLock()
        self.uploads_done = 0
        self.uploads_skipped = 0
        self.last_upload: CopyStats | None = None
        self.last_error: BaseException | None = None
        self._stop_requested = stop_requested
        self._cond = threading.Condition()
        self._pending: _Pending | None = None
        self._in_flight: ManifestRef | None = None
        self._newest: ManifestRef | None = None
        self._last_uploaded: ManifestRef | None = None
        self._cancel = False
        self._closed = False
        self._thread: threading.Thread | None = None
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (decision 073): the upload in flight and the one waiting are the
        parent's, whose thread finishes them; the child's next commit starts a thread of its
        own."""
        self.lock = threading.RLock()
        self._cond = threading.Condition()
        self._pending = None
        self._in_flight = None
        self._cancel = False
        self._thread = None

    # ---- called by the committer ------------------------------------------------------------

    def submit(self, result: SaveResult) -> None:
        """Upload this local commit next (the caller holds `lock`); an older one still waiting
        is skipped."""
        with self._cond:
            if self._pending is not None:
                self.uploads_skipped += 1
                logger.info(
                    "upload of step=%d skipped: step=%d is newer",
                    self._pending.result.ref.step,
                    result.ref.step,
                )
            self._pending = _Pending(result, time.monotonic())
            self._newest = result.ref
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="baton-upload", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        self._trim()

    def supersede(self) -> None:
        """A newer checkpoint goes straight to the region's store: stop the upload in flight
        (at its next chunk; nothing of it becomes visible), drop the one waiting, wait until
        the uploader is idle."""
        with self._cond:
            if self._pending is not None:
                self.uploads_skipped += 1
                self._pending = None
            self._cancel = True
            while self._in_flight is not None:
                self._cond.wait(0.05)
            self._cancel = False

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every local commit submitted so far was uploaded (or failed); False when
        `timeout` ran out first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._in_flight is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop the thread once it is idle (call `drain` first to finish what is waiting)."""
        with self._cond:
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        self._source.close()

    # ---- the upload thread ------------------------------------------------------------------

    def _cancelled(self) -> bool:
        return self._cancel or self._stop_requested()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                item, self._pending = self._pending, None
                self._in_flight = item.result.ref
            try:
                self._upload(item)
            finally:
                with self._cond:
                    self._in_flight = None
                    self._cond.notify_all()
            self._trim()

    def _upload(self, item: _Pending) -> None:
        ref = item.result.ref
        if self._cancelled():
            logger.info("upload of step=%d not started: superseded", ref.step)
            return
        try:
            # On low-priority workers: the upload runs beside the training loop.
            with self._source.background():
                stats = self._source.copy(ref, self.region, cancel=self._cancelled)
        except SaveCancelled:
            logger.info("upload of step=%d stopped: a newer checkpoint supersedes it", ref.step)
            return
        except StoreError as exc:
            self.last_error = exc
            logger.error("upload of step=%d to %s failed: %s", ref.step, self.region.url, exc)
            return
        except Exception as exc:  # keep the thread alive; training goes on
            self.last_error = exc
            logger.exception("upload of step=%d crashed", ref.step)
            return
        self.uploads_done += 1
        self.last_upload = stats
        self._last_uploaded = ref
        logger.info(
            "uploaded %s step=%d to %s: %d bytes of %d new there in %.3fs (%.3fs after the "
            "local commit)",
            ref.key,
            ref.step,
            self.region.url,
            stats.bytes_copied,
            stats.bytes_copied + stats.bytes_skipped,
            stats.seconds,
            time.monotonic() - item.committed_at,
        )
        self.report(
            checkpoint_event(
                item.result.manifest,
                local_write_seconds=round(item.result.seconds, 3),
                **upload_fields(stats, "sdk"),
            )
        )

    # ---- retention of the local tier --------------------------------------------------------

    def _trim(self) -> None:
        """Keep the newest local commit and the one being uploaded or, when none is, the last
        one uploaded (a restore on this machine reads it from here); collect the rest now."""
        # Under the write lock, so no commit lands between choosing what to keep and removing
        # the rest (a re-entrant lock: `submit` runs with it held).
        with self.lock:
            with self._cond:
                keep = (self._newest, self._in_flight or self._last_uploaded)
            keys = {ref.key for ref in keep if ref is not None}
            try:
                stats = self.local.retain(self.job, keys, grace_s=0)
            except StoreError as exc:
                logger.warning("could not trim the local tier %s: %s", self.local.url, exc)
                return
        if stats.manifests_removed:
            logger.debug("local tier: removed %s", ", ".join(stats.manifests_removed))


def upload_after_exit(environ: Mapping[str, str], emit: Callable[..., object]) -> list[CopyStats]:
    """After the workload ended (for any reason): upload the local tier's checkpoints of this
    job and rank that are newer than the region's newest, oldest first, and report each.

    For the agent: a workload killed between its local commit and its upload loses nothing.
    Never raises: a failure is logged and the checkpoints concerned are simply not reported.
    """
    if not environ.get(LOCAL_STORE_ENV, "").strip():
        return []
    try:
        return _upload_after_exit(environ, emit)
    except Exception:  # the agent must still report the exit
        logger.exception("the upload of the local tier failed")
        return []


def _upload_after_exit(environ: Mapping[str, str], emit: Callable[..., object]) -> list[CopyStats]:
    uploaded: list[CopyStats] = []
    region_url = environ.get("BATON_STORE_URL", "").strip()
    if not region_url:
        logger.error("%s is set but BATON_STORE_URL is not: nothing to upload to", LOCAL_STORE_ENV)
        return []
    try:
        job = check_job(environ.get("BATON_JOB_ID", "").strip() or "local")
        rank = int(environ.get("BATON_RANK", "").strip() or 0)
        region = open_store(
            region_url, endpoint=environ.get("BATON_S3_ENDPOINT", "").strip() or None
        )
    except (StoreError, ValueError) as exc:
        logger.error("cannot upload the local tier: %s", exc)
        return []
    try:
        local = open_local_tier(environ, region)
    except StoreError as exc:
        logger.error("cannot upload the local tier: %s", exc)
        region.close()
        return []
    assert local is not None
    try:
        newest = region.latest(job, rank)
        waiting = [
            ref for ref in local.list(job, rank) if newest is None or ref.sort_key > newest.sort_key
        ]
        for ref in waiting:
            try:
                stats = local.copy(ref, region)
                manifest = local.load_manifest(ref)
            except StoreError as exc:
                logger.error("upload of %s to %s failed: %s", ref.key, region.url, exc)
                continue
            uploaded.append(stats)
            logger.info(
                "uploaded %s (left in the local tier by the workload): %d bytes new in %.3fs",
                ref.key,
                stats.bytes_copied,
                stats.seconds,
            )
            emit("checkpoint", **checkpoint_event(manifest, **upload_fields(stats, "agent")))
    except StoreError as exc:
        logger.error("cannot upload the local tier: %s", exc)
    finally:
        local.close()
        region.close()
    return uploaded

"""`Checkpointer`: the SDK a training loop uses to survive spot interruptions.

    ckpt = Checkpointer.from_env()
    restored = ckpt.restore()                  # None, or .step, .state, .extra (RNG restored)
    for step in range(start, total):
        ...
        ckpt.maybe_save(step + 1, state, extra={"loader_offset": ...}, val_loss=validate)
        if ckpt.should_stop:                   # final notice: emergency checkpoint taken
            break
    ckpt.save_final(total, state, val_loss=...)
    ckpt.report_result(total, val_loss, weights_sha256)
    ckpt.close()

Periodic saves are incremental (content-addressed chunks: an unchanged tensor is not written
again) and asynchronous: at a step boundary the state is copied into reusable buffers and a
background thread persists it; at most one persist is in flight and a save that comes due while
one is running waits for it (back-pressure, never unbounded memory).

Signals (installed when the Checkpointer is created on the main thread):
- SIGUSR1, the advance notice: checkpoint at the next step boundary;
- SIGTERM, the final notice: the persist in flight is cancelled at once (the disk is left to
  the emergency save), and at the next step boundary an emergency checkpoint is written
  synchronously from the live state (no copy, no compression, no verification pass); then
  `should_stop`.
The handlers only set flags; everything else happens on the training thread at a step
boundary, where the state is consistent. Notice callbacks run there too.

Two tiers (`local_store`, from BATON_LOCAL_STORE_URL): a periodic save commits to the
instance's fast local disk and an uploader thread copies it to the region's store (`store`)
and then reports it (`tiers.Uploader`); emergency and synchronous saves go straight to the
region's store after stopping the upload in flight.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np

from .errors import CorruptChunk, CorruptManifest, SaveCancelled, StoreConfigError, StoreError
from .forks import renew_after_fork
from .local import LocalStore
from .manifest import EMERGENCY, FINAL, PERIODIC, ManifestRef, check_job
from .report import AgentReporter
from .snapshot import BufferPool, FrozenCache, Snapshot, pack_limit_for, state_nbytes
from .store import Checkpoint, SaveResult, Store, lower_thread_priority
from .tiers import LOCAL_STORE_ENV, Uploader, checkpoint_event, open_local_tier
from .urls import open_store

logger = logging.getLogger(__name__)

DEFAULT_EVERY_SECONDS = 300.0
_PROGRESS_INTERVAL_S = 1.0

ValLoss = float | Callable[[], float] | None
NoticeCallback = Callable[[str], None]


@dataclass
class Restored:
    """The state a run resumes from."""

    ref: ManifestRef
    step: int
    state: Any
    extra: Any
    validation_reference: float | None
    world_size: int
    rank: int
    #: Read from the local tier (the same manifest as the region's, on this machine's disk).
    from_local_tier: bool = False

    @property
    def loader_offset(self) -> int | None:
        """The data-loader position saved as `extra["loader_offset"]`, if any."""
        if isinstance(self.extra, dict):
            offset = self.extra.get("loader_offset")
            return int(offset) if offset is not None else None
        return None


def _env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise StoreConfigError(f"{name}={raw!r} is not a whole number") from None


def _env_float(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StoreConfigError(f"{name}={raw!r} is not a number") from None
    if value < 0 or math.isnan(value):
        raise StoreConfigError(f"{name}={raw!r} must be >= 0")
    return value


def capture_rng_states() -> dict[str, Any]:
    """The state of every random generator a training loop commonly draws from."""
    states: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["torch_cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: Mapping[str, Any]) -> None:
    """Put the generators back where `capture_rng_states` found them."""
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and "torch" in states:
        torch.set_rng_state(states["torch"])
        if "torch_cuda" in states and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["torch_cuda"])


@dataclass
class _PersistJob:
    step: int
    kind: str
    snapshot: Snapshot
    validation_reference: float | None
    parent: ManifestRef | None


class Checkpointer:
    """Periodic, incremental, asynchronous checkpoints plus emergency saves on notice."""

    def __init__(
        self,
        store: Store,
        *,
        job: str = "local",
        rank: int = 0,
        world_size: int = 1,
        every_steps: int | None = None,
        every_seconds: float | None = DEFAULT_EVERY_SECONDS,
        resume: str | None = None,
        agent_url: str | None = None,
        async_save: bool = True,
        verify: bool | None = None,
        install_signal_handlers: bool = True,
        owns_store: bool = False,
        local_store: Store | None = None,
    ) -> None:
        self.store = store
        self.local_store = local_store
        self.job = check_job(job)
        self.rank = rank
        self.world_size = world_size
        self.every_steps = every_steps if every_steps and every_steps > 0 else None
        self.every_seconds = every_seconds if every_seconds and every_seconds > 0 else None
        self.resume = resume or None
        self.async_save = async_save
        # The read-back of a periodic save catches corruption on the way to a remote store; on
        # a local disk it would read the page cache it just wrote, so it is skipped there.
        self.verify = store.verify_after_write if verify is None else verify
        # Where periodic saves commit: the local tier when there is one.
        self._persist_store = local_store or store
        self._pack_limit = pack_limit_for(min(self._persist_store.chunk_size, store.chunk_size))
        self._persist_verify = self._persist_store.verify_after_write if verify is None else verify
        self._owns_store = owns_store
        for tier in (store, local_store):
            if tier is not None:
                tier.start()  # the first save may be an emergency one
        self.reporter = AgentReporter(agent_url)
        self.uploader: Uploader | None = None
        if local_store is not None:
            self.uploader = Uploader(
                local_store,
                store,
                self.job,
                lambda body: self.reporter.post("checkpoint", body),
                # After a final notice the emergency save supersedes every local commit.
                stop_requested=lambda: self._final_pending or self._final_seen,
            )
        self.last_committed: SaveResult | None = None
        self.restored: Restored | None = None
        self.last_error: BaseException | None = None
        self.saves_skipped_busy = 0
        self._parent: ManifestRef | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._last_progress = 0.0
        self._buffers = BufferPool()
        self._frozen = FrozenCache()
        # Written by signal handlers: plain attributes only (no locks in a handler).
        self._advance_pending = False
        self._final_pending = False
        self._cancel_persist = False
        self._advance_seen = 0
        self._final_seen = False
        self._should_stop = False
        self._advance_callbacks: list[NoticeCallback] = []
        self._final_callbacks: list[NoticeCallback] = []
        self._idle = threading.Condition()
        self._job: _PersistJob | None = None
        self._closed = False
        self._worker: threading.Thread | None = None
        # Room for the saves that find nothing to recycle: prepared at the first step, for the
        # first save, and once more after the first save, for the next one (`_start_reserving`).
        self._reserver: threading.Thread | None = None
        self._reserved_at_first_step = False
        self._reserved_after_save = False
        self._stop_reserving = threading.Event()
        self._previous_handlers: dict[int, Any] = {}
        if install_signal_handlers:
            self.install_signal_handlers()
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (decision 073): the persist in flight and the room being reserved
        are the parent's, whose threads finish them; the child waits for neither, and its next
        save starts threads of its own. The signal handlers stay: a notice to the child reaches
        its copy of the Checkpointer."""
        self._idle = threading.Condition()
        self._job = None
        self._worker = None
        self._reserver = None
        stop_reserving, self._stop_reserving = self._stop_reserving, threading.Event()
        if stop_reserving.is_set():
            self._stop_reserving.set()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Checkpointer:
        """A Checkpointer configured from the BATON_* environment (standalone defaults)."""
        env = os.environ if environ is None else environ
        url = env.get("BATON_STORE_URL", "").strip()
        if env.get(LOCAL_STORE_ENV, "").strip() and not url:
            raise StoreConfigError(
                f"{LOCAL_STORE_ENV} is set but BATON_STORE_URL is not: the local tier needs "
                "the region's store to upload to"
            )
        if url:
            store = open_store(url, endpoint=env.get("BATON_S3_ENDPOINT") or None)
        else:
            store = LocalStore(env.get("BATON_CHECKPOINT_DIR", "").strip() or "./checkpoints")
        options: dict[str, Any] = {
            "job": env.get("BATON_JOB_ID", "").strip() or "local",
            "rank": _env_int(env, "BATON_RANK", 0),
            "world_size": _env_int(env, "BATON_WORLD_SIZE", 1),
            "every_steps": _env_int(env, "BATON_CHECKPOINT_EVERY_STEPS", None),
            "every_seconds": _env_float(
                env, "BATON_CHECKPOINT_EVERY_SECONDS", DEFAULT_EVERY_SECONDS
            ),
            "resume": env.get("BATON_RESUME", "").strip() or None,
            "agent_url": env.get("BATON_AGENT_URL", "").strip() or None,
            "owns_store": True,
            "local_store": open_local_tier(env, store),
        }
        options.update(overrides)
        return cls(store, **options)

    # ---- notices ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGUSR1 = advance notice, SIGTERM = final notice (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not on the main thread: notices come only through request_*()")
            return
        for signum, handler in (
            (signal.SIGUSR1, self._on_sigusr1),
            (signal.SIGTERM, self._on_sigterm),
        ):
            self._previous_handlers[signum] = signal.signal(signum, handler)

    def _on_sigusr1(self, signum: int, frame: FrameType | None) -> None:
        self._advance_pending = True

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._final_pending = True
        # Stop the persist in flight now, so the emergency save has the disk to itself.
        self._cancel_persist = True

    def request_checkpoint(self) -> None:
        """Advance notice from code: checkpoint at the next step boundary."""
        self._advance_pending = True

    def request_stop(self) -> None:
        """Final notice from code: emergency checkpoint at the next step boundary, then stop."""
        self._on_sigterm(signal.SIGTERM, None)

    def on_advance_notice(self, callback: NoticeCallback) -> None:
        """Call `callback("advance")` at the step boundary after an advance notice."""
        self._advance_callbacks.append(callback)

    def on_final_notice(self, callback: NoticeCallback) -> None:
        """Call `callback("final")` at the step boundary after the final notice (before saving)."""
        self._final_callbacks.append(callback)

    @property
    def should_stop(self) -> bool:
        """True once the final notice was handled: the emergency checkpoint has been taken."""
        return self._should_stop

    @property
    def notice(self) -> str | None:
        """ "final", "advance" or None: the strongest notice received so far."""
        if self._final_pending or self._final_seen:
            return "final"
        return "advance" if (self._advance_pending or self._advance_seen) else None

    # ---- restore ----------------------------------------------------------------------------

    def _candidates(self) -> list[ManifestRef]:
        if self.resume:
            ref = ManifestRef.parse(self.resume)
            if ref.job != self.job:
                raise StoreConfigError(f"BATON_RESUME names job {ref.job}, this is job {self.job}")
            own = ref.for_rank(self.rank)
            return [own if own in self.store.list(self.job, self.rank) else ref]
        if self.world_size > 1:
            ranks: dict[tuple[int, str], set[int]] = {}
            for ref in self.store.list(self.job):
                ranks.setdefault((ref.step, ref.kind), set()).add(ref.rank)
            everyone = set(range(self.world_size))
            complete = [
                ManifestRef(self.job, step, kind, self.rank)
                for (step, kind), present in ranks.items()
                if present >= everyone
            ]
            return sorted(complete, key=lambda r: r.sort_key, reverse=True)
        return list(reversed(self.store.list(self.job, self.rank)))

    def restore(self) -> Restored | None:
        """Load the checkpoint to resume from (BATON_RESUME, else the latest) or None.

        RNG states (python, numpy, torch) are restored as a side effect. Without BATON_RESUME a
        latest checkpoint that turns out to be corrupt is skipped for the one before it.
        """
        for ref in self._candidates():
            try:
                checkpoint, from_local = self._load(ref)
            except (CorruptChunk, CorruptManifest) as exc:
                if self.resume:
                    raise
                logger.error("checkpoint %s is corrupt (%s); trying the previous one", ref, exc)
                continue
            extra = checkpoint.extra if isinstance(checkpoint.extra, dict) else {}
            restore_rng_states(extra.get("rng", {}))
            manifest = checkpoint.manifest
            self.restored = Restored(
                ref=ref,
                step=manifest.step,
                state=checkpoint.state,
                extra=extra.get("user"),
                validation_reference=manifest.validation_reference,
                world_size=manifest.world_size,
                rank=manifest.rank,
                from_local_tier=from_local,
            )
            self._parent = ref
            self._last_saved_step = manifest.step
            self._last_save_time = time.monotonic()
            where = "the local tier" if from_local else self.store.url
            logger.info("restored step=%d from %s in %s", manifest.step, ref, where)
            return self.restored
        return None

    def _load(self, ref: ManifestRef) -> tuple[Checkpoint, bool]:
        """Load `ref` from the local tier when it holds the very manifest the region's store
        has (a faster restore on the same machine), else from the region's store; and whether
        it came from the local tier."""
        local = self.local_store
        if local is not None and ref in local.list(self.job, ref.rank):
            region_manifest = self.store.load_manifest(ref)
            try:
                if local.load_manifest(ref) == region_manifest:
                    return local.load(ref), True
                logger.info("the local tier's %s differs from the region's; not used", ref)
            except StoreError as exc:
                logger.warning("restore of %s from the local tier failed (%s)", ref, exc)
        return self.store.load(ref), False

    def report_restore(self, val_loss: float, *, rel_tol: float = 1e-4) -> bool:
        """Report the validation loss measured right after `restore`; True if it matches the
        reference recorded in the checkpoint (or there is none to compare with)."""
        if self.restored is None:
            return True
        reference = self.restored.validation_reference
        self.reporter.post(
            "restore",
            {
                "manifest": self.restored.ref.key,
                "step": self.restored.step,
                "val_loss": float(val_loss),
                "reference": reference,
            },
        )
        if reference is None:
            return True
        return math.isclose(val_loss, reference, rel_tol=rel_tol, abs_tol=1e-9)

    # ---- saving -----------------------------------------------------------------------------

    def _due(self, step: int) -> bool:
        if step == self._last_saved_step:
            return False
        if self.every_steps and step % self.every_steps == 0:
            return True
        return bool(
            self.every_seconds and time.monotonic() - self._last_save_time >= self.every_seconds
        )

    def _fire(self, callbacks: list[NoticeCallback], level: str) -> None:
        for callback in callbacks:
            try:
                callback(level)
            except Exception:
                logger.exception("%s-notice callback failed", level)

    def maybe_save(
        self,
        step: int,
        state: object,
        extra: object = None,
        *,
        val_loss: ValLoss = None,
    ) -> bool:
        """Call at every step boundary with the state after `step` steps.

        Saves when due (every N steps / T seconds, or after an advance notice), asynchronously;
        after the final notice saves an emergency checkpoint and sets `should_stop`. Returns
        True if a checkpoint was started or taken. `val_loss` (a number or a callable) is the
        validation reference recorded in the checkpoint, evaluated only when one is taken.
        """
        if self._should_stop:
            return False
        if self._final_pending:
            self._handle_final(step, state, extra, val_loss)
            return True
        self._report_progress(step)
        if not self._reserved_at_first_step:
            self._reserve_for_first_save(state)
        advance = self._advance_pending
        if advance:
            self._advance_pending = False
            self._advance_seen += 1
            self._fire(self._advance_callbacks, "advance")
        if not (advance or self._due(step)):
            return False
        self._wait_idle()
        if self._final_pending:  # arrived while waiting for the previous persist
            self._handle_final(step, state, extra, val_loss)
            return True
        self._start_save(step, PERIODIC, state, extra, val_loss)
        return True

    def _handle_final(self, step: int, state: object, extra: object, val_loss: ValLoss) -> None:
        self._final_pending = False
        self._final_seen = True
        self._fire(self._final_callbacks, "final")
        try:
            self.emergency_save(step, state, extra, val_loss=val_loss)
        except StoreError as exc:
            # The agent falls back to the last periodic checkpoint (checkpoint_missed).
            self.last_error = exc
            logger.error("emergency save of step=%d failed: %s", step, exc)
        self._should_stop = True

    def emergency_save(
        self, step: int, state: object, extra: object = None, *, val_loss: ValLoss = None
    ) -> SaveResult:
        """Commit the live state now: the persist in flight is cancelled (it stops at its next
        chunk and removes its temporaries), nothing is compressed or read back; frozen tensors
        already in the store are not written again, the others are written while they are
        hashed (docs/decisions/005)."""
        started = time.monotonic()
        logger.info("emergency save started step=%d", step)
        self._cancel_persist = True
        self._stop_reserving.set()
        self._wait_idle()
        self._cancel_persist = False
        if self.uploader is not None:
            self.uploader.supersede()
        snapshot = self._capture(state, extra, copy=False)
        result = self._commit(
            _PersistJob(step, EMERGENCY, snapshot, self._evaluate(val_loss), self._parent),
            verify=False,
        )
        logger.info(
            "emergency save committed step=%d in %.3fs (%d bytes new)",
            step,
            time.monotonic() - started,
            result.bytes_new,
        )
        return result

    def save(
        self,
        step: int,
        state: object,
        extra: object = None,
        *,
        kind: str = PERIODIC,
        val_loss: ValLoss = None,
    ) -> SaveResult:
        """Save synchronously now (after any persist in flight) and return the commit; with two
        tiers it goes straight to the region's store (the upload in flight is stopped)."""
        self._wait_idle()
        if self.uploader is not None:
            self.uploader.supersede()
        snapshot = self._capture(state, extra, copy=False)
        return self._commit(
            _PersistJob(step, kind, snapshot, self._evaluate(val_loss), self._parent),
            verify=self.verify,
        )

    def save_final(
        self, step: int, state: object, extra: object = None, *, val_loss: ValLoss = None
    ) -> SaveResult:
        """The checkpoint of the finished run (kind `final`), synchronous."""
        return self.save(step, state, extra, kind=FINAL, val_loss=val_loss)

    def _capture(self, state: object, extra: object, *, copy: bool) -> Snapshot:
        """The state to save now, with the user's extra and the RNG states (see
        `Snapshot.capture`); a copy goes into the buffers kept between saves."""
        return Snapshot.capture(
            state,
            self._extra(extra),
            copy=copy,
            buffers=self._buffers if copy else None,
            frozen=self._frozen,
            pack_limit=self._pack_limit,
        )

    def _extra(self, extra: object) -> dict[str, Any]:
        return {"user": extra, "rng": capture_rng_states()}

    @staticmethod
    def _evaluate(val_loss: ValLoss) -> float | None:
        value = val_loss() if callable(val_loss) else val_loss
        return None if value is None else float(value)

    def _start_save(
        self, step: int, kind: str, state: object, extra: object, val_loss: ValLoss
    ) -> None:
        reference = self._evaluate(val_loss)
        self._last_saved_step = step
        self._last_save_time = time.monotonic()
        if not self.async_save:
            snapshot = self._capture(state, extra, copy=False)
            try:
                job = _PersistJob(step, kind, snapshot, reference, self._parent)
                self._commit(job, self._persist_verify, store=self._persist_store)
            except StoreError as exc:
                self.last_error = exc
                logger.error("save of step=%d failed: %s", step, exc)
            return
        snapshot = self._capture(state, extra, copy=True)
        job = _PersistJob(step, kind, snapshot, reference, self._parent)
        with self._idle:
            self._job = job
            self._ensure_worker()
            self._idle.notify_all()
        logger.info("persist started step=%d", step)

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="baton-persist", daemon=True)
            self._worker.start()

    def _work(self) -> None:
        lower_thread_priority()
        while True:
            with self._idle:
                while self._job is None and not self._closed:
                    self._idle.wait()
                if self._job is None:
                    return
                job = self._job
            try:
                with self._persist_store.background():
                    self._commit(
                        job,
                        verify=self._persist_verify,
                        cancellable=True,
                        store=self._persist_store,
                    )
            except SaveCancelled:
                logger.info("persist of step=%d cancelled by the final notice", job.step)
            except StoreError as exc:
                self.last_error = exc
                logger.error("persist of step=%d failed: %s", job.step, exc)
            except Exception as exc:  # keep the worker alive; the training loop must go on
                self.last_error = exc
                logger.exception("persist of step=%d crashed", job.step)
            finally:
                with self._idle:
                    self._job = None
                    self._idle.notify_all()

    def _wait_idle(self) -> None:
        """Back-pressure: wait until no persist is in flight."""
        started = time.monotonic()
        with self._idle:
            while self._job is not None:
                # Short waits so signal handlers keep running promptly on the main thread.
                self._idle.wait(0.05)
        waited = time.monotonic() - started
        if waited > 0.01:
            logger.debug("waited %.3fs for the previous persist", waited)

    def _commit(
        self,
        job: _PersistJob,
        verify: bool,
        cancellable: bool = False,
        *,
        store: Store | None = None,
    ) -> SaveResult:
        """Commit a snapshot to `store` (default: the region's) and report it; a commit to the
        local tier is reported by the uploader once it is in the region's store."""
        store = store or self.store
        uploader = self.uploader if store is self.local_store else None
        # Every write to the local tier holds the uploader's lock, so the tier's retention
        # never sweeps chunks a commit is about to name.
        lock: contextlib.AbstractContextManager[Any] = (
            uploader.lock if uploader is not None else contextlib.nullcontext()
        )
        with lock:
            result = store.commit(
                self.job,
                job.step,
                job.snapshot,
                kind=job.kind,
                rank=self.rank,
                world_size=self.world_size,
                parent=job.parent,
                validation_reference=job.validation_reference,
                verify=verify,
                cancel=(lambda: self._cancel_persist) if cancellable else None,
            )
            if uploader is not None:
                uploader.submit(result)
        for source in job.snapshot.tensors:
            if source.frozen is not None:
                self._frozen.remember(source.frozen, result.manifest.tensors[source.name]["chunks"])
        self.last_committed = result
        self._parent = result.ref
        if not self._reserved_after_save and job.kind != EMERGENCY:
            self._reserved_after_save = True
            # The tensors already frozen in the store are not counted: the next save skips them.
            self._start_reserving(
                sum(source.nbytes for source in job.snapshot.tensors if source.frozen is None)
            )
        logger.info(
            "committed %s step=%d kind=%s bytes_new=%d bytes_total=%d%s",
            result.ref.key,
            job.step,
            job.kind,
            result.bytes_new,
            result.bytes_total,
            " in the local tier" if uploader is not None else "",
        )
        if uploader is None:
            self.reporter.post("checkpoint", checkpoint_event(result.manifest))
        return result

    def _reserve_for_first_save(self, state: object) -> None:
        """At a job's first step, before it has saved: room for all of the state, so that a
        first save, and an emergency save before it (a job interrupted early on a new
        instance), write over blocks the store already holds (decision 055, twenty-sixth pass).
        Once, and not after a save: that save's own reservation follows it."""
        self._reserved_at_first_step = True
        if self.last_committed is not None:
            return
        try:
            nbytes = state_nbytes(state)
        except StoreError:  # the save will say what cannot be checkpointed
            return
        self._start_reserving(nbytes)

    def _start_reserving(self, nbytes: int) -> None:
        """Prepare room in the store for `nbytes` of a later save, in the background at low
        priority: files its chunks can be written over (`Store.reserve`), so that a save with
        nothing recycled yet, an emergency save in particular, does not allocate new blocks
        inside the notice's window. After the first save gc recycles the chunks of collected
        checkpoints instead. A reservation runs after the one before it; an emergency save and
        `close()` stop them between files."""
        previous = self._reserver

        def run() -> None:
            if previous is not None:
                previous.join()
            lower_thread_priority()
            try:
                reserved = self.store.reserve(nbytes, stop=self._stop_reserving.is_set)
            except Exception:  # the room is an optimisation; training goes on without it
                logger.exception("could not reserve room in %s", self.store.url)
                return
            if reserved:
                logger.info("reserved %d bytes in %s for the next save", reserved, self.store.url)

        self._reserver = threading.Thread(target=run, name="baton-reserve", daemon=True)
        self._reserver.start()

    def wait(self) -> None:
        """Wait for the persist in flight, if any (with two tiers: the local write;
        `uploader.drain()` waits for the upload), and for the room being reserved."""
        self._wait_idle()
        if self._reserver is not None:
            self._reserver.join()

    # ---- reports ----------------------------------------------------------------------------

    def _report_progress(self, step: int, val_loss: float | None = None) -> None:
        now = time.monotonic()
        if now - self._last_progress < _PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        self.report_progress(step, val_loss)

    def report_progress(self, step: int, val_loss: float | None = None) -> None:
        """Tell the agent how far training got (rate-limited automatically in maybe_save)."""
        body: dict[str, Any] = {"step": step}
        if val_loss is not None:
            body["val_loss"] = float(val_loss)
        self.reporter.post("progress", body, droppable=True)

    def report_result(self, step: int, val_loss: float, weights_sha256: str) -> None:
        """Tell the agent the final result of the run."""
        self.reporter.post(
            "result", {"step": step, "val_loss": float(val_loss), "weights_sha256": weights_sha256}
        )

    # ---- shutdown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Finish the persist in flight and the upload of the last local commit, flush
        reports, restore signal handlers."""
        if self._closed:
            return
        self._wait_idle()
        self._stop_reserving.set()
        if self._reserver is not None:
            self._reserver.join()
        with self._idle:
            self._closed = True
            self._idle.notify_all()
        if self.uploader is not None:
            self.uploader.drain()
            self.uploader.close()
        self.reporter.close()
        for signum, handler in self._previous_handlers.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(signum, handler)
        self._previous_handlers.clear()
        if self._owns_store:
            self.store.close()
            if self.local_store is not None:
                self.local_store.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Directory mode: put the checkpoint to resume from in place, then sync the folder to the store.

Before the workload starts, the checkpoint named by BATON_RESUME (or the job's latest) is
materialised into BATON_CHECKPOINT_DIR. While it runs, a background thread looks at the folder
a few times a second and, when something changed and at least `interval` seconds passed since
the last sync, saves it as a `periodic` checkpoint: incrementally, because the store only
writes chunks it does not have and does not even read files whose size and mtime are
unchanged. After the workload exits, one last sync records the folder as `emergency` (it was
preempted) or `final` (it finished).

A half-written file is never synced (decision 060): a file a process of the workload holds
open for writing keeps the version the previous sync recorded; so does, after the workload
died (a signal or a non-zero status), every file that changed since the sync last saw it with
no writer. A file that keeps changing while it is read keeps its previous version too.

A directory-mode workload does not tell the agent which step its files hold. The step recorded
for a sync is read from `BATON_AGENT_STEP_FILE` (a JSON file in the folder with `step` or
`global_step`, or a bare number) when configured; else it is the step the output showed when
the newest synced file was last modified (its mtime against the times steps were read, see
`step_at`), which for a script that saves between steps is the step its files hold. It never
goes below the previous sync's step (see `_next_step`), so the store's "latest" is always the
newest sync.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from migration.agent import writers
from migration.agent.config import ConfigError
from migration.checkpoint import ManifestRef, StoreConfigError, StoreError, open_store
from migration.checkpoint.directory import RESTORE_TMP, NothingSettled, save_directory

if TYPE_CHECKING:
    from migration.agent.config import AgentConfig
    from migration.checkpoint import SaveResult, Store

logger = logging.getLogger(__name__)

Snapshot = dict[str, tuple[int, int]]
SCAN_EVERY = 0.25
# A file's mtime comes from the kernel's coarse clock (a tick behind, up to 4 ms) and a line is
# read a moment after it was printed: a step read this soon after a file's mtime still counts
# as shown before the write.
MTIME_SLACK_NS = 10_000_000
STEP_HISTORY = 100_000


class RestoreError(RuntimeError):
    """The checkpoint to resume from could not be put in place."""


def snapshot(folder: Path) -> Snapshot:
    """Size and mtime of every file (and every folder, as (-1, 0)) under `folder`."""
    found: Snapshot = {}
    for root, dirs, files in os.walk(folder):
        rel_root = os.path.relpath(root, folder)
        dirs[:] = [d for d in dirs if not d.startswith(RESTORE_TMP)]
        for name in dirs:
            found[os.path.normpath(os.path.join(rel_root, name))] = (-1, 0)
        for name in files:
            if name.startswith(RESTORE_TMP):
                continue
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue  # replaced between the listing and the stat: seen on the next scan
            found[os.path.normpath(os.path.join(rel_root, name))] = (st.st_size, st.st_mtime_ns)
    return found


def _recorded(before: Snapshot, files: dict[str, dict[str, Any]]) -> Snapshot:
    """What a sync recorded, as a snapshot: a file that kept its previous version (it was not
    settled) shows that version's size and mtime, so the next look sees it still to be synced."""
    recorded: Snapshot = {}
    for rel, entry in files.items():
        if entry.get("type") == "file":
            recorded[rel] = (int(entry["size"]), int(entry["mtime_ns"]))
        elif rel in before:
            recorded[rel] = before[rel]
    return recorded


def read_step_file(path: Path) -> int | None:
    """The step in a step file (JSON object with `step`/`global_step`, or a number)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(value, dict):
        value = value.get("step", value.get("global_step"))
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return None


class DirectorySync:
    """Restores and syncs one rank's checkpoint folder."""

    def __init__(
        self,
        store: Store,
        job: str,
        folder: Path,
        emit: Callable[..., None],
        step_hint: Callable[[], int | None],
        rank: int = 0,
        world_size: int = 1,
        interval: float = 5.0,
        step_file: str = "",
    ) -> None:
        self.store = store
        self.job = job
        self.folder = folder
        self.emit = emit
        self.step_hint = step_hint
        self.rank = rank
        self.world_size = world_size
        self.interval = interval
        self.step_file = step_file
        self.syncs = 0
        self.last_ref: ManifestRef | None = None
        self.session: int | None = None
        self._processes: writers.Session | None = None
        self._synced: Snapshot | None = None
        self._synced_at = 0.0
        self._lock = threading.Lock()
        # The last state of each file seen with no writer (under _watch_lock), and the steps
        # the output showed with the time each was read.
        self._watch_lock = threading.Lock()
        self._quiet: Snapshot = {}
        self._seen: Snapshot = {}
        self._left_writing: set[str] = set()
        self._steps: deque[tuple[int, int]] = deque(maxlen=STEP_HISTORY)
        self._base_step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        emit: Callable[..., None],
        step_hint: Callable[[], int | None],
    ) -> DirectorySync:
        """The sync of the agent's configured folder and store; RestoreError if unusable."""
        try:
            store = open_store(config.store_url, endpoint=config.s3_endpoint or None)
        except StoreConfigError as exc:
            raise ConfigError("BATON_STORE_URL", str(exc)) from exc
        except StoreError as exc:
            raise RestoreError(f"cannot open the store: {exc}") from exc
        return cls(
            store,
            config.job_id,
            config.checkpoint_dir,
            emit,
            step_hint,
            rank=config.rank,
            world_size=config.world_size,
            interval=config.sync_interval,
            step_file=config.step_file,
        )

    # -- restore -----------------------------------------------------------------------------

    def _resume_ref(self, resume: str) -> ManifestRef | None:
        if resume:
            return ManifestRef.parse(resume).for_rank(self.rank)
        complete = self.store.latest_complete(self.job, self.world_size)
        if complete is not None:
            return complete.for_rank(self.rank)
        latest = self.store.latest(self.job, self.rank)
        if latest is not None and self.world_size > 1:
            logger.warning("no step saved by every rank; rank %d resumes from its own", self.rank)
        return latest

    def restore(self, resume: str = "") -> dict[str, object] | None:
        """Put the checkpoint to resume from into the folder; the `restore` event's fields.

        None when there is nothing to resume from (a first start).
        """
        try:
            ref = self._resume_ref(resume)
            if ref is None:
                logger.info("no checkpoint of job %s in the store; starting fresh", self.job)
                self._synced = snapshot(self.folder)
                self._start_watch(None)
                return None
            started = time.monotonic()
            stats = self.store.restore_directory(ref, self.folder, clean=True)
            manifest = self.store.load_manifest(ref)
        except (StoreError, OSError) as exc:
            raise RestoreError(
                f"cannot restore {resume or 'the latest checkpoint'}: {exc}"
            ) from exc
        self.last_ref = ref
        self._synced = snapshot(self.folder)
        self._start_watch(ref.step)
        logger.info(
            "restored %s (step %d, %s) into %s: %d files, %d bytes written",
            ref.key,
            ref.step,
            ref.kind,
            self.folder,
            stats.files_written,
            stats.bytes_written,
        )
        return {
            "manifest": ref.key,
            "step": ref.step,
            "kind": ref.kind,
            "val_loss": None,
            "reference": manifest.validation_reference,
            "files_written": stats.files_written,
            "files_unchanged": stats.files_unchanged,
            "bytes_written": stats.bytes_written,
            "seconds": round(time.monotonic() - started, 3),
            "source": "directory",
        }

    # -- watching the workload's writes -------------------------------------------------------

    def _start_watch(self, step: int | None) -> None:
        assert self._synced is not None
        with self._watch_lock:
            self._quiet = {rel: st for rel, st in self._synced.items() if st[0] >= 0}
            self._seen = dict(self._quiet)
            self._base_step = step or 0

    def note_step(self, step: int) -> None:
        """The workload's output showed `step` (now)."""
        with self._watch_lock:
            if not self._steps or self._steps[-1][1] != step:
                self._steps.append((time.time_ns(), step))

    def step_at(self, mtime_ns: int) -> int:
        """The step the output showed when a file was last modified at `mtime_ns` (the
        restored step before the first step was read)."""
        with self._watch_lock:
            if not self._steps:
                # No step read from the output (yet): the agent's own idea of the step.
                hint = self.step_hint()
                return self._base_step if hint is None else hint
            for seen_ns, seen in reversed(self._steps):
                if seen_ns <= mtime_ns + MTIME_SLACK_NS:
                    return seen
            return self._base_step

    def watch(self, session: int) -> None:
        """From now on, files the processes of `session` hold open for writing are busy."""
        self.session = session
        self._processes = writers.Session(session)

    def writing(self) -> set[str]:
        """Files of the folder the workload holds open for writing, looked up now (a cached
        answer could miss a write that began since, and let a half-written file through)."""
        processes = self._processes
        if self.session is None or processes is None:
            return set()
        return writers.files_being_written(processes, self.folder)

    def observe(self) -> None:
        """One look at the folder: remember each file's state once it is settled, i.e. the
        same as at the previous look, with no process of the workload writing it (checked
        before and after the look, so a write that opens and closes the file in between is
        not taken for a settled state)."""
        files = {rel: st for rel, st in snapshot(self.folder).items() if st[0] >= 0}
        with self._watch_lock:
            moved = any(self._quiet.get(rel) != st for rel, st in files.items())
        busy: set[str] = set()
        if moved:
            busy = self.writing()
            files = {rel: st for rel, st in snapshot(self.folder).items() if st[0] >= 0}
            busy |= self.writing()
        with self._watch_lock:
            for rel, st in files.items():
                if rel not in busy and self._seen.get(rel) == st:
                    self._quiet[rel] = st
            self._seen = files

    def _busy(self, rel: str) -> bool:
        """While the workload runs: may `rel` be in the middle of a write? Yes when a process
        of the workload has it open for writing, when its state is not yet settled (a file
        just truncated by `open(..., "wb")` can show no open descriptor for a moment), and,
        once the leader has died, for every file (the last sync decides what to trust)."""
        session = self.session
        if session is None:
            return False
        if not writers.alive(session) or rel in self.writing():
            return True
        try:
            st = os.lstat(self.folder / rel)
        except FileNotFoundError:
            return True
        with self._watch_lock:
            settled = self._quiet.get(rel)
        return settled != (st.st_size, st.st_mtime_ns)

    def leader_exited(self) -> None:
        """The workload's leader has exited; what its other processes are writing now will be
        cut off by the kill of its group, so those files keep their previous version."""
        self._left_writing = set(self.writing())

    def untrusted(self) -> set[str]:
        """Files that changed since they were last seen with no writer: after the workload
        died, what they hold may be half-written."""
        with self._watch_lock:
            quiet = dict(self._quiet)
        current = snapshot(self.folder)
        return {rel for rel, st in current.items() if st[0] >= 0 and quiet.get(rel) != st}

    # -- sync --------------------------------------------------------------------------------

    def _hinted_step(self, files: dict[str, dict[str, Any]]) -> int | None:
        """The step the recorded `files` hold: the step file's, else the step shown when the
        newest of them was written."""
        if self.step_file:
            step = read_step_file(self.folder / self.step_file)
            if step is not None:
                return step
        newest = max(
            (int(e["mtime_ns"]) for e in files.values() if e.get("type") == "file"), default=None
        )
        return None if newest is None else self.step_at(newest)

    def _next_step(self, kind: str, files: dict[str, dict[str, Any]]) -> int:
        """The step to record for `files`: the hint, never below the previous sync's step.

        At the previous step, a sync of the same kind replaces that manifest (the newer files
        win); one whose kind sorts before the previous kind (periodic after an emergency
        checkpoint) goes one step higher, so the store's `latest` is always the newest sync.
        """
        step = self._hinted_step(files) or 0
        previous = self.last_ref
        if previous is None or step > previous.step:
            return step
        candidate = ManifestRef(self.job, previous.step, kind, self.rank)
        return previous.step + 1 if candidate.sort_key < previous.sort_key else previous.step

    def sync(
        self, kind: str = "periodic", force: bool = False, hold: set[str] | None = None
    ) -> SaveResult | None:
        """Save the folder if it changed since the last sync (or `force`); None if skipped.

        Files the workload is writing, and those in `hold`, keep their previous version.
        """
        hold = hold or set()
        with self._lock:
            self.observe()
            before = snapshot(self.folder)
            changed = before != self._synced
            if not any(size >= 0 for size, _ in before.values()):
                return None  # no file yet: nothing a restore could use
            if not changed and not force:
                return None
            try:
                result = save_directory(
                    self.store,
                    self.job,
                    self.folder,
                    # The label is chosen from the files the save actually records (a file
                    # that kept its previous version must not lend the label its new mtime).
                    lambda files: self._next_step(kind, files),
                    kind,
                    rank=self.rank,
                    world_size=self.world_size,
                    parent=self.last_ref,
                    validation_reference=None,
                    meta={"source": "agent-directory-sync"},
                    cancel=None,
                    busy=self._busy,
                    hold=hold,
                    allow_empty=False,
                )
            except NothingSettled as exc:
                logger.info("%s", exc)
                return None
            except (StoreError, OSError) as exc:
                logger.warning("checkpoint sync of %s failed (retried later): %s", self.folder, exc)
                return None
            self.last_ref = result.ref
            self._synced = _recorded(before, result.manifest.files or {})
            self._synced_at = time.monotonic()
            self.syncs += 1
        logger.info(
            "synced %s as %s (%d of %d bytes new, %.2f s)",
            self.folder,
            result.key,
            result.bytes_new,
            result.bytes_total,
            result.seconds,
        )
        self.emit(
            "checkpoint",
            manifest=result.key,
            step=result.ref.step,
            kind=kind,
            bytes_new=result.bytes_new,
            bytes_total=result.bytes_total,
            validation_reference=None,
            rank=self.rank,
            world_size=self.world_size,
            seconds=round(result.seconds, 3),
            source="directory",
        )
        return result

    def start(self) -> None:
        """Sync in the background from now on."""
        self._synced_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SCAN_EVERY):
            try:
                if time.monotonic() - self._synced_at < self.interval:
                    self.observe()
                    continue
                self.sync("periodic")
            except Exception:
                # The next scan tries again; a sync thread that died would silently stop
                # protecting the job's progress.
                logger.exception("checkpoint sync failed")

    def stop(self, final_kind: str = "emergency", died: bool = False) -> SaveResult | None:
        """Stop the background sync and sync once more as `final_kind`.

        `died`: the workload ended by a signal or a non-zero status, so files that changed
        since they were last seen with no writer may be half-written; they keep their
        previous version.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.session = None
        try:
            hold = (self.untrusted() if died else set()) | self._left_writing
            if hold:
                logger.info(
                    "the workload died while these files changed; their previous versions are "
                    "kept: %s",
                    ", ".join(sorted(hold)),
                )
            # An unchanged folder already synced in this run is relabelled, so the portal sees
            # the emergency or final checkpoint it waits for; a periodic one is not repeated.
            force = final_kind != "periodic" and self.last_ref is not None
            return self.sync(final_kind, force=force, hold=hold)
        finally:
            self.store.close()

"""The agent's main loop: start everything, supervise the workload, act on notices, report.

Threads: the interruption listener (and its watchdog), the event and log senders, the local
endpoint, the output reader and, in directory mode, the checkpoint sync. Every decision that
touches the workload (signals, the kill, the exit) is taken here, in the main thread, so the
order of what happens to the workload is simple to follow: notices arrive on a queue and are
handled one at a time between checks of the workload's state.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import TYPE_CHECKING

from migration.agent import selfcheck
from migration.agent.config import AgentConfig, ConfigError, workload_environment
from migration.agent.listener import FAILED, Listener
from migration.agent.local_api import LocalEndpoint
from migration.agent.logs import LogForwarder, OutputSink
from migration.agent.metadata import MetadataClient, Notice
from migration.agent.outbox import EventOutbox
from migration.agent.portal import PortalClient
from migration.agent.workload import Workload, WorkloadStartError
from migration.checkpoint.tiers import upload_after_exit

if TYPE_CHECKING:
    from migration.agent.dirsync import DirectorySync

logger = logging.getLogger(__name__)

# Exit statuses of the agent (documented in docs/instance-side.md).
EXIT_FINISHED = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_RESTORE_FAILED = 3
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later", which is what a preempted job needs
EXIT_CODES = {"finished": EXIT_FINISHED, "failed": EXIT_FAILED, "preempted": EXIT_PREEMPTED}

FINAL_LINE = re.compile(
    r"^final step=(?P<step>\d+) val_loss=(?P<val_loss>\S+) weights_sha256=(?P<sha>[0-9a-f]{64})\s*$"
)
TICK = 0.1
# However late a final notice is read, the workload gets at least this long for its
# emergency checkpoint before the kill: a late kill costs less than a certain lost checkpoint.
MIN_STOP_WINDOW = 1.0
PROGRESS_EVERY = 1.0
RESERVED_FIELDS = frozenset({"seq", "type", "at", "event_type"})


@dataclass
class Outcome:
    """How the workload ended: `reason` is finished, preempted or failed."""

    reason: str
    returncode: int | None = None
    signal: str | None = None
    killed: bool = False
    error: str = ""
    exit_code: int | None = None

    def __post_init__(self) -> None:
        if self.exit_code is None:
            self.exit_code = EXIT_CODES[self.reason]


class Agent:
    """One agent run: everything between reading the configuration and the exit status."""

    def __init__(self, config: AgentConfig, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.environ = dict(os.environ if environ is None else environ)
        config.agent_dir.mkdir(parents=True, exist_ok=True)
        config.log_dir.mkdir(parents=True, exist_ok=True)
        config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        portal = (
            PortalClient(config.portal_url, config.agent_token, timeout=config.portal_timeout)
            if config.portal_url
            else None
        )
        self.outbox = EventOutbox(
            config.agent_dir / "outbox.json", portal, max_events=config.event_buffer
        )
        self.logs = LogForwarder(
            portal,
            config.rank,
            max_lines=config.log_buffer,
            batch_lines=config.log_batch,
            flush_interval=config.log_flush_interval,
            max_line_chars=config.max_line_chars,
        )
        self.sink = OutputSink(
            config.log_dir / f"rank-{config.rank}.log",
            self.logs,
            echo=sys.stdout if config.echo_output else None,
        )
        self.metadata = MetadataClient(config.metadata_url)
        self.listener = Listener(
            self._poll_notices,
            config.poll_interval,
            self._listener_failed,
            max_restarts=config.listener_max_restarts,
            restart_window=config.listener_restart_window,
        )
        self.endpoint = LocalEndpoint(self._report, self._notice_state)
        self.notices: queue.Queue[Notice] = queue.Queue()
        self.workload: Workload | None = None
        self.sync: DirectorySync | None = None
        self.step: int | None = None
        self.advance: Notice | None = None
        self.final: Notice | None = None
        self._seen_advance: set[str] = set()
        self._seen_final = False
        self._kill_at: float | None = None
        self._killed = False
        self._sdk_result = False
        self._line_result: dict[str, object] | None = None
        self._progress: dict[str, object] | None = None
        self._progress_sent_at = 0.0
        self._progress_lock = threading.Lock()
        # Set from signal handlers, read by the main loop: plain attributes, because a handler
        # that takes a lock the interrupted main thread holds would deadlock the agent.
        self._stop_signals = 0
        self._stop_signal_name = ""
        self._stop_signals_seen = 0
        self.restore_error = ""
        self.resumed = False
        self._final_signal_sent = False

    # -- reports from threads ----------------------------------------------------------------

    def _poll_notices(self) -> None:
        """One poll of both notice levels (runs in the listener thread)."""
        advance = self.metadata.advance_notice()
        if advance is not None and advance.notice_time not in self._seen_advance:
            self._seen_advance.add(advance.notice_time)
            self.notices.put(advance)
        if not self._seen_final:
            final = self.metadata.final_notice(self.config.default_window)
            if final is not None:
                self._seen_final = True
                self.notices.put(final)

    def _listener_failed(self, error: str, restarts: int, recovered: bool) -> None:
        self.outbox.emit("listener_failed", error=error, restarts=restarts, recovered=recovered)

    def _report(self, kind: str, body: dict[str, object]) -> None:
        """A report from the SDK on the local endpoint (runs in a server thread)."""
        # The envelope (numbering, type, time) is the agent's; a report cannot forge it.
        body = {k: v for k, v in body.items() if k not in RESERVED_FIELDS}
        step = body.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.step = step
        if kind == "progress":
            self._record_progress(body)
            return
        # A held-back progress report goes first, so the portal sees events in the order
        # the workload made them.
        self._flush_progress()
        if kind == "checkpoint":
            body = {"rank": self.config.rank, "world_size": self.config.world_size, **body}
        if kind == "result":
            self._sdk_result = True
            body = {"source": "sdk", **body}
        self.outbox.emit(kind, **body)

    def _record_progress(self, fields: dict[str, object]) -> None:
        # At most one progress event a second: a fast loop may report every step, and the
        # portal only needs to know where the job is.
        with self._progress_lock:
            self._progress = fields
            due = time.monotonic() - self._progress_sent_at >= PROGRESS_EVERY
        if due:
            self._flush_progress()

    def _flush_progress(self) -> None:
        # Under the lock, so two threads flushing at once neither lose nor repeat a report.
        with self._progress_lock:
            fields, self._progress = self._progress, None
            if fields is not None:
                self._progress_sent_at = time.monotonic()
                self.outbox.emit("progress", **fields)

    def _notice_state(self) -> dict[str, object]:
        advance, final = self.advance, self.final
        return {
            "advance": advance.event() if advance else None,
            "final": final.event() if final else None,
        }

    def _on_line(self, line: str) -> None:
        """One line of workload output (runs in the output reader thread)."""
        self.sink.write(line)
        match = FINAL_LINE.match(line)
        if match:
            loss = float(match["val_loss"]) if _is_number(match["val_loss"]) else None
            self._line_result = {
                "step": int(match["step"]),
                "val_loss": loss,
                "weights_sha256": match["sha"],
                "source": "output",
            }
        if self.config.mode == "directory":
            found = self.config.progress_pattern.search(line)
            if found:
                try:
                    self.step = int(found.group(1))
                except (ValueError, IndexError):
                    return
                if self.sync is not None:
                    self.sync.note_step(self.step)
                self._record_progress({"step": self.step, "source": "output"})

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_signals += 1
        self._stop_signal_name = signal.Signals(signum).name

    # -- notices -----------------------------------------------------------------------------

    def _handle_notice(self, notice: Notice) -> None:
        if notice.level == "advance":
            self.advance = notice
            logger.info("advance notice (%s): the instance may be reclaimed soon", notice.source)
            self.outbox.emit("notice", **notice.event())
            if self.config.mode == "sdk" and self._running():
                assert self.workload is not None
                self.workload.send(signal.SIGUSR1, group=self.config.signal_group)
            return
        assert notice.deadline is not None
        window = (notice.deadline - datetime.now(UTC)).total_seconds()
        stop_in = max(window - self.config.safety_margin, MIN_STOP_WINDOW)
        kill_at = time.monotonic() + stop_in
        if self.final is not None:
            if self._kill_at is not None and kill_at >= self._kill_at:
                logger.info("another final notice (%s), no earlier than the first", notice.source)
                return
            logger.info("final notice (%s) moves the deadline earlier", notice.source)
        else:
            logger.warning(
                "final notice (%s): the instance goes at %s; stopping the workload within %.1f s",
                notice.source,
                notice.deadline.isoformat(),
                stop_in,
            )
        first = self.final is None
        self.final = notice
        self._kill_at = kill_at
        self.outbox.emit("notice", **notice.event())
        if first and self._running():
            assert self.workload is not None
            self._final_signal_sent = self.workload.send(
                self.config.final_signal, group=self.config.signal_group
            )

    def _drain_notices(self) -> None:
        signals = self._stop_signals
        if signals > self._stop_signals_seen:
            first = self._stop_signals_seen == 0
            self._stop_signals_seen = signals
            if first:
                logger.warning("%s received: treated as a final notice", self._stop_signal_name)
                self._handle_notice(
                    Notice(
                        level="final",
                        source="sigterm",
                        received_at=datetime.now(UTC),
                        deadline=datetime.now(UTC) + timedelta(seconds=self.config.grace_period),
                        document={"signal": self._stop_signal_name},
                    )
                )
            elif self._kill_at is not None:
                # A second stop request means "now": there is no window left to wait for.
                logger.warning("%s again: stopping the workload now", self._stop_signal_name)
                self._kill_at = min(self._kill_at, time.monotonic())
        while True:
            try:
                notice = self.notices.get_nowait()
            except queue.Empty:
                return
            self._handle_notice(notice)

    # -- the run -----------------------------------------------------------------------------

    def _running(self) -> bool:
        workload = self.workload
        return workload is not None and workload.process is not None and not workload.exited()

    def _heartbeat(self) -> None:
        self.outbox.emit(
            "heartbeat",
            step=self.step,
            # "ok" or "failed" (given up); a restart in progress was reported on its own as
            # `listener_failed` with `recovered: true` and is not an abnormal state.
            listener="failed" if self.listener.state == FAILED else "ok",
            pid=self.workload.pid if self.workload and self.workload.process else None,
            dropped_events=self.outbox.dropped,
            dropped_log_lines=self.logs.total_dropped,
        )

    def _self_check(self) -> None:
        signals = [self.config.final_signal]
        if self.config.mode == "sdk":
            signals.insert(0, signal.SIGUSR1)
        checks: dict[str, dict[str, object]] = {
            "metadata": selfcheck.check_metadata(self.metadata),
            "signals": selfcheck.check_signals(signals),
            "local_endpoint": selfcheck.check_local_endpoint(self.endpoint.url),
        }
        ok = all(bool(check.get("ok")) for check in checks.values())
        level = logging.INFO if ok else logging.ERROR
        logger.log(level, "self-check %s: %s", "passed" if ok else "FAILED", checks)
        self.outbox.emit("self_check", ok=ok, checks=checks)

    def _restore(self) -> bool:
        """Directory mode: materialise the checkpoint to resume from. False when it failed."""
        from migration.agent.dirsync import RestoreError

        try:
            assert self.sync is not None
            restored = self.sync.restore(self.config.resume)
        except RestoreError as exc:
            logger.error("restore failed: %s", exc)
            self.restore_error = str(exc)
            # `restore` means "a checkpoint is in place"; a failure has an event of its own.
            self.outbox.emit("restore_failed", manifest=self.config.resume or None, error=str(exc))
            # Nothing of a failed restore may be synced back as if it were the job's state.
            self.sync = None
            return False
        if restored is not None:
            self.resumed = True
            self.step = restored.get("step")  # type: ignore[assignment]
            self.outbox.emit("restore", ok=True, **restored)
        return True

    def _open_sync(self) -> None:
        """Directory mode: open the store; ConfigError when its URL cannot work."""
        from migration.agent.dirsync import DirectorySync, RestoreError

        try:
            self.sync = DirectorySync.from_config(
                self.config, emit=self.outbox.emit, step_hint=lambda: self.step
            )
        except RestoreError as exc:
            # Not a configuration mistake (the store is unreachable): a failed restore.
            logger.error("restore failed: %s", exc)
            self.restore_error = str(exc)
            self.outbox.emit("restore_failed", manifest=self.config.resume or None, error=str(exc))

    def run(self) -> int:
        """Run until the workload has ended and been reported; return the exit status."""
        config = self.config
        previous = {
            sig: signal.signal(sig, self._on_stop_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        self.outbox.start()
        self.logs.start()
        self.endpoint.start()
        outcome: Outcome | None = None
        try:
            if config.mode == "directory":
                try:
                    self._open_sync()
                except ConfigError as exc:
                    logger.error("configuration error: %s", exc)
                    outcome = Outcome("failed", error=str(exc), exit_code=EXIT_CONFIG)
            if outcome is None:
                outcome = self._start_and_supervise()
        except Exception as exc:
            logger.exception("the agent failed")
            outcome = Outcome("failed", error=f"agent error: {type(exc).__name__}: {exc}")
        finally:
            workload = self.workload
            # Only reached with an unreaped leader when the agent itself failed mid-run.
            if workload is not None and workload.process and workload.process.returncode is None:
                workload.kill_group()
                workload.wait(10)
            outcome = outcome or Outcome("failed", error="the agent stopped unexpectedly")
            self._finish(outcome)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        assert outcome.exit_code is not None
        return outcome.exit_code

    def _start_and_supervise(self) -> Outcome:
        self._self_check()
        self.listener.start()
        self._heartbeat()
        if self.config.mode == "directory" and (self.restore_error or not self._restore()):
            return Outcome(
                "failed",
                error=f"restore failed: {self.restore_error}",
                exit_code=EXIT_RESTORE_FAILED,
            )
        return self._supervise()

    def _supervise(self) -> Outcome:
        config = self.config
        self._drain_notices()
        if self.final is not None:
            logger.warning("final notice before the workload started; not starting it")
            return Outcome("preempted")
        resumed = self.resumed if config.mode == "directory" else bool(config.resume)
        self.workload = Workload(
            config.workload_command(resumed),
            workload_environment(config, self.endpoint.url, self.environ, resumed=resumed),
            self._on_line,
            cwd=None,
        )
        try:
            self.workload.start()
        except WorkloadStartError as exc:
            logger.error("%s", exc)
            return Outcome("failed", error=str(exc))
        if self.sync is not None:
            self.sync.watch(self.workload.pid)
            self.sync.start()
        next_heartbeat = time.monotonic() + config.heartbeat_interval
        while not self.workload.exited():
            self._drain_notices()
            now = time.monotonic()
            if self._kill_at is not None and now >= self._kill_at and not self._killed:
                logger.warning("the workload did not stop within its window; killing its group")
                self.workload.kill_group()
                self._killed = True
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + config.heartbeat_interval
            if self._progress is not None and now - self._progress_sent_at >= PROGRESS_EVERY:
                self._flush_progress()
            time.sleep(TICK)
        # The leader has exited but is not reaped yet, so its process group id cannot have been
        # reused: anything it left behind is killed now, then the leader is reaped.
        if self.sync is not None:
            self.sync.leader_exited()
        self.workload.kill_group()
        returncode = self.workload.wait()
        self.workload.finish_output()
        self._drain_notices()
        assert returncode is not None
        return self._outcome(returncode)

    def _finished(self) -> bool:
        """After status 0: did the workload finish its work, or stop because it was asked to?

        Finished when it never got the final signal, reported a result (the SDK or a `final
        step=...` line), or reached BATON_AGENT_TOTAL_STEPS; a script that exits 0 on
        SIGTERM before the end stopped early and is resumed.
        """
        if not self._final_signal_sent or self._sdk_result or self._line_result is not None:
            return True
        total = self.config.total_steps
        return total is not None and self.step is not None and self.step >= total

    def _outcome(self, returncode: int) -> Outcome:
        sig = signal.Signals(-returncode).name if returncode < 0 else None
        code = returncode if returncode >= 0 else None
        if returncode == 0 and self._finished():
            reason = "finished"
        elif self.final is not None:
            reason = "preempted"
        else:
            reason = "failed"
        logger.info("workload ended (%s): %s", f"status {code}" if sig is None else sig, reason)
        return Outcome(reason, returncode=code, signal=sig, killed=self._killed)

    def _finish(self, outcome: Outcome) -> None:
        """Last sync, last events, flush; never raises."""
        config = self.config
        self.listener.stop()
        try:
            if self.sync is not None:
                kind = {"preempted": "emergency", "finished": "final"}.get(
                    outcome.reason, "periodic"
                )
                died = outcome.signal is not None or bool(outcome.returncode)
                self.sync.stop(final_kind=kind, died=died)
        except Exception:
            logger.exception("the last checkpoint sync failed")
        # What the workload committed on local disk and did not upload (killed first).
        upload_after_exit(self.environ, self.outbox.emit)
        self._flush_progress()
        if self._line_result is not None and not self._sdk_result:
            self.outbox.emit("result", **self._line_result)
        self.outbox.emit(
            "exit",
            returncode=outcome.returncode,
            signal=outcome.signal,
            reason=outcome.reason,
            exit_code=outcome.exit_code,
            killed=outcome.killed,
            step=self.step,
            error=outcome.error or None,
        )
        self.endpoint.stop()
        self.sink.close()
        deadline = time.monotonic() + config.flush_timeout
        self.logs.close(min(config.flush_timeout / 2, 5.0))
        self.outbox.close(max(deadline - time.monotonic(), 0.0))
        logger.info("agent exits with status %d (%s)", outcome.exit_code, outcome.reason)


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False

"""The workload's output: a local log file per rank and batched, bounded forwarding to the portal.

Forwarding must never slow the workload down or grow without limit while the portal is away:
lines wait in a bounded buffer; when it is full the oldest waiting lines are dropped and the
count is sent with the next batch (`dropped`), so the job page can say "n lines lost here".
The local file always has every line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO

from migration.agent.outbox import now_iso
from migration.agent.portal import (
    LOGS_PATH,
    BackgroundSender,
    Backoff,
    PortalClient,
    PortalError,
)

logger = logging.getLogger(__name__)


def clip(line: str, max_chars: int) -> str:
    """`line` cut to `max_chars`, saying how much was cut."""
    if len(line) <= max_chars:
        return line
    note = f"... [{len(line) - max_chars} characters cut]"
    return line[: max(max_chars - len(note), 0)] + note


class LogForwarder(BackgroundSender):
    """Sends lines to `POST /api/agent/logs/` in batches of at most `batch_lines`.

    At most `max_lines` lines wait in memory, plus the one batch being sent.
    """

    thread_name = "log-sender"

    def __init__(
        self,
        client: PortalClient | None,
        rank: int,
        max_lines: int = 10_000,
        batch_lines: int = 500,
        flush_interval: float = 1.0,
        max_line_chars: int = 4000,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(client, backoff)
        self.rank = rank
        self.max_lines = max_lines
        self.batch_lines = batch_lines
        self.flush_interval = flush_interval
        self.max_line_chars = max_line_chars
        self.dropped = 0  # lines lost and not yet reported to the portal
        self.total_dropped = 0
        self.sent = 0
        self._waiting: deque[dict[str, object]] = deque()
        self._count = 0

    def add(self, line: str) -> None:
        """Queue one line (without its newline) for the portal."""
        if self.client is None:
            return
        with self._cond:
            self._count += 1
            if len(self._waiting) >= self.max_lines:
                self._waiting.popleft()
                self.dropped += 1
                self.total_dropped += 1
            self._waiting.append(
                {
                    "rank": self.rank,
                    "at": now_iso(),
                    "line": clip(line, self.max_line_chars),
                    "n": self._count,
                }
            )
            if len(self._waiting) >= self.batch_lines:
                self._cond.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is waiting for up to `timeout` seconds, then stop."""
        self._finish(timeout)

    def _next_batch(self) -> tuple[list[dict[str, object]], int] | None:
        """Wait for a full batch or the flush interval; None when it is time to stop."""
        with self._cond:
            end = time.monotonic() + self.flush_interval
            while (
                not self._closing
                and len(self._waiting) < self.batch_lines
                and (remaining := end - time.monotonic()) > 0
            ):
                self._cond.wait(remaining)
            if self._closing and (
                time.monotonic() >= self._deadline or (not self._waiting and not self.dropped)
            ):
                return None
            batch = [
                self._waiting.popleft() for _ in range(min(self.batch_lines, len(self._waiting)))
            ]
            dropped, self.dropped = self.dropped, 0
            return batch, dropped

    def _run(self) -> None:
        assert self.client is not None
        while (taken := self._next_batch()) is not None:
            batch, dropped = taken
            if not batch and not dropped:
                continue
            while True:
                try:
                    self.client.post(LOGS_PATH, {"lines": batch, "dropped": dropped})
                except PortalError as exc:
                    if not exc.retryable:
                        logger.error(
                            "portal refused %d log line(s), dropping them: %s", len(batch), exc
                        )
                        with self._cond:
                            self.total_dropped += len(batch)
                        break
                    logger.debug("log forwarding paused: %s", exc)
                    if not self._pause(self.backoff.next()):
                        return
                else:
                    self.sent += len(batch)
                    self.backoff.reset()
                    break


class OutputSink:
    """Where each output line of the workload goes: the rank's log file, the forwarder, echo."""

    def __init__(
        self, log_file: Path, forwarder: LogForwarder, echo: IO[str] | None = None
    ) -> None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        self.path = log_file
        self._file = log_file.open("a", encoding="utf-8", errors="replace", buffering=1)
        self.forwarder = forwarder
        self.echo = echo
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        """Record one line (without its newline)."""
        with self._lock:
            self._file.write(line + "\n")
            if self.echo is not None:
                self.echo.write(line + "\n")
                self.echo.flush()
        self.forwarder.add(line)

    def close(self) -> None:
        """Close the log file."""
        with self._lock:
            self._file.close()

"""Best-effort reports from the SDK to the agent's local endpoint (BATON_AGENT_URL).

Reports never slow down or break training: they are queued (bounded; progress reports are
dropped first when the agent is slow) and sent by one background thread with a short timeout.
Without an agent (standalone runs) nothing is sent and nothing louder than DEBUG is logged.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from .forks import renew_after_fork

logger = logging.getLogger(__name__)

_STOP: tuple[str, dict[str, Any]] = ("", {})


class AgentReporter:
    """Posts JSON bodies to `<agent_url>/<path>` from a background thread."""

    def __init__(self, agent_url: str | None, *, timeout: float = 1.0, capacity: int = 256) -> None:
        self.agent_url = agent_url.rstrip("/") if agent_url else None
        self.timeout = timeout
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(capacity)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self.dropped = 0
        renew_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child (decision 073): what is queued is the parent's to send; the
        child's next report starts a thread of its own."""
        self._queue = queue.Queue(self._queue.maxsize)
        self._thread = None
        self._lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any], *, droppable: bool = False) -> None:
        """Queue a report; a droppable one is discarded rather than waited for when full."""
        if self.agent_url is None:
            return
        self._start()
        try:
            self._queue.put((path, body), block=not droppable, timeout=self.timeout)
        except queue.Full:
            self.dropped += 1

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="baton-report", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            path, body = self._queue.get()
            try:
                if (path, body) == _STOP:
                    return
                self._send(path, body)
            finally:
                self._queue.task_done()

    def _send(self, path: str, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{self.agent_url}/{path.lstrip('/')}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
            self.sent += 1
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failed += 1
            logger.debug("report %s to the agent failed: %s", path, exc)

    def flush(self, timeout: float = 3.0) -> bool:
        """Wait (up to `timeout`) until every queued report was sent or failed."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout: float = 3.0) -> None:
        """Send what is queued (up to `timeout`) and stop the thread."""
        if self._thread is None:
            return
        self.flush(timeout)
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            return
        self._thread.join(timeout=0.5)

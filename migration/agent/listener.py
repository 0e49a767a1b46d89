"""The interruption listener: a polling thread, and a watchdog that restarts it when it dies.

A listener that dies and comes back is reported (`listener_failed`, `recovered: true`); one
that dies more than `max_restarts` times within `restart_window` seconds is reported with
`recovered: false`, so the portal can mark the instance `awareness_abnormal` and move the job
to on-demand capacity. Even then the watchdog keeps trying, slowly and quietly: a notice it
still manages to read is better acted upon than ignored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

logger = logging.getLogger(__name__)

RUNNING = "running"
RESTARTING = "restarting"
FAILED = "failed"
STOPPED = "stopped"


class Listener:
    """Calls `poll` every `interval` seconds in a thread that is restarted when it dies.

    `on_failure(error, restarts, recovered)` is called from the watchdog thread after each
    death: `recovered` is True when the poller is being restarted, False when it gave up.
    """

    def __init__(
        self,
        poll: Callable[[], None],
        interval: float,
        on_failure: Callable[[str, int, bool], None],
        max_restarts: int = 5,
        restart_window: float = 60.0,
        slow_interval: float = 30.0,
    ) -> None:
        self.poll = poll
        self.interval = interval
        self.on_failure = on_failure
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.slow_interval = max(slow_interval, interval)
        self.state = STOPPED
        self.restarts = 0
        self.last_error = ""
        self.polls = 0
        self._stop = threading.Event()
        self._deaths: deque[float] = deque()
        self._watchdog: threading.Thread | None = None

    def start(self) -> None:
        """Start polling in the background."""
        self.state = RUNNING
        self._watchdog = threading.Thread(target=self._watch, name="listener-watchdog", daemon=True)
        self._watchdog.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop polling; wait up to `timeout` seconds for the threads to end."""
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(timeout)
        self.state = STOPPED

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:
                # The thread dies here, as any uncaught exception would end it; the watchdog
                # sees the recorded error and decides whether to restart.
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("interruption listener died: %s", self.last_error)
                return
            self.polls += 1
            self._stop.wait(self.interval if self.state != FAILED else self.slow_interval)

    def _watch(self) -> None:
        while not self._stop.is_set():
            poller = threading.Thread(target=self._poll_loop, name="listener", daemon=True)
            poller.start()
            poller.join()
            if self._stop.is_set():
                return
            self.restarts += 1
            now = time.monotonic()
            self._deaths.append(now)
            while self._deaths and now - self._deaths[0] > self.restart_window:
                self._deaths.popleft()
            if self.state == FAILED:
                self._stop.wait(self.slow_interval)
                continue
            gave_up = len(self._deaths) > self.max_restarts
            self.state = FAILED if gave_up else RESTARTING
            try:
                self.on_failure(self.last_error, self.restarts, not gave_up)
            except Exception:
                logger.exception("could not report the listener failure")
            if gave_up:
                logger.error(
                    "interruption listener died %d times within %.0f s; giving up (still "
                    "retrying every %.0f s)",
                    len(self._deaths),
                    self.restart_window,
                    self.slow_interval,
                )
                self._stop.wait(self.slow_interval)
            else:
                # A short pause so a listener that dies at once does not spin the CPU.
                self._stop.wait(min(self.interval, 1.0))
                self.state = RUNNING

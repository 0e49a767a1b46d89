"""The portal's agent API as seen from the instance: `POST /api/agent/events/` and `/logs/`."""

from __future__ import annotations

import logging
import threading
import time

from migration.agent import httpjson

logger = logging.getLogger(__name__)

EVENTS_PATH = "/api/agent/events/"
LOGS_PATH = "/api/agent/logs/"

# Answers after which the same request may succeed later: the portal is restarting, overloaded,
# or the instance's token is not registered yet. Anything else in 4xx means the request
# itself is wrong and sending it again cannot help.
_RETRYABLE = frozenset({401, 403, 404, 408, 409, 425, 429})


class PortalError(RuntimeError):
    """A request to the portal failed; `retryable` says whether sending it again may help."""

    def __init__(self, message: str, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class PortalClient:
    """Posts JSON to the portal with the instance's agent token."""

    def __init__(self, base_url: str, token: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def post(self, path: str, body: dict[str, object]) -> dict[str, object]:
        """POST `body`; return the JSON answer. Raise PortalError when there is no 2xx answer."""
        try:
            answer = httpjson.request(
                self.base_url + path,
                method="POST",
                body=body,
                headers={"Authorization": f"Agent {self.token}", "Accept": "application/json"},
                timeout=self.timeout,
            )
        except httpjson.TransportError as exc:
            raise PortalError(str(exc), retryable=True) from exc
        if not 200 <= answer.status < 300:
            retryable = answer.status >= 500 or answer.status in _RETRYABLE
            snippet = answer.body[:200].decode("utf-8", "replace")
            raise PortalError(
                f"POST {path} answered HTTP {answer.status}: {snippet}", retryable, answer.status
            )
        try:
            data = answer.json() if answer.body.strip() else {}
        except ValueError:
            data = {}
        return data if isinstance(data, dict) else {}


class Backoff:
    """Exponential back-off between retries: `first`, doubling, capped at `cap` seconds.

    The cap is short because a notice held back by a long pause delays the whole migration;
    a refused connection every ten seconds costs a recovering portal next to nothing.
    """

    def __init__(self, first: float = 0.5, cap: float = 10.0) -> None:
        self.first = first
        self.cap = cap
        self.current = first

    def next(self) -> float:
        """The pause before the next retry; the pause after that is twice as long."""
        pause = self.current
        self.current = min(self.current * 2, self.cap)
        return pause

    def reset(self) -> None:
        """After a success: the next failure starts from `first` again."""
        self.current = self.first


class BackgroundSender:
    """A thread that posts to the portal, pausing with back-off between failed tries.

    Shared by the event outbox and the log forwarder: `start` runs `_run` on a daemon thread;
    `_finish(timeout)` asks it to send what is left for up to `timeout` seconds and waits;
    `_pause` sleeps, but wakes at once when closing begins, so the last try happens now
    rather than after a long back-off.
    """

    thread_name = "sender"

    def __init__(self, client: PortalClient | None, backoff: Backoff | None = None) -> None:
        self.client = client
        self.backoff = backoff or Backoff()
        self._cond = threading.Condition()
        self._closing = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the sender thread (nothing to do without a portal)."""
        if self.client is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def _finish(self, timeout: float) -> None:
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        if self._thread is not None and self.client is not None:
            self._thread.join(timeout + self.client.timeout + 1)

    def _pause(self, seconds: float) -> bool:
        """Pause up to `seconds` (less once closing); False when closing time is over."""
        with self._cond:
            was_closing = self._closing
            end = min(time.monotonic() + seconds, self._deadline)
            while (remaining := end - time.monotonic()) > 0:
                self._cond.wait(remaining)
                if self._closing and not was_closing:
                    break  # the agent is ending: one more try now, not after the back-off
                end = min(end, self._deadline)
            return time.monotonic() < self._deadline

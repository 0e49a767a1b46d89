"""Events to the portal: numbered, buffered on disk while the portal is away, sent in order.

Every event gets its `seq` when it is first put into a batch, and keeps it through every
retry, so a batch re-sent after a lost answer is stored once by the portal. Events are sent
strictly in order; the portal answers with the highest `seq` it holds and everything up to it
leaves the buffer. The buffer is a JSON file in the agent's folder, replaced atomically on
every change, so an agent restarted on the same instance neither loses nor renumbers events.

The buffer is bounded. While an event has no `seq` yet, a newer `heartbeat` or `progress`
replaces an older one of the same type: they only say "this is where we are now", so a long
outage costs one of each instead of one per interval. If the bound is still reached, the
oldest unnumbered events are dropped and counted (`dropped_events` in the next heartbeat).
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path

from migration.agent.portal import (
    EVENTS_PATH,
    BackgroundSender,
    Backoff,
    PortalClient,
    PortalError,
)

logger = logging.getLogger(__name__)

SUPERSEDED_TYPES = frozenset({"heartbeat", "progress"})


def now_iso() -> str:
    """The current time, UTC, ISO 8601."""
    return datetime.now(UTC).isoformat()


class EventOutbox(BackgroundSender):
    """A bounded, persistent, in-order queue of events with a sender thread."""

    thread_name = "event-sender"

    def __init__(
        self,
        path: Path | None,
        client: PortalClient | None,
        max_events: int = 10_000,
        batch_size: int = 100,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(client, backoff)
        self.path = path
        self.max_events = max_events
        self.batch_size = batch_size
        self.dropped = 0
        self.delivered = 0
        self._events: list[dict[str, object]] = []
        self._next_seq = 1
        self._failing = False
        self._load()

    # -- buffer ------------------------------------------------------------------------------

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            self._events = list(state["events"])
            self._next_seq = int(state["next_seq"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("event buffer %s unreadable (%s); starting a new one", self.path, exc)
            return
        if self._events:
            logger.info("resuming %d buffered event(s) from %s", len(self._events), self.path)

    def _persist(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(
                json.dumps({"next_seq": self._next_seq, "events": self._events}), encoding="utf-8"
            )
            os.replace(tmp, self.path)
        except OSError as exc:
            # The in-memory buffer still holds everything; only a crash would now lose events.
            logger.warning("could not write the event buffer %s: %s", self.path, exc)

    def emit(self, event_type: str, **fields: object) -> None:
        """Queue one event; it is sent in the background, after every event queued before it."""
        event: dict[str, object] = {"type": event_type, "at": now_iso(), **fields}
        if self.client is None:
            logger.debug("event (no portal configured): %s", event)
            return
        with self._cond:
            if event_type in SUPERSEDED_TYPES:
                self._events = [
                    e for e in self._events if "seq" in e or e.get("type") != event_type
                ]
            while len(self._events) >= self.max_events:
                victim = next((i for i, e in enumerate(self._events) if "seq" not in e), None)
                if victim is None:
                    break
                dropped = self._events.pop(victim)
                self.dropped += 1
                logger.warning("event buffer full; dropped a %s event", dropped.get("type"))
            self._events.append(event)
            self._persist()
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        """Events not yet acknowledged by the portal."""
        with self._cond:
            return len(self._events)

    # -- sender ------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> bool:
        """Send what is buffered for up to `timeout` seconds; True when nothing is left."""
        self._finish(timeout)
        left = self.pending
        if left:
            logger.warning("%d event(s) not delivered; they stay in %s", left, self.path)
        return left == 0

    def _take_batch(self) -> list[dict[str, object]] | None:
        with self._cond:
            while not self._events and not self._closing:
                self._cond.wait()
            if not self._events or (self._closing and time.monotonic() >= self._deadline):
                return None
            batch = self._events[: self.batch_size]
            numbered = False
            for event in batch:
                if "seq" not in event:
                    event["seq"] = self._next_seq
                    self._next_seq += 1
                    numbered = True
            if numbered:
                self._persist()
            return [dict(e) for e in batch]

    def _run(self) -> None:
        assert self.client is not None
        while (batch := self._take_batch()) is not None:
            highest = max(int(e["seq"]) for e in batch)  # type: ignore[call-overload]
            try:
                answer = self.client.post(EVENTS_PATH, {"events": batch})
            except PortalError as exc:
                if not exc.retryable:
                    # The portal will never take this batch; holding it would block all later
                    # events for good, so it is dropped, loudly.
                    logger.error("portal refused %d event(s), dropping them: %s", len(batch), exc)
                    self._forget_through(highest)
                    continue
                level = logging.DEBUG if self._failing else logging.WARNING
                logger.log(
                    level, "portal unreachable (%s); %d event(s) buffered", exc, self.pending
                )
                self._failing = True
                self._pause(self.backoff.next())
                continue
            acked = answer.get("acked")
            acked_seq = acked if isinstance(acked, int) and not isinstance(acked, bool) else highest
            if self._failing:
                logger.info("portal reachable again")
                self._failing = False
            self._forget_through(acked_seq)
            if acked_seq < highest:
                # The portal kept only part of the batch: try the rest again, but not in a loop.
                self._pause(self.backoff.next())
            else:
                self.backoff.reset()

    def _forget_through(self, seq: int) -> None:
        with self._cond:
            before = len(self._events)
            self._events = [
                e
                for e in self._events
                if "seq" not in e or int(e["seq"]) > seq  # type: ignore[call-overload]
            ]
            self.delivered += before - len(self._events)
            self._persist()
            self._cond.notify_all()

"""Websocket consumers of the live timeline, with the resume protocol of DESIGN §8.

A client connects, sends `{"type": "resume", "since": <id>}` and receives every event after
`since` followed by live events. Live events that arrive before the resume are held back and
merged by id, so nothing is lost or sent twice. A consumer authenticates, joins its group and
forwards; the queries live in migration.selectors.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from migration import selectors
from migration.events import FLEET_GROUP, job_group

MAX_HELD_BACK = 1000


class TimelineConsumer(AsyncJsonWebsocketConsumer):
    """Shared resume logic; subclasses say who may watch, which group, and which events."""

    group = ""

    async def allowed(self, user: Any) -> bool:
        raise NotImplementedError

    def events_after(self, since: int) -> tuple[list[dict[str, Any]], str | None]:
        """Events after `since` and, for one job, its state as of that read."""
        raise NotImplementedError

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not await self.allowed(user):
            await self.close()  # before accept: the handshake is refused with 403
            return
        self.last_id = 0
        self.resumed = False
        self.held_back: list[dict[str, Any]] = []
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "resume":
            await self.send_json(
                {"type": "error", "error": 'expected {"type": "resume", "since": <id>}'}
            )
            return
        try:
            since = max(int(content.get("since") or 0), self.last_id)
        except (TypeError, ValueError):
            await self.send_json({"type": "error", "error": "since must be an event id"})
            return
        missed, state = await database_sync_to_async(self.events_after)(since)
        for event in missed:
            await self._forward(event)
        if state:
            await self.send_json({"type": "job.state", "state": state})
        for message in self.held_back:
            await self._forward(message["event"], message.get("state"))
        self.held_back = []
        self.resumed = True

    async def timeline_event(self, message: dict[str, Any]) -> None:
        if not self.resumed:
            if len(self.held_back) < MAX_HELD_BACK:
                self.held_back.append(message)
            return
        await self._forward(message["event"], message.get("state"))

    async def job_progress(self, message: dict[str, Any]) -> None:
        if self.resumed:
            await self.send_json(message)

    async def log_lines(self, message: dict[str, Any]) -> None:
        if self.resumed:
            await self.send_json(message)

    async def _forward(self, event: dict[str, Any], state: str | None = None) -> None:
        if event["id"] <= self.last_id:
            return
        self.last_id = event["id"]
        message: dict[str, Any] = {"type": "timeline.event", "event": event}
        if state:
            message["state"] = state  # the job's state once this event was recorded (live only)
        await self.send_json(message)


class JobTimelineConsumer(TimelineConsumer):
    """`/ws/jobs/<id>/`: the owner's project members and staff; others are refused."""

    async def allowed(self, user: Any) -> bool:
        self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        self.group = job_group(self.job_id)
        return await database_sync_to_async(selectors.can_watch_job)(user, self.job_id)

    def events_after(self, since: int) -> tuple[list[dict[str, Any]], str | None]:
        return selectors.job_events_after(self.job_id, since)


class FleetConsumer(TimelineConsumer):
    """`/ws/fleet/`: every job's events, for staff."""

    group = FLEET_GROUP

    async def allowed(self, user: Any) -> bool:
        return bool(user.is_staff)

    def events_after(self, since: int) -> tuple[list[dict[str, Any]], str | None]:
        return selectors.fleet_events_after(since)

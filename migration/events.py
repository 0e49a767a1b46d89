"""The live timeline: every phase is a TimelineEvent row first, then a websocket message.

Events of one job are written under the job's row lock, so their ids increase in commit order
(DESIGN §8); the message goes to the Channels groups `job.<id>` and `fleet` only after the
transaction commits, so a client never sees an event the database does not have.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from migration.models import TimelineEvent
from portal.locks import lock_rows

if TYPE_CHECKING:
    from jobs.models import Job
    from migration.models import Migration

logger = logging.getLogger(__name__)

FLEET_GROUP = "fleet"
BROADCAST_TIMEOUT_S = 2.0


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def serialize_event(event: TimelineEvent) -> dict[str, Any]:
    """The timeline event shape of DESIGN §9 (the API serializer gives the same fields)."""
    return {
        "id": event.pk,
        "job": event.job_id,
        "migration": event.migration_id,
        "kind": event.kind,
        "at": event.at.isoformat().replace("+00:00", "Z"),
        "data": event.data,
    }


def broadcast(job_id: int, message_type: str, payload: dict[str, Any]) -> None:
    """Send one message to the job's group and the fleet group; never raise to the caller."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": message_type, **payload}

    async def send() -> None:
        await layer.group_send(job_group(job_id), message)
        await layer.group_send(FLEET_GROUP, message)

    try:
        # Bounded: this runs among a commit's hooks, before the tasks the commit queues; a
        # send that hangs must not hold them back (seen: a placement never queued).
        async_to_sync(asyncio.wait_for)(send(), BROADCAST_TIMEOUT_S)
    except (Exception, asyncio.CancelledError):  # the row is committed; resume catches up
        logger.warning("could not broadcast %s for job %s", message_type, job_id, exc_info=True)


def record_event(
    job: Job,
    kind: str,
    data: dict[str, Any] | None = None,
    migration: Migration | None = None,
) -> TimelineEvent:
    """Append a timeline event for `job` and send it to watchers once the transaction commits.

    Must run inside the caller's transaction; takes the job's row lock so ids of one job
    increase in commit order.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("record_event must run inside transaction.atomic()")
    lock_rows(type(job).objects).filter(pk=job.pk).values_list("pk", flat=True).first()
    event = TimelineEvent.objects.create(
        job=job, migration=migration, kind=kind, at=timezone.now(), data=data or {}
    )
    # The job's state rides along (not part of the event), so a page can show it live.
    payload = {"event": serialize_event(event), "state": job.state}
    transaction.on_commit(lambda: broadcast(job.pk, "timeline.event", payload), robust=True)
    return event

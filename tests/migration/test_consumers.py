"""Websocket consumers over the channels-redis layer on a real Redis: who may watch, and the
resume protocol (missed events, then live ones, nothing lost or sent twice)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from jobs.models import Job
from migration.events import record_event
from portal.asgi import application
from tests.conftest import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ORIGIN = (b"origin", b"http://127.0.0.1")


def session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(
    path: str, user: Any | None = None, token: str | None = None
) -> tuple[bool, WebsocketCommunicator]:
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(session_cookie)(user)))
    if token is not None:
        path += f"?token={token}"
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    if not connected:
        await end_refused(communicator)
    return connected, communicator


async def end_refused(communicator: WebsocketCommunicator) -> None:
    """A refused consumer still listens on its channel until told the socket is gone (and does
    not finish at once even then): end it now, inside the test, not when the test's event loop
    is torn down, where cancelling its channel read has hung a whole test run."""
    with contextlib.suppress(Exception):
        await communicator.disconnect(timeout=1)


@database_sync_to_async
def new_job(owner: Any, catalogue: Any) -> Job:
    return submit(owner, catalogue)


@database_sync_to_async
def add_events(job: Job, *kinds: str) -> list[int]:
    with transaction.atomic():
        return [record_event(job, kind, {"n": i}).pk for i, kind in enumerate(kinds)]


async def receive_ids(communicator: WebsocketCommunicator, count: int) -> list[int]:
    """Ids of the next `count` timeline events (the job.state note after a replay is skipped)."""
    ids: list[int] = []
    while len(ids) < count:
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == "job.state":
            continue
        assert message["type"] == "timeline.event"
        ids.append(message["event"]["id"])
    return ids


async def test_the_owner_gets_missed_events_then_live_ones(catalogue: Any, alice: Any) -> None:
    job = await new_job(alice, catalogue)
    first = await add_events(job, "placement_decided", "instance_started")
    connected, ws = await connect(f"/ws/jobs/{job.pk}/", alice)
    assert connected

    await ws.send_json_to({"type": "resume", "since": first[0]})
    replayed = await receive_ids(ws, 1)
    live = await add_events(job, "running")
    received = await receive_ids(ws, 1)

    assert replayed == [first[1]]
    assert received == live
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_events_committed_before_the_resume_are_sent_once_in_order(
    catalogue: Any, alice: Any
) -> None:
    job = await new_job(alice, catalogue)
    connected, ws = await connect(f"/ws/jobs/{job.pk}/", alice)
    assert connected
    # Broadcast while the client has not resumed yet: held back, then merged with the replay.
    during = await add_events(job, "placement_decided", "instance_started", "running")

    await ws.send_json_to({"type": "resume", "since": 0})
    ids = await receive_ids(ws, 4)  # job_submitted + the three above

    assert ids == sorted(ids) and ids[1:] == during
    assert (await ws.receive_json_from(timeout=5))["type"] == "job.state"
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_stranger_is_refused_before_the_connection_is_accepted(
    catalogue: Any, alice: Any, bob: Any
) -> None:
    job = await new_job(alice, catalogue)

    connected, _ = await connect(f"/ws/jobs/{job.pk}/", bob)

    assert not connected


async def test_anonymous_users_and_unknown_jobs_are_refused(catalogue: Any, alice: Any) -> None:
    job = await new_job(alice, catalogue)

    anonymous, _ = await connect(f"/ws/jobs/{job.pk}/")
    unknown, _ = await connect("/ws/jobs/999999/", alice)
    bad_token, _ = await connect(f"/ws/jobs/{job.pk}/", token="not-a-token")

    assert not anonymous and not unknown and not bad_token


async def test_the_fleet_stream_is_for_staff_only(
    catalogue: Any, alice: Any, make_user: Any
) -> None:
    root = await database_sync_to_async(make_user)("root", staff=True)
    job = await new_job(alice, catalogue)

    refused, _ = await connect("/ws/fleet/", alice)
    connected, ws = await connect("/ws/fleet/", root)
    await ws.send_json_to({"type": "resume", "since": 0})
    submitted = await receive_ids(ws, 1)
    live = await add_events(job, "placement_decided")
    received = await receive_ids(ws, 1)

    assert not refused and connected
    assert received == live and submitted[0] < live[0]
    await ws.disconnect()


async def test_a_malformed_message_gets_an_error_not_a_disconnect(
    catalogue: Any, alice: Any
) -> None:
    job = await new_job(alice, catalogue)
    _, ws = await connect(f"/ws/jobs/{job.pk}/", alice)

    await ws.send_json_to({"type": "resume", "since": "yesterday"})
    error = await ws.receive_json_from(timeout=5)
    await ws.send_json_to({"type": "resume", "since": 0})
    ids = await receive_ids(ws, 1)

    assert error["type"] == "error" and "since" in error["error"]
    assert len(ids) == 1
    await ws.disconnect()


async def test_live_events_carry_the_jobs_state_for_the_page(catalogue: Any, alice: Any) -> None:
    job = await new_job(alice, catalogue)
    _, ws = await connect(f"/ws/jobs/{job.pk}/", alice)
    await ws.send_json_to({"type": "resume", "since": 0})
    replayed = await ws.receive_json_from(timeout=5)
    state_now = await ws.receive_json_from(timeout=5)

    await add_events(job, "waiting")
    live = await ws.receive_json_from(timeout=5)

    assert replayed["event"]["kind"] == "job_submitted"
    assert state_now == {"type": "job.state", "state": "pending"}  # after the replay
    assert live["state"] == "pending" and live["event"]["kind"] == "waiting"
    await ws.disconnect()

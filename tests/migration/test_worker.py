"""A job submitted over REST is placed by a real Celery worker process through real Redis,
and the worker's event reaches a websocket client through the channels-redis layer."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from migration.models import TimelineEvent
from tests.conftest import job_body, wait_until
from tests.migration.test_consumers import connect

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_real_worker_places_a_submitted_job(
    catalogue: Any, alice: Any, client_for: Any, celery_worker: Any
) -> None:
    job = client_for(alice).post("/api/jobs/", job_body(), format="json").json()

    event = wait_until(
        lambda: TimelineEvent.objects.filter(job_id=job["id"], kind="placement_decided").first(),
        timeout=60,
    )

    detail = client_for(alice).get(f"/api/jobs/{job['id']}/").json()
    assert detail["state"] == "starting"
    assert detail["pool"] == event.data["pool"] == catalogue["pools"]["t4_spot"].pk


@pytest.mark.asyncio
async def test_the_workers_event_reaches_the_owners_websocket_live(
    catalogue: Any, alice: Any, client_for: Any, celery_worker: Any
) -> None:
    client = await sync_to_async(client_for)(alice)
    job = (await sync_to_async(client.post)("/api/jobs/", job_body(), format="json")).json()
    connected, ws = await connect(f"/ws/jobs/{job['id']}/", alice)
    assert connected
    await ws.send_json_to({"type": "resume", "since": 0})

    kinds = []
    while "placement_decided" not in kinds:
        message = await ws.receive_json_from(timeout=60)
        if message["type"] == "timeline.event":
            kinds.append(message["event"]["kind"])

    assert kinds == ["job_submitted", "placement_decided"]
    await ws.disconnect()

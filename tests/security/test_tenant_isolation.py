"""Two users in two projects: neither reads nor acts on the other's jobs, instances, logs or
timelines, over any REST endpoint or either websocket; staff-only actions stay staff-only."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from jobs.models import Project
from migration.models import Checkpoint, LogLine
from portal.asgi import application
from portal.tokens import issue_api_token
from tests.conftest import job_body, placed_instance
from tests.migration.test_consumers import end_refused

pytestmark = pytest.mark.django_db

JOB_VIEWS = ["", "timeline/", "checkpoints/", "migrations/", "logs/"]


@pytest.fixture
def alices(catalogue: Any, alice: Any) -> Any:
    """Alice's job, placed on an instance, with a checkpoint and a log line, in her project."""
    instance = placed_instance(alice, catalogue, name="alices-secret-run")
    Checkpoint.objects.create(
        job=instance.job, step=10, kind="periodic", status="committed", manifest_key="k"
    )
    LogLine.objects.create(
        job=instance.job, rank=0, at=timezone.now(), line="alice's secret loss 0.123"
    )
    return instance


def test_bob_gets_404_for_every_view_of_alices_job(alices: Any, bob: Any, client_for: Any) -> None:
    client = client_for(bob)

    statuses = {
        view: client.get(f"/api/jobs/{alices.job.pk}/{view}").status_code for view in JOB_VIEWS
    }

    assert set(statuses.values()) == {404}, statuses
    assert client.post(f"/api/jobs/{alices.job.pk}/cancel/").status_code == 404


def test_bobs_lists_hold_nothing_of_alices(alices: Any, bob: Any, client_for: Any) -> None:
    client = client_for(bob)

    jobs = client.get("/api/jobs/").json()["results"]
    instances = client.get("/api/instances/").json()
    of_job = client.get(f"/api/instances/?job={alices.job.pk}").json()

    assert jobs == []
    assert (instances.get("results", instances) if isinstance(instances, dict) else instances) == []
    assert (of_job.get("results", of_job) if isinstance(of_job, dict) else of_job) == []
    assert client.get(f"/api/instances/{alices.pk}/").status_code == 404


def test_bob_cannot_submit_or_estimate_into_alices_project(
    alices: Any, alice: Any, bob: Any, client_for: Any
) -> None:
    project = Project.objects.get(members=alice)

    for endpoint in ("/api/jobs/", "/api/estimates/"):
        response = client_for(bob).post(endpoint, job_body(project=project.pk), format="json")
        assert response.status_code == 400 and "project" in response.json()


def test_only_staff_interrupt_instances(alices: Any, alice: Any, client_for: Any) -> None:
    response = client_for(alice).post(
        f"/api/instances/{alices.pk}/interrupt/", {"advance_notice_s": 0}, format="json"
    )

    assert response.status_code == 403


def test_a_user_token_does_not_open_the_agent_api(alices: Any, alice: Any, client_for: Any) -> None:
    client = client_for(alice)

    events = client.post("/api/agent/events/", {"events": []}, format="json")
    logs = client.post("/api/agent/logs/", {"lines": []}, format="json")

    assert events.status_code in (401, 403) and logs.status_code in (401, 403)


def test_bobs_pages_show_nothing_of_alices(alices: Any, bob: Any) -> None:
    client = Client()
    client.force_login(bob)

    assert client.get(f"/jobs/{alices.job.pk}/").status_code == 404
    assert alices.job.name not in client.get("/").content.decode()


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_neither_websocket_lets_bob_watch_alices_jobs(alices: Any, bob: Any) -> None:
    key = await database_sync_to_async(lambda: issue_api_token(bob).key)()
    headers = [(b"origin", b"http://127.0.0.1"), (b"authorization", f"Token {key}".encode())]

    for path in (f"/ws/jobs/{alices.job_id}/", "/ws/fleet/"):
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        await end_refused(communicator)
        assert not connected, path

"""Who sees and acts on which job: members of its project and staff; others get 404."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Job, Project
from migration.models import Checkpoint, Instance, LogLine, Migration
from tests.conftest import job_body, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def alices_job(catalogue: Any, alice: Any, client_for: Any) -> dict[str, Any]:
    return client_for(alice).post("/api/jobs/", job_body(), format="json").json()


@pytest.mark.parametrize(
    "path",
    ["", "timeline/", "checkpoints/", "migrations/", "logs/"],
)
def test_another_user_gets_404_for_every_view_of_a_job(
    alices_job: dict[str, Any], bob: Any, client_for: Any, path: str
) -> None:
    response = client_for(bob).get(f"/api/jobs/{alices_job['id']}/{path}")

    assert response.status_code == 404


def test_another_user_cannot_cancel_a_job(
    alices_job: dict[str, Any], bob: Any, client_for: Any
) -> None:
    response = client_for(bob).post(f"/api/jobs/{alices_job['id']}/cancel/")

    assert response.status_code == 404
    assert Job.objects.get(pk=alices_job["id"]).state == "pending"


def test_the_job_list_holds_only_the_users_projects(
    alices_job: dict[str, Any], alice: Any, bob: Any, client_for: Any
) -> None:
    client_for(bob).post("/api/jobs/", job_body(name="bobs"), format="json")

    alices = client_for(alice).get("/api/jobs/").json()["results"]
    bobs = client_for(bob).get("/api/jobs/").json()["results"]

    assert [j["id"] for j in alices] == [alices_job["id"]]
    assert [j["name"] for j in bobs] == ["bobs"]


def test_members_of_a_shared_project_see_each_others_jobs(
    catalogue: Any, alice: Any, bob: Any, client_for: Any
) -> None:
    team = Project.objects.create(name="Team", slug="team")
    team.members.add(alice, bob)
    job = client_for(alice).post("/api/jobs/", job_body(project=team.pk), format="json").json()

    assert client_for(bob).get(f"/api/jobs/{job['id']}/").status_code == 200


def test_staff_see_every_job(alices_job: dict[str, Any], make_user: Any, client_for: Any) -> None:
    root = make_user("root", staff=True)

    assert client_for(root).get(f"/api/jobs/{alices_job['id']}/").status_code == 200


def test_cancel_releases_the_job_and_a_second_cancel_conflicts(
    alices_job: dict[str, Any], alice: Any, client_for: Any, catalogue: Any
) -> None:
    job = Job.objects.get(pk=alices_job["id"])
    Instance.objects.create(job=job, pool=catalogue["pools"]["t4_spot"], state="running")

    first = client_for(alice).post(f"/api/jobs/{job.pk}/cancel/")
    second = client_for(alice).post(f"/api/jobs/{job.pk}/cancel/")

    assert first.status_code == 202
    assert first.json()["state"] == "cancelled"
    assert second.status_code == 409
    assert Instance.objects.get(job=job).state == "released"
    kinds = client_for(alice).get(f"/api/jobs/{job.pk}/timeline/").json()
    assert [e["kind"] for e in kinds] == ["job_submitted", "cancelled"]


def test_timeline_returns_events_after_since_in_ascending_order(
    alices_job: dict[str, Any], alice: Any, client_for: Any
) -> None:
    from django.db import transaction

    from migration.events import record_event

    job = Job.objects.get(pk=alices_job["id"])
    with transaction.atomic():
        for n in range(3):
            record_event(job, "waiting", {"n": n})
    client = client_for(alice)
    everything = client.get(f"/api/jobs/{job.pk}/timeline/").json()
    after_second = client.get(f"/api/jobs/{job.pk}/timeline/?since={everything[1]['id']}").json()
    capped = client.get(f"/api/jobs/{job.pk}/timeline/?limit=2").json()

    ids = [e["id"] for e in everything]
    assert ids == sorted(ids) and len(ids) == 4
    assert [e["id"] for e in after_second] == ids[2:]
    assert [e["id"] for e in capped] == ids[:2]
    assert set(everything[0]) == {"id", "job", "migration", "kind", "at", "data"}


def test_timeline_rejects_a_bad_since(
    alices_job: dict[str, Any], alice: Any, client_for: Any
) -> None:
    response = client_for(alice).get(f"/api/jobs/{alices_job['id']}/timeline/?since=abc")

    assert response.status_code == 400
    assert "since" in response.json()


def test_checkpoints_migrations_and_logs_of_a_job(
    alices_job: dict[str, Any], alice: Any, client_for: Any, catalogue: Any
) -> None:
    from django.utils import timezone

    job = Job.objects.get(pk=alices_job["id"])
    checkpoint = Checkpoint.objects.create(
        job=job,
        step=40,
        kind="emergency",
        status="committed",
        manifest_key="m/40",
        bytes_total=100,
        bytes_new=10,
    )
    checkpoint.replicas.create(region=catalogue["region"], status="ready", bytes=10)
    Migration.objects.create(job=job, trigger="interruption", lost_steps=0)
    for rank in (0, 1):
        LogLine.objects.create(job=job, rank=rank, at=timezone.now(), line=f"hello from {rank}")
    client = client_for(alice)

    checkpoints = client.get(f"/api/jobs/{job.pk}/checkpoints/").json()
    migrations = client.get(f"/api/jobs/{job.pk}/migrations/").json()
    rank1 = client.get(f"/api/jobs/{job.pk}/logs/?rank=1").json()

    assert checkpoints[0]["replicas"] == [
        {"region": "us-east-1", "status": "ready", "bytes": 10, "completed_at": None}
    ]
    assert {"id", "step", "kind", "status", "bytes_total", "bytes_new", "created_at"} <= set(
        checkpoints[0]
    )
    assert migrations[0]["trigger"] == "interruption" and migrations[0]["lost_steps"] == 0
    assert [line["line"] for line in rank1] == ["hello from 1"]


def test_job_list_costs_a_fixed_number_of_queries(
    catalogue: Any, alice: Any, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    client = client_for(alice)
    for n in range(30):
        submit(alice, catalogue, name=f"j{n}")

    with django_assert_max_num_queries(6):
        response = client.get("/api/jobs/")

    assert response.json()["count"] == 30

"""Submitting jobs over REST: validation with field errors, projects, permissions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.models import Job, Project
from migration.models import TimelineEvent
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


def test_it_creates_a_job_and_records_the_submission(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    response = client_for(alice).post("/api/jobs/", job_body(), format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "pending"
    assert body["accelerator"] == "T4"
    assert body["workload"] == {"template": "mlp_numpy", "params": {"seed": 1}}
    job = Job.objects.get(pk=body["id"])
    assert job.owner == alice
    assert body["checkpoint_key"] == job.checkpoint_key  # what a user's own SDK run restores
    assert list(TimelineEvent.objects.filter(job=job).values_list("kind", flat=True)) == [
        "job_submitted"
    ]


def test_it_puts_a_job_without_project_in_the_users_personal_project(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    first = client_for(alice).post("/api/jobs/", job_body(), format="json").json()
    second = client_for(alice).post("/api/jobs/", job_body(), format="json").json()

    personal = Project.objects.get(personal_owner=alice)
    assert first["project"] == second["project"] == personal.pk
    assert list(personal.members.all()) == [alice]


def test_it_derives_estimator_inputs_from_template_parameters(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    body = job_body(
        total_steps=3600,
        workload={"template": "mlp_numpy", "params": {"step_ms": 1000, "state_mb": 1024}},
    )
    job = client_for(alice).post("/api/jobs/", body, format="json").json()

    assert job["expected_hours"] == pytest.approx(1.0)
    assert job["checkpoint_gb"] == pytest.approx(1.0, rel=0.01)
    assert job["checkpoint_every_steps"] == 20


def test_it_checkpoints_every_five_minutes_when_the_user_says_nothing(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    body = job_body()
    del body["checkpoint_every_steps"]
    job = client_for(alice).post("/api/jobs/", body, format="json").json()

    assert job["checkpoint_every_seconds"] == 300


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("accelerator", "NO-SUCH-GPU"),
        ("gpus_per_node", 0),
        ("nodes", 0),
        ("total_steps", 0),
        ("tolerance", "reckless"),
        ("max_price_per_hour", 0),
        ("max_price_per_hour", -1),
        ("deadline", "2001-01-01T00:00:00Z"),
        ("checkpoint_every_steps", 0),
        ("workload", {"template": "no_such_template", "params": {}}),
        ("workload", {"template": "mlp_numpy", "params": {"colour": "blue"}}),
        ("workload", {"template": "mlp_numpy", "params": {"seed": "one"}}),
        ("workload", {"template": "mlp_numpy", "params": {"step_ms": -5}}),
        ("workload", {"nothing": True}),
        ("workload", "python train.py"),
    ],
)
def test_it_rejects_an_invalid_field_with_a_field_error(
    catalogue: Any, alice: Any, client_for: Any, field: str, value: Any
) -> None:
    response = client_for(alice).post("/api/jobs/", job_body(**{field: value}), format="json")

    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_it_names_the_unknown_parameter(catalogue: Any, alice: Any, client_for: Any) -> None:
    body = job_body(workload={"template": "mlp_numpy", "params": {"colour": "blue"}})
    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert "colour" in str(response.json()["workload"])


def test_it_refuses_a_command_job_without_the_run_command_permission(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    body = job_body(workload={"command": ["python", "train.py"], "mode": "directory"})
    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400
    assert "jobs.run_command" in str(response.json()["workload"])


def test_it_accepts_a_command_job_from_a_user_with_the_permission(
    catalogue: Any, make_user: Any, client_for: Any
) -> None:
    carol = make_user("carol", perms=("jobs.run_command",))
    body = job_body(workload={"command": ["python", "train.py", "{checkpoint_dir}"]})
    response = client_for(carol).post("/api/jobs/", body, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["workload"]["mode"] == "directory"


def test_it_accepts_a_future_deadline_and_a_price_cap(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    deadline = (timezone.now() + timedelta(hours=5)).isoformat()
    response = client_for(alice).post(
        "/api/jobs/", job_body(deadline=deadline, max_price_per_hour=0.5), format="json"
    )

    assert response.status_code == 201, response.json()
    assert response.json()["max_price_per_hour"] == 0.5


def test_it_refuses_a_project_the_user_does_not_belong_to(
    catalogue: Any, alice: Any, bob: Any, client_for: Any
) -> None:
    bobs = Project.objects.create(name="Bob's", slug="bobs")
    bobs.members.add(bob)

    response = client_for(alice).post("/api/jobs/", job_body(project=bobs.pk), format="json")

    assert response.status_code == 400
    assert "project" in response.json()


def test_anonymous_users_cannot_submit(catalogue: Any, client: Any) -> None:
    response = client.post("/api/jobs/", job_body(), content_type="application/json")

    assert response.status_code in (401, 403)


def test_a_token_is_issued_for_a_username_and_password(alice: Any, client: Any) -> None:
    good = client.post("/api/auth/token/", {"username": "alice", "password": "pw"})
    bad = client.post("/api/auth/token/", {"username": "alice", "password": "wrong"})

    assert good.status_code == 200 and good.json()["token"]
    assert bad.status_code == 400


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"state_mb": 1e308}, "state_mb"),
        ({"hidden": 10**9}, "hidden"),
        ({"seed": 10**30}, "seed"),
        ({"step_ms": 1e9}, "step_ms"),
    ],
)
def test_it_refuses_parameters_that_would_overwhelm_the_machine_running_the_job(
    catalogue: Any, alice: Any, client_for: Any, params: dict[str, Any], named: str
) -> None:
    body = job_body(workload={"template": "mlp_numpy", "params": params})
    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400
    assert named in str(response.json()["workload"]) and "at most" in str(response.json())
    assert not Job.objects.exists()


@pytest.mark.parametrize("field", ["nodes", "gpus_per_node", "total_steps"])
def test_it_refuses_a_gang_or_a_length_no_fleet_could_hold(
    catalogue: Any, alice: Any, client_for: Any, field: str
) -> None:
    response = client_for(alice).post("/api/jobs/", job_body(**{field: 10**12}), format="json")

    assert response.status_code == 400
    assert field in response.json()

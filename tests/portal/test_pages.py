"""Server-rendered pages: login required, the dashboard, a job's page, the submit form."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobs.models import Job
from tests.conftest import submit

pytestmark = pytest.mark.django_db


def test_pages_need_a_login(client: Any) -> None:
    response = client.get("/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_dashboard_shows_only_the_users_jobs_and_no_pools(
    client: Any, catalogue: Any, alice: Any, bob: Any
) -> None:
    submit(alice, catalogue, name="alices-run")
    submit(bob, catalogue, name="bobs-run")
    client.force_login(alice)

    page = client.get("/").content.decode()

    assert "alices-run" in page and "bobs-run" not in page
    assert "g4dn.xlarge" not in page  # pools are on the fleet page
    assert "<progress" in page


def test_the_dashboard_filters_by_state_and_name(client: Any, catalogue: Any, alice: Any) -> None:
    submit(alice, catalogue, name="first-run")
    cancelled = submit(alice, catalogue, name="second-run")
    Job.objects.filter(pk=cancelled.pk).update(state="cancelled")
    client.force_login(alice)

    def names(query: str) -> set[str]:
        page = client.get("/" + query).content.decode()
        return set(re.findall(r">(\w+-run)</a>", page))

    assert names("") == {"first-run", "second-run"}
    assert names("?state=active") == {"first-run"}
    assert names("?state=cancelled") == {"second-run"}
    assert names("?q=SECOND") == {"second-run"}
    assert "No job matches" in client.get("/?q=nothing").content.decode()


def test_the_dashboard_costs_a_fixed_number_of_queries(
    client: Any, catalogue: Any, alice: Any, django_assert_max_num_queries: Any
) -> None:
    for n in range(20):
        submit(alice, catalogue, name=f"j{n}")
    client.force_login(alice)

    with django_assert_max_num_queries(8):
        client.get("/")


def test_a_job_page_is_404_for_a_stranger(
    client: Any, catalogue: Any, alice: Any, bob: Any
) -> None:
    job = submit(alice, catalogue)
    client.force_login(bob)

    assert client.get(f"/jobs/{job.pk}/").status_code == 404


def test_the_form_submits_a_job_and_shows_its_page(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)
    form = {
        "name": "from-form",
        "workload_kind": "template",
        "template": "mlp_numpy",
        "param-mlp_numpy-seed": "3",
        "param-mlp_numpy-lr": "0.1",
        "param-lora_sim-base_mb": "12",
        "accelerator": "T4",
        "gpus_per_node": "1",
        "nodes": "1",
        "total_steps": "50",
        "tolerance": "aggressive",
        "allow_on_demand_fallback": "on",
    }

    response = client.post("/jobs/new/", form)

    job = Job.objects.get(name="from-form")
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    # Only the chosen template's parameters, as numbers.
    assert job.workload == {"template": "mlp_numpy", "params": {"seed": 3, "lr": 0.1}}
    assert job.tolerance == "aggressive" and job.allow_on_demand_fallback
    assert f'data-job="{job.pk}"' in client.get(response["Location"]).content.decode()


def test_the_form_shows_field_errors_and_creates_nothing(
    client: Any, catalogue: Any, alice: Any
) -> None:
    client.force_login(alice)
    form = {
        "template": "mlp_numpy",
        "param-mlp_numpy-seed": "-1",
        "accelerator": "T4",
        "gpus_per_node": "0",
        "nodes": "1",
        "total_steps": "50",
        "tolerance": "balanced",
    }

    page = client.post("/jobs/new/", form).content.decode()

    # Each error next to its own field, a template parameter's too.
    assert re.search(r'id="error-param-mlp_numpy-seed">seed must be at least 0<', page)
    assert re.search(r'id="error-gpus_per_node">[^<]*greater than or equal to 1', page)
    assert not Job.objects.exists()


def test_the_form_offers_a_command_only_to_users_allowed_to_run_one(
    client: Any, catalogue: Any, alice: Any, make_user: Any
) -> None:
    runner = make_user("runner", perms=("jobs.run_command",))
    client.force_login(alice)
    assert 'name="command"' not in client.get("/jobs/new/").content.decode()
    client.force_login(runner)
    form = {
        "workload_kind": "command",
        "command": "python\ntrain.py\n",
        "resume_args": "--resume-from-checkpoint\n{checkpoint_dir}",
        "progress_pattern": r"step (\d+)",
        "accelerator": "T4",
        "total_steps": "10",
        "tolerance": "balanced",
        "deadline": "2099-01-02T03:04",
    }

    assert 'name="command"' in client.get("/jobs/new/").content.decode()
    assert client.post("/jobs/new/", form).status_code == 302
    job = Job.objects.get(project__members=runner)
    assert job.workload == {
        "command": ["python", "train.py"],
        "mode": "directory",
        "resume_args": ["--resume-from-checkpoint", "{checkpoint_dir}"],
        "progress_pattern": r"step (\d+)",
    }
    assert job.deadline is not None
    assert job.deadline.isoformat() == "2099-01-02T03:04:00+00:00"  # read in UTC, as labelled


def test_the_form_explains_each_tolerance_and_labels_every_input(
    client: Any, catalogue: Any, alice: Any
) -> None:
    client.force_login(alice)

    page = client.get("/jobs/new/").content.decode()

    assert "cheapest spot" in page and "0.5 times an hour" in page
    ids = set(re.findall(r'<input id="([^"]+)"', page)) | set(
        re.findall(r'<select id="([^"]+)"', page)
    )
    labelled = set(re.findall(r'<label for="([^"]+)"', page))
    assert ids and ids <= labelled
    assert "Checkpoint gb" not in page


def test_the_estimate_button_works_without_scripts(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)
    form = {"template": "mlp_numpy", "accelerator": "T4", "total_steps": "5000"}

    page = client.post("/jobs/new/", {**form, "action": "estimate"}).content.decode()

    assert 'id="estimate"' in page and "Recommendation" in page
    assert not Job.objects.exists()

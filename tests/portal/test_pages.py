"""Server-rendered pages: login required, the dashboard, a job's page, the submit form."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Job
from tests.conftest import submit

pytestmark = pytest.mark.django_db


def test_pages_need_a_login(client: Any) -> None:
    response = client.get("/")

    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_dashboard_shows_pools_and_only_the_users_jobs(
    client: Any, catalogue: Any, alice: Any, bob: Any
) -> None:
    submit(alice, catalogue, name="alices-run")
    submit(bob, catalogue, name="bobs-run")
    client.force_login(alice)

    page = client.get("/").content.decode()

    assert "alices-run" in page and "bobs-run" not in page
    assert "g4dn.xlarge" in page and "$0.1600" in page and "3 / 3" in page


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
        "template": "mlp_numpy",
        "params": '{"seed": 3}',
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
    assert job.workload == {"template": "mlp_numpy", "params": {"seed": 3}}
    assert job.tolerance == "aggressive" and job.allow_on_demand_fallback
    assert f'data-job="{job.pk}"' in client.get(response["Location"]).content.decode()


def test_the_form_shows_field_errors_and_creates_nothing(
    client: Any, catalogue: Any, alice: Any
) -> None:
    client.force_login(alice)
    form = {
        "template": "mlp_numpy",
        "params": '{"colour": 1}',
        "accelerator": "T4",
        "gpus_per_node": "0",
        "nodes": "1",
        "total_steps": "50",
        "tolerance": "balanced",
    }

    page = client.post("/jobs/new/", form).content.decode()

    assert "colour" in page and "greater than or equal to 1" in page
    assert not Job.objects.exists()

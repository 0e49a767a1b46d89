"""`POST /api/estimates/` and the estimate every submitted job stores."""

from __future__ import annotations

from typing import Any

import pytest

from migration.models import CapacityPool
from tests.conftest import job_body

pytestmark = pytest.mark.django_db

SIDE_FIELDS = {
    "expected_cost",
    "expected_hours",
    "p90_hours",
    "expected_interruptions",
    "expected_lost_hours",
}


def test_an_estimate_compares_spot_and_on_demand_without_saving_a_job(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    from jobs.models import Job

    response = client_for(alice).post(
        "/api/estimates/", job_body(accelerator="V100-16GB", expected_hours=10.0), format="json"
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert set(body["spot"]) >= SIDE_FIELDS and set(body["on_demand"]) >= SIDE_FIELDS
    assert body["recommendation"] in ("spot", "on_demand")
    assert body["checkpoint_interval_s"] > 0 and body["reasons"]
    assert body["on_demand"]["expected_cost"] == pytest.approx(3.06 * (10.0 + 0.1), rel=0.01)
    assert not Job.objects.exists()


def test_the_estimate_uses_the_pools_price_and_interruption_rate(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    client = client_for(alice)
    body = job_body(accelerator="V100-16GB", expected_hours=10.0)
    calm = client.post("/api/estimates/", body, format="json").json()
    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=2.0)
    stormy = client.post("/api/estimates/", body, format="json").json()

    assert stormy["spot"]["expected_interruptions"] > calm["spot"]["expected_interruptions"]
    assert stormy["spot"]["expected_cost"] > calm["spot"]["expected_cost"]
    assert stormy["on_demand"]["expected_cost"] == calm["on_demand"]["expected_cost"]


def test_a_gang_costs_every_node(catalogue: Any, alice: Any, client_for: Any) -> None:
    client = client_for(alice)
    one = client.post("/api/estimates/", job_body(expected_hours=5.0), format="json").json()
    two = client.post(
        "/api/estimates/", job_body(expected_hours=5.0, nodes=2), format="json"
    ).json()

    assert two["on_demand"]["expected_cost"] == pytest.approx(2 * one["on_demand"]["expected_cost"])


def test_an_invalid_body_gets_the_same_field_errors_as_a_submission(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    response = client_for(alice).post("/api/estimates/", job_body(nodes=0), format="json")

    assert response.status_code == 400 and "nodes" in response.json()


def test_a_job_no_pool_can_run_gets_a_conflict(catalogue: Any, alice: Any, client_for: Any) -> None:
    response = client_for(alice).post(
        "/api/estimates/", job_body(accelerator="V100-32GB"), format="json"
    )

    assert response.status_code == 409 and "no spot or on-demand pool" in response.json()["detail"]


def test_a_submitted_job_stores_its_estimate(catalogue: Any, alice: Any, client_for: Any) -> None:
    job = client_for(alice).post("/api/jobs/", job_body(expected_hours=3.0), format="json").json()

    assert job["estimate"]["recommendation"] in ("spot", "on_demand")
    assert set(job["estimate"]["spot"]) >= SIDE_FIELDS


def test_estimates_need_a_login(catalogue: Any, client: Any) -> None:
    response = client.post("/api/estimates/", job_body(), content_type="application/json")

    assert response.status_code in (401, 403)

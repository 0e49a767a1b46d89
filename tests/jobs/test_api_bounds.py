"""Numbers that drive work are bounded, and bodies the parser cannot take are 400s naming the
problem, never 500s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs.models import Job
from tests.conftest import job_body

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checkpoint_gb", 1e308),
        ("expected_hours", 1e9),
        ("checkpoint_every_steps", 10**12),
        ("checkpoint_every_seconds", 10**12),
        ("max_interruptions", 10**12),
        ("max_wait_s", 10**12),
        ("nodes", 10**6),
        ("gpus_per_node", 10**6),
        ("total_steps", 2**63 - 1),
    ],
)
@pytest.mark.parametrize("endpoint", ["/api/jobs/", "/api/estimates/"])
def test_a_number_beyond_its_bound_is_a_field_error(
    catalogue: Any, alice: Any, client_for: Any, endpoint: str, field: str, value: float
) -> None:
    response = client_for(alice).post(endpoint, job_body(**{field: value}), format="json")

    assert response.status_code == 400
    assert field in response.json()
    assert not Job.objects.exists()


@pytest.mark.parametrize("param", [("state_mb", 1e308), ("step_ms", 1e308), ("seed", 10**30)])
def test_a_template_parameter_beyond_its_bound_is_a_workload_error(
    catalogue: Any, alice: Any, client_for: Any, param: tuple[str, float]
) -> None:
    body = job_body(workload={"template": "mlp_numpy", "params": dict([param])})

    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400 and param[0] in str(response.json()["workload"])


def test_a_deeply_nested_body_is_a_400(catalogue: Any, alice: Any, client_for: Any) -> None:
    deep = "[" * 2000 + "]" * 2000
    body = json.dumps(job_body()).replace('"params": {"seed": 1}', f'"params": {deep}')

    response = client_for(alice).post("/api/jobs/", body, content_type="application/json")

    assert response.status_code == 400 and "nested" in response.json()["detail"]


def test_a_body_nested_just_deeper_than_any_request_needs_is_a_400(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    body = job_body(workload={"template": "mlp_numpy", "params": {"seed": [[[[[[[[]]]]]]]]}})
    nested: Any = []
    for _ in range(40):
        nested = [nested]
    body["name"] = nested

    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400


def test_an_oversized_body_is_a_400(catalogue: Any, alice: Any, client_for: Any) -> None:
    body = job_body(name="x" * 3_000_000)

    response = client_for(alice).post("/api/jobs/", body, format="json")

    assert response.status_code == 400


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(
    catalogue: Any, alice: Any, client_for: Any, literal: str
) -> None:
    body = json.dumps(job_body()).replace('"total_steps": 200', f'"checkpoint_gb": {literal}')

    response = client_for(alice).post("/api/estimates/", body, content_type="application/json")

    assert response.status_code == 400


def test_the_form_answers_a_garbage_parameter_field_with_an_error(
    catalogue: Any, alice: Any, client: Any
) -> None:
    # The form has a field per template parameter (no JSON to parse): garbage in one is an
    # error beside it, never a 500 or a job.
    client.force_login(alice)

    response = client.post(
        "/jobs/new/",
        {
            "name": "deep",
            "template": "mlp_numpy",
            "param-mlp_numpy-seed": "[" * 5000 + "]" * 5000,
            "accelerator": "T4",
            "total_steps": "100",
            "tolerance": "balanced",
        },
    )

    assert response.status_code == 200 and not Job.objects.exists()
    assert "seed must be a number" in response.content.decode()

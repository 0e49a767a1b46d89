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


def test_a_t4_estimate_names_where_its_interruption_rate_comes_from(
    catalogue: Any, alice: Any, client_for: Any, tmp_path: Any
) -> None:
    import json

    from costs.services import import_spot_traces

    folder = tmp_path / "aws-02-15-2023"
    folder.mkdir()
    # V100 history in the T4 pools' region: hourly ticks, interrupted every fourth hour.
    (folder / "us-east-1a_v100_1.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 3600}, "data": [0, 0, 0, 1] * 30})
    )
    import_spot_traces(folder)

    body = client_for(alice).post("/api/estimates/", job_body(), format="json").json()

    assert body["interruption_rate_source"] == "borrowed"
    assert body["interruption_rate_borrowed_from"] == ["V100-16GB in us-east-1"]
    assert body["interruption_rate_per_hour"] == pytest.approx(1 / 3, abs=1e-3)
    assert "borrowed from V100-16GB in us-east-1" in " ".join(body["reasons"])


def test_without_any_history_the_estimate_says_its_rate_is_the_default(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    from costs.services import refresh_pool_figures

    refresh_pool_figures()
    body = client_for(alice).post("/api/estimates/", job_body(), format="json").json()

    assert body["interruption_rate_source"] == "default"
    assert "a guess, not a measurement" in " ".join(body["reasons"])


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"expected_hours": 1e308}, "expected_hours"),
        ({"expected_hours": 9000}, "expected_hours"),
        ({"checkpoint_gb": 1e308}, "checkpoint_gb"),
        ({"workload": {"template": "mlp_numpy", "params": {"step_ms": 1e308}}}, None),
    ],
)
def test_inputs_that_would_not_end_or_not_be_finite_get_a_400_naming_the_field(
    catalogue: Any, alice: Any, client_for: Any, overrides: dict[str, Any], field: str | None
) -> None:
    import time

    began = time.perf_counter()
    response = client_for(alice).post("/api/estimates/", job_body(**overrides), format="json")

    assert time.perf_counter() - began < 2.0
    assert response.status_code == 400, response.content
    if field is not None:
        assert field in response.json()


@pytest.mark.parametrize("number", ["1e999", "NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_in_the_body_get_a_400(
    catalogue: Any, alice: Any, client_for: Any, number: str
) -> None:
    import json

    text = json.dumps(job_body()).replace('"nodes": 1', f'"expected_hours": {number}, "nodes": 1')
    response = client_for(alice).post("/api/estimates/", text, content_type="application/json")

    assert response.status_code == 400, response.content


def test_the_biggest_estimate_it_takes_answers_within_two_seconds(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    import time

    # About 2,000 simulated interruptions: just under the bound.
    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=0.25)
    body = job_body(expected_hours=8000, nodes=1, total_steps=10**9)
    began = time.perf_counter()
    response = client_for(alice).post("/api/estimates/", body, format="json")

    assert time.perf_counter() - began < 2.0
    assert response.status_code == 200, response.content
    refused = client_for(alice).post("/api/estimates/", {**body, "nodes": 2}, format="json")
    assert refused.status_code == 400
    assert "interruptions to simulate" in refused.json()["expected_hours"][0]


def test_with_the_market_simulator_on_the_estimate_runs_on_its_clock(
    catalogue: Any, alice: Any, client_for: Any, settings: Any
) -> None:
    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=0.5)
    client = client_for(alice)
    body = job_body(expected_hours=0.1)
    real = client.post("/api/estimates/", body, format="json").json()
    settings.BATON_MARKET_TIME_SCALE = 60.0
    fast = client.post("/api/estimates/", body, format="json").json()

    assert real["interruption_rate_per_hour"] == 0.5
    assert fast["interruption_rate_per_hour"] == 30.0
    assert fast["spot"]["expected_interruptions"] > 10 * real["spot"]["expected_interruptions"]
    assert any("60 times faster than the clock" in reason for reason in fast["reasons"])


def test_an_estimate_waits_for_spot_only_while_every_candidate_pool_is_away(
    catalogue: Any, alice: Any, client_for: Any, tmp_path: Any
) -> None:
    import json

    from costs.services import candidate_outage, import_spot_traces

    # Two V100 spot pools of us-east-1, in the zones of two traces of one dataset (recorded
    # side by side): hourly ticks, each zone away 4 h in every 12, the second 2 h after the
    # first. An interrupted job moves to the other pool, so it waits only while both are away.
    first = catalogue["pools"]["v100_spot"]
    first.zone = "us-east-1a"
    first.save()
    second = CapacityPool.objects.create(
        region=first.region,
        zone="us-east-1c",
        instance_type="p3.2xlarge",
        accelerator=first.accelerator,
        gpus_per_instance=1,
        market="spot",
        price_per_hour=first.price_per_hour,
        capacity=1,
    )
    folder = tmp_path / "aws-02-15-2023"
    folder.mkdir()
    pattern = ([0] * 8 + [1] * 4) * 20
    for zone, data in (("us-east-1a", pattern), ("us-east-1c", pattern[-2:] + pattern[:-2])):
        (folder / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 3600}, "data": data})
        )
    import_spot_traces(folder)

    alone = candidate_outage([first.pk])
    both = candidate_outage([first.pk, second.pk])
    assert alone is not None and both is not None
    # Alone, every interruption waits out the zone's 4 h outage; with both, half of them find
    # the other zone up and the rest wait the 2 h the zones share.
    assert (alone[0], alone[2]) == (pytest.approx(4.0), 1)
    assert (both[0], both[2]) == (pytest.approx(1.0, abs=0.05), 2)

    body = job_body(accelerator="V100-16GB")
    answer = client_for(alice).post("/api/estimates/", body, format="json").json()
    reasons = " ".join(answer["reasons"])
    assert "any of 2 spot pools" in reasons
    assert "waited 1.0 h for spot on average" in reasons
    assert answer["interruption_rate_source"] == "history"

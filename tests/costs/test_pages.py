"""The costs page and the estimate before launch in the job form."""

from __future__ import annotations

import json
from typing import Any

import pytest

from costs import charts
from costs.estimator import EstimateInput, estimate
from jobs.models import Job
from tests.conftest import remote_assets

pytestmark = pytest.mark.django_db


def figures(page: str) -> dict[str, Any]:
    """The figures a page embeds with json_script, by name."""
    found = {}
    for name in ("prices", "rates", "interval", "completion"):
        marker = f'<script id="{name}" type="application/json">'
        if marker in page:
            found[name] = json.loads(page.split(marker, 1)[1].split("</script>", 1)[0])
    return found


def test_the_costs_page_draws_four_charts_for_an_accelerator(
    client: Any, catalogue: Any, alice: Any
) -> None:
    from costs.models import PriceSample

    pool = catalogue["pools"]["v100_spot"]
    PriceSample.objects.create(pool=pool, at="2022-05-31T10:00:00Z", price="0.9")
    PriceSample.objects.create(pool=pool, at="2022-05-31T12:00:00Z", price="0.95")
    client.force_login(alice)

    page = client.get(
        "/costs/?accelerator=V100-16GB&nodes=1&work_hours=24&checkpoint_gb=5&tolerance=balanced"
    ).content.decode()

    found = figures(page)
    assert set(found) == {"prices", "rates", "interval", "completion"}
    assert found["prices"]["data"][0]["y"] == [0.9, 0.95]
    assert found["rates"]["data"][0]["x"] == ["p3.2xlarge use1-az1"]
    assert "/static/plotly/plotly.min.js" in page and remote_assets(page) == []
    assert 'id="estimate"' in page


def test_plotly_is_served_from_static(client: Any, alice: Any) -> None:
    client.force_login(alice)

    response = client.get("/static/plotly/plotly.min.js")

    assert response.status_code == 200


def test_the_costs_page_names_a_bad_input(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)

    page = client.get(
        "/costs/?accelerator=V100-16GB&nodes=0&work_hours=24&checkpoint_gb=5&tolerance=balanced"
    ).content.decode()

    assert "greater than or equal to 1" in page and not figures(page)


def test_the_job_form_estimates_before_launching_and_saves_nothing(
    client: Any, catalogue: Any, alice: Any
) -> None:
    client.force_login(alice)
    form = {
        "template": "mlp_numpy",
        "accelerator": "V100-16GB",
        "gpus_per_node": "1",
        "nodes": "1",
        "total_steps": "100000",
        "tolerance": "balanced",
        "allow_on_demand_fallback": "on",
        "action": "estimate",
    }

    page = client.post("/jobs/new/", form).content.decode()

    assert 'id="estimate"' in page and "Recommendation" in page
    assert not Job.objects.exists()


def test_expected_cost_falls_then_rises_around_the_recommended_interval() -> None:
    inp = EstimateInput(
        work_hours=24,
        spot_price_per_hour=1.0,
        on_demand_price_per_hour=3.0,
        interruption_rate_per_hour=1.0,
        checkpoint_gb=50,
        notice_seconds=10,
    )

    recommended = estimate(inp).checkpoint_interval_s
    figure = charts.cost_against_interval(inp, recommended)

    minutes, costs = figure["data"][0]["x"], figure["data"][0]["y"]
    best = figure["data"][1]["y"][0]
    assert costs[0] > best and costs[-1] > best  # too often and too rarely both cost more
    # The star is the lowest point of the curve drawn, not a formula's guess beside it.
    assert best == pytest.approx(min(costs))
    assert minutes[costs.index(min(costs))] == pytest.approx(recommended / 60)


def test_the_page_recommends_the_interval_its_curve_is_lowest_at(
    client: Any, catalogue: Any, alice: Any
) -> None:
    client.force_login(alice)

    page = client.get(
        "/costs/?accelerator=V100-16GB&nodes=1&work_hours=48&checkpoint_gb=10&tolerance=balanced"
    ).content.decode()

    curve = figures(page)["interval"]["data"][0]
    lowest = curve["x"][curve["y"].index(min(curve["y"]))]
    assert f"checkpoint every {round(lowest * 60)} s" in page


def test_a_costs_page_too_big_to_compute_says_why(client: Any, catalogue: Any, alice: Any) -> None:
    from migration.models import CapacityPool

    CapacityPool.objects.filter(market="spot").update(interruption_rate_per_hour=5.0)
    client.force_login(alice)

    page = client.get(
        "/costs/?accelerator=V100-16GB&nodes=64&work_hours=8000&checkpoint_gb=5"
        "&tolerance=aggressive"
    ).content.decode()

    assert "interruptions to simulate" in page and "interval" not in figures(page)

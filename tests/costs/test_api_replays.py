"""`POST /api/replays/` and the what-if replay page."""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from costs.services import import_spot_traces

pytestmark = pytest.mark.django_db

# Hourly ticks: spot for two hours, away for two, then back (the hand-worked trace of
# tests/costs/test_replay.py).
HAND_WORKED = {"metadata": {"gap_seconds": 3600}, "data": [0, 0, 1, 1, 0, 0, 0, 0]}


def _body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "trace_data": HAND_WORKED,
        "task_hours": 4,
        "deadline_hours": 8,
        "restart_overhead_hours": 1,
        "tolerance": "balanced",
        "spot_price": 1,
        "on_demand_price": 3,
    }
    body.update(overrides)
    return body


def _stored(tmp_path: Path, name: str, data: list[int], gap: int = 3600) -> None:
    folder = tmp_path / "aws-02-15-2023"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(
        json.dumps({"metadata": {"gap_seconds": gap}, "data": data})
    )
    import_spot_traces(folder)


def test_an_uploaded_trace_is_replayed_against_the_three_references(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    response = client_for(alice).post("/api/replays/", _body(), format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    # The answers worked by hand in tests/costs/test_replay.py.
    assert body["on_demand"]["cost"] == pytest.approx(15)
    assert body["greedy"]["cost"] == pytest.approx(14)
    assert body["optimal"]["cost"] == pytest.approx(6)
    assert body["regret"] == pytest.approx(body["policy"]["cost"] - 6)
    assert body["regret_vs_greedy"] == pytest.approx(body["policy"]["cost"] - 14)
    assert body["spot_unavailable"] == [[2, 4]]
    for plan in ("policy", "greedy"):
        segments = body["decisions"][plan]
        assert segments[0]["start_hours"] == 0
        assert {s["state"] for s in segments} <= {"spot", "on_demand", "waiting"}
        assert all(a["end_hours"] == b["start_hours"] for a, b in pairwise(segments))
    assert body["preemptions_at_hours"]["greedy"] == [2]
    assert body["trace"]["name"] == "uploaded" and body["trace"]["ticks_merged"] == 1


def test_a_stored_trace_is_replayed_by_name_and_a_gang_needs_enough_nodes(
    catalogue: Any, alice: Any, client_for: Any, tmp_path: Path
) -> None:
    _stored(tmp_path, "us-east-1a_v100_4", [0, 0, 1, 1, 3, 3, 0, 0, 0, 0])
    client = client_for(alice)
    name = "aws-02-15-2023/us-east-1a_v100_4"
    common = {"trace": name, "task_hours": 5, "deadline_hours": 10, "restart_overhead_hours": 0}

    one = client.post("/api/replays/", {**common, "tolerance": "aggressive"}, format="json")
    two = client.post(
        "/api/replays/", {**common, "tolerance": "aggressive", "nodes": 2}, format="json"
    )
    five = client.post("/api/replays/", {**common, "nodes": 5}, format="json")

    assert one.status_code == 200, one.content
    assert one.json()["policy"]["preemptions"] == 0
    assert two.json()["policy"]["preemptions"] == 1
    assert two.json()["spot_unavailable"] == [[4, 6]]
    assert five.status_code == 400 and "follows 4 node" in five.json()["nodes"][0]


def test_a_pools_own_history_is_replayed_with_the_pools_prices(
    catalogue: Any, alice: Any, client_for: Any, tmp_path: Path
) -> None:
    _stored(tmp_path, "us-east-1a_v100_1", [0, 0, 0, 1] * 30)
    t4 = catalogue["pools"]["t4_spot"]

    body = (
        client_for(alice)
        .post(
            "/api/replays/", {"pool": t4.pk, "task_hours": 10, "deadline_hours": 20}, format="json"
        )
        .json()
    )

    # A T4 pool borrows its history from the region's V100s; its most recent 20 h are replayed.
    assert body["trace"]["name"] == "aws-02-15-2023/us-east-1a_v100_1"
    assert body["trace"]["window_start_hours"] == 100
    assert body["job"]["spot_price"] == pytest.approx(float(t4.price_per_hour))
    assert body["job"]["on_demand_price"] == pytest.approx(0.526)
    assert body["interruption_rate_per_hour"] == pytest.approx(1 / 3, abs=1e-3)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"task_hours": "NaN"}, "task_hours"),
        ({"deadline_hours": 1e308}, "deadline_hours"),
        ({"spot_price": "Infinity"}, "spot_price"),
        ({"deadline_hours": 2}, "deadline_hours"),
        ({"trace_data": None, "trace": "nowhere/nothing"}, "trace"),
        ({"trace_data": {"metadata": {"gap_seconds": 60}, "data": [0, "x"]}}, "trace_data"),
        ({"trace_data": {"metadata": {"gap_seconds": 60}, "data": [0] * 100_001}}, "trace_data"),
        ({"start_hours": 100}, "start_hours"),
        ({"tolerance": "reckless"}, "tolerance"),
        ({"nodes": 0}, "nodes"),
    ],
)
def test_bad_input_gets_a_400_naming_the_field(
    catalogue: Any, alice: Any, client_for: Any, overrides: dict[str, Any], field: str
) -> None:
    body = {k: v for k, v in _body(**overrides).items() if v is not None}

    response = client_for(alice).post("/api/replays/", body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_nothing_to_replay_is_a_400(catalogue: Any, alice: Any, client_for: Any) -> None:
    body = {k: v for k, v in _body().items() if k != "trace_data"}

    response = client_for(alice).post("/api/replays/", body, format="json")

    assert response.status_code == 400 and "trace" in response.json()


def test_a_long_deadline_on_a_fine_trace_is_coarsened_and_answers_quickly(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    # A month of 32-second ticks, preempted every few hours; 200 h of work in 700 h.
    data = ([0] * 900 + [1] * 60) * 85
    fine = {"metadata": {"gap_seconds": 32}, "data": data}
    began = time.perf_counter()
    response = client_for(alice).post(
        "/api/replays/",
        _body(trace_data=fine, task_hours=200, deadline_hours=700, restart_overhead_hours=0.1),
        format="json",
    )

    assert time.perf_counter() - began < 2.0
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["trace"]["ticks_merged"] > 1
    assert body["policy"]["deadline_met"] and body["optimal"]["cost"] <= body["policy"]["cost"]


def test_replays_need_a_login(client: Any) -> None:
    response = client.post("/api/replays/", _body(), content_type="application/json")

    assert response.status_code in (401, 403)


def test_the_replay_page_draws_the_decisions_and_the_regret(
    client: Any, catalogue: Any, alice: Any, tmp_path: Path
) -> None:
    _stored(tmp_path, "us-east-1a_v100_1", [0, 0, 0, 1] * 30)
    client.force_login(alice)

    page = client.get(
        "/costs/replay/?trace=aws-02-15-2023/us-east-1a_v100_1&task_hours=10&deadline_hours=20"
        "&tolerance=balanced&nodes=1&start_hours=24"
    ).content.decode()

    assert 'id="replay"' in page and "Regret: $" in page
    marker = '<script id="decisions" type="application/json">'
    figure = json.loads(page.split(marker, 1)[1].split("</script>", 1)[0])
    names = {trace["name"] for trace in figure["data"]}
    assert "unavailable" in names and names & {"spot", "on-demand", "waiting"}


def test_the_replay_page_names_a_bad_input(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)

    page = client.get(
        "/costs/replay/?task_hours=10&deadline_hours=5&tolerance=balanced&nodes=1"
    ).content.decode()

    assert "Choose a trace or a spot pool." in page and 'id="replay"' not in page

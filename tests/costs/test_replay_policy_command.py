"""`manage.py replay_policy`: arguments, the JSON object and the errors."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command


def _trace(tmp_path: Path, values: list[int], gap: int = 3600) -> Path:
    path = tmp_path / "us-east-1c_v100_1.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": values}))
    return path


def _run(*args: str) -> str:
    out = StringIO()
    call_command("replay_policy", *args, stdout=out)
    return out.getvalue()


def _args(trace: Path, task: str, deadline: str, restart: str, policy: str) -> list[str]:
    return [
        *("--trace", str(trace), "--task-hours", task, "--deadline-hours", deadline),
        *("--restart-overhead-hours", restart, "--policy", policy),
    ]


def test_json_output_has_the_policy_and_the_three_references(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [0, 0, 1, 1, 0, 0, 0, 0])
    prices = ["--spot-price", "1", "--on-demand-price", "3"]
    out = _run(*_args(trace, "4", "8", "1", "balanced"), *prices, "--json")
    payload = json.loads(out)
    assert set(payload) == {"policy", "on_demand", "greedy", "optimal"}
    for plan in payload.values():
        assert {"cost", "finish_hours", "deadline_met", "preemptions"} <= set(plan)
    # The hand-worked answers of tests/costs/test_replay.py.
    assert payload["on_demand"]["cost"] == pytest.approx(15)
    assert payload["greedy"]["cost"] == pytest.approx(14)
    assert payload["optimal"]["cost"] == pytest.approx(6)
    assert payload["optimal"]["deadline_met"] is True


def test_prices_default_to_the_shared_v100_prices(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [0] * 10)
    payload = json.loads(_run(*_args(trace, "2", "9", "0", "aggressive"), "--json"))
    assert payload["on_demand"]["cost"] == pytest.approx(2 * 3.06)
    assert payload["policy"]["cost"] == pytest.approx(2 * 0.918)


def test_without_json_it_prints_a_readable_table(tmp_path: Path) -> None:
    trace = _trace(tmp_path, [0, 1, 0, 0])
    out = _run(*_args(trace, "2", "4", "0.5", "conservative"))
    for label in ("policy (conservative)", "always on-demand", "greedy", "omniscient optimum"):
        assert label in out


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--trace": "missing.json"}, "no such file"),
        ({"--task-hours": "-1"}, "--task-hours must be positive"),
        ({"--deadline-hours": "0"}, "--deadline-hours must be positive"),
        ({"--restart-overhead-hours": "-0.1"}, "--restart-overhead-hours must be not negative"),
        ({"--policy": "reckless"}, "--policy must be one of"),
        ({"--spot-price": "nan"}, "--spot-price must be a finite number"),
    ],
)
def test_bad_arguments_give_a_command_error_naming_the_problem(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    args = {
        "--trace": str(_trace(tmp_path, [0, 0, 0])),
        "--task-hours": "1",
        "--deadline-hours": "3",
        "--restart-overhead-hours": "0.1",
        "--policy": "balanced",
    }
    args.update(change)
    if change.get("--trace") == "missing.json":
        args["--trace"] = str(tmp_path / "missing.json")
    with pytest.raises(CommandError, match=message):
        _run(*[item for pair in args.items() for item in pair])


def test_a_malformed_trace_gives_a_command_error(tmp_path: Path) -> None:
    path = tmp_path / "us-east-1c_v100_1.json"
    path.write_text("{not json")
    with pytest.raises(CommandError, match="cannot read"):
        _run(*_args(path, "1", "3", "0.1", "balanced"))


SHARED = Path(__file__).resolve().parents[2] / "data" / "spot-traces"


@pytest.mark.parametrize("trace", sorted(SHARED.rglob("*.json")), ids=lambda p: p.stem)
def test_it_answers_for_every_shared_trace(trace: Path) -> None:
    payload = json.loads(_run(*_args(trace, "4", "6", "0.1", "balanced"), "--json"))
    assert payload["policy"]["deadline_met"] and payload["optimal"]["deadline_met"]
    assert payload["optimal"]["cost"] <= payload["policy"]["cost"] + 1e-9


def test_it_answers_for_a_gcp_trace_and_a_name_of_ones_own(tmp_path: Path) -> None:
    for name in ("us-central1-a_c3-88", "our cluster"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [0, 1, 0] * 40}))
        payload = json.loads(_run(*_args(path, "2", "8", "0.1", "aggressive"), "--json"))
        assert payload["policy"]["deadline_met"]
        assert payload["policy"]["preemptions"] > 0


def test_a_gang_replays_a_multi_node_trace_with_enough_nodes_only(tmp_path: Path) -> None:
    path = tmp_path / "us-east-1a_v100_4.json"
    # Hourly ticks: one node lost for hours 2-3, three for hours 4-5.
    data = [0, 0, 1, 1, 3, 3, 0, 0, 0, 0]
    path.write_text(json.dumps({"metadata": {"gap_seconds": 3600}, "data": data}))
    prices = ["--spot-price", "1", "--on-demand-price", "3"]
    one = json.loads(_run(*_args(path, "5", "10", "0", "aggressive"), *prices, "--json"))
    two = json.loads(
        _run(*_args(path, "5", "10", "0", "aggressive"), *prices, "--nodes", "2", "--json")
    )
    assert one["policy"]["preemptions"] == 0 and one["policy"]["finish_hours"] == 5
    # Two nodes are lost with the fifth hour: the gang waits two hours for them.
    assert two["policy"]["preemptions"] == 1 and two["policy"]["finish_hours"] == 7
    with pytest.raises(CommandError, match="--nodes: trace 'us-east-1a_v100_4' follows 4 node"):
        _run(*_args(path, "5", "10", "0", "aggressive"), "--nodes", "5")


def test_a_trace_with_a_bad_value_names_it(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [0, 1, "down"]}))
    with pytest.raises(CommandError, match="value 'down' at tick 2"):
        _run(*_args(path, "1", "3", "0.1", "balanced"))

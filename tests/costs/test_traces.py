"""Trace loading and interruption statistics, on hand-made traces and the shared data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from costs.traces import (
    availability_stats,
    interruption_waits,
    joint_availability,
    load_trace,
    load_traces,
    mean_time_between_interruptions_hours,
    parse_trace_name,
    pooled_stats,
    preemption_count,
    preemptions_per_hour,
    scale_trace,
    window,
    windows,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "spot-traces"


def _write(
    tmp_path: Path,
    name: str,
    data: list[int],
    gap: int = 3600,
    metadata_nodes: int | None = None,
    **extra: object,
) -> Path:
    path = tmp_path / f"{name}.json"
    metadata: dict[str, object] = {"gap_seconds": gap}
    if metadata_nodes is not None:
        metadata["nodes"] = metadata_nodes
    path.write_text(json.dumps({"metadata": metadata, "data": data, **extra}))
    return path


def test_it_reads_region_zone_and_accelerator_from_the_file_name(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-east-1c_v100_1", [0, 1, 0]))
    assert (trace.region, trace.zone, trace.accelerator, trace.nodes) == (
        "us-east-1",
        "us-east-1c",
        "V100-16GB",
        1,
    )
    assert trace.gap_seconds == 3600
    assert trace.unavailable.tolist() == [False, True, False]
    assert trace.prices is None


def test_it_rejects_a_name_without_a_zone() -> None:
    with pytest.raises(ValueError, match="not like"):
        parse_trace_name("somewhere_v100")


def test_it_rejects_more_unavailable_nodes_than_the_trace_follows(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="value 2 at tick 1 is more than the trace's 1 node"):
        load_trace(_write(tmp_path, "us-east-1c_v100_1", [0, 2]))


def test_a_gcp_name_gives_region_zone_and_card(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-central1-a_c3-88", [0, 1, 0]))
    assert (trace.region, trace.zone, trace.accelerator, trace.nodes) == (
        "us-central1",
        "us-central1-a",
        "C3-88",
        1,
    )
    assert parse_trace_name("europe-west4-b_t4_2") == ("europe-west4", "europe-west4-b", "T4", 2)


def test_a_name_of_the_users_own_loads_without_a_place(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "my cluster, March", [0, 0, 1]))
    assert (trace.region, trace.zone, trace.accelerator) == (None, None, None)
    assert trace.label == "my cluster, March" and trace.unavailable.tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("[0, 1]", "not a JSON object"),
        ('{"data": [0]}', "lacks a numeric metadata.gap_seconds"),
        ('{"metadata": {"gap_seconds": 0}, "data": [0]}', "not a positive number"),
        ('{"metadata": {"gap_seconds": 60}, "data": []}', "data is empty"),
        ('{"metadata": {"gap_seconds": 60}, "data": [0, "x"]}', "'x' at tick 1"),
        ('{"metadata": {"gap_seconds": 60}, "data": [0, -1]}', "-1 at tick 1"),
        ('{"metadata": {"gap_seconds": 60}, "data": [0.5]}', "0.5 at tick 0"),
        ('{"metadata": {"gap_seconds": 60}, "data": [[0], [1]]}', "at tick 0"),
        ("not json", "is not JSON"),
    ],
)
def test_a_malformed_file_gets_one_line_naming_the_problem(
    tmp_path: Path, body: str, problem: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=problem) as caught:
        load_trace(path)
    assert "\n" not in str(caught.value)


def test_a_multi_node_trace_gives_a_gang_spot_only_while_enough_nodes_can_be_had(
    tmp_path: Path,
) -> None:
    # Four nodes; how many could not be had per tick.
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_4", [0, 1, 3, 4, 2, 0]))
    assert trace.nodes == 4
    assert trace.for_job(1).unavailable.tolist() == [0, 0, 0, 1, 0, 0]
    assert trace.for_job(2).unavailable.tolist() == [0, 0, 1, 1, 0, 0]
    assert trace.for_job(4).unavailable.tolist() == [0, 1, 1, 1, 1, 0]
    assert trace.unavailable.tolist() == trace.for_job(1).unavailable.tolist()
    with pytest.raises(ValueError, match="follows 4 node"):
        trace.for_job(5)
    assert window(trace, 1, 2).for_job(2).unavailable.tolist() == [False, True]


def test_a_wide_trace_counts_every_node_lost_per_instance_hour(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "wide", [0, 2, 0, 1, 0], gap=3600))
    assert trace.nodes == 2  # the largest value, for a name that does not say
    nodes = trace.node_traces()
    assert [preemption_count(t) for t in nodes] == [2, 1]
    pooled = pooled_stats(nodes)
    assert pooled is not None
    assert pooled.interruptions == 3
    # 3 nodes lost in 7 node-hours held
    assert pooled.interruption_rate_per_hour == pytest.approx(3 / 7)


def test_metadata_may_name_the_nodes(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "wide", [0, 1], metadata_nodes=8))
    assert trace.nodes == 8 and not trace.unavailable.any()


def test_it_keeps_prices_when_the_file_has_them(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-west-2b_v100_1", [0, 0], prices=[0.918, 0.918]))
    assert trace.mean_price() == pytest.approx(0.918)


def test_preemptions_per_hour_counts_transitions_per_hour_of_availability(tmp_path: Path) -> None:
    # Hourly ticks: available 4 h, preempted, available 2 h, preempted twice in a row.
    # Two available -> unavailable transitions over 6 available hours.
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_1", [0, 0, 0, 0, 1, 0, 0, 1, 1]))
    assert preemption_count(trace) == 2
    assert preemptions_per_hour(trace) == pytest.approx(2 / 6)
    assert mean_time_between_interruptions_hours(trace) == pytest.approx(3.0)


def test_a_trace_never_interrupted_has_an_infinite_mean_time_between_interruptions(
    tmp_path: Path,
) -> None:
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_1", [1, 0, 0, 0]))
    assert preemptions_per_hour(trace) == 0.0
    assert math.isinf(mean_time_between_interruptions_hours(trace))


def test_windows_cover_the_trace_in_steps(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_1", list(range(2)) * 5))
    parts = list(windows(trace, hours=4, step_hours=2))
    assert [p.ticks for p in parts] == [4, 4, 4, 4]
    assert window(trace, 2, 3).unavailable.tolist() == [False, True, False]


def test_scaling_stretches_the_clock_and_divides_the_rate(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_1", [0, 0, 1, 0]))
    slow = scale_trace(trace, 2.0)
    assert slow.hours == pytest.approx(2 * trace.hours)
    assert preemptions_per_hour(slow) == pytest.approx(preemptions_per_hour(trace) / 2)
    assert np.array_equal(slow.unavailable, trace.unavailable)


def test_every_shared_trace_loads_with_a_plausible_rate() -> None:
    traces = load_traces(DATA)
    assert len(traces) == 13
    for trace in traces:
        assert trace.accelerator == "V100-16GB"
        assert 0.05 < preemptions_per_hour(trace) < 5


def test_two_pools_with_offset_outages_are_away_together_for_less_than_either(
    tmp_path: Path,
) -> None:
    # Hourly ticks: each zone is away 4 h in every 12, the second 2 h after the first (and its
    # record starts an hour later): a job free to take either waits only while both are away.
    pattern = [0] * 8 + [1] * 4
    first = load_trace(_write(tmp_path, "us-east-1a_v100_1", pattern * 10))
    shifted = (pattern[-2:] + pattern[:-2]) * 10
    second = load_trace(_write(tmp_path, "us-east-1c_v100_1", shifted[1:]))
    joint = joint_availability([first, second], [0.0, 1.0])
    assert joint is not None
    assert joint.ticks == 119  # the span both cover
    alone = [availability_stats(t).mean_outage_hours for t in (first, second)]
    together = availability_stats(joint).mean_outage_hours
    assert together == pytest.approx(2.0)
    assert together < min(alone)
    assert joint.availability > max(first.availability, second.availability)
    # The first zone drops while the second has spot (no wait); the second drops two hours
    # into the first's outage (a wait of the 2 h they share).
    waits = interruption_waits([first, second], [0.0, 1.0])
    assert waits is not None
    assert sorted(set(waits.tolist())) == [0.0, 2.0]
    assert waits.mean() == pytest.approx(1.0, abs=0.1)
    alone_waits = interruption_waits([first], [0.0])
    assert alone_waits is not None and alone_waits.mean() == pytest.approx(4.0)


def test_pools_that_do_not_overlap_in_time_have_no_joint_history(tmp_path: Path) -> None:
    trace = load_trace(_write(tmp_path, "us-east-1a_v100_1", [0, 1, 0, 1]))
    assert joint_availability([trace, trace], [0.0, 10.0]) is None
    coarse = load_trace(_write(tmp_path, "us-east-1c_v100_1", [0, 1], gap=7200))
    with pytest.raises(ValueError, match="different ticks"):
        joint_availability([trace, coarse], [0.0, 0.0])

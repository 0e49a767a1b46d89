"""Trace loading and interruption statistics, on hand-made traces and the shared data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from costs.traces import (
    load_trace,
    load_traces,
    mean_time_between_interruptions_hours,
    parse_trace_name,
    preemption_count,
    preemptions_per_hour,
    scale_trace,
    window,
    windows,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "spot-traces"


def _write(tmp_path: Path, name: str, data: list[int], gap: int = 3600, **extra: object) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data, **extra}))
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


def test_it_rejects_values_other_than_zero_and_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="0 and 1"):
        load_trace(_write(tmp_path, "us-east-1c_v100_1", [0, 2]))


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

"""`bench/estimator.py --traces DIR`: a user checks Baton on a folder of their own traces."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from tests.conftest import run_bench


def test_it_evaluates_any_folder_of_traces_out_of_sample(tmp_path: Path) -> None:
    rng = random.Random(3)
    for name in ("cluster-a", "us-central1-a_k80_1"):
        data: list[int] = []
        up = True
        while len(data) < 200:
            data += [0 if up else 1] * (int(rng.expovariate(1 / (6 if up else 1.5))) + 1)
            up = not up
        payload = {"metadata": {"gap_seconds": 3600}, "data": data[:200]}
        (tmp_path / f"{name}.json").write_text(json.dumps(payload))

    done = run_bench(
        "estimator.py",
        *("--traces", str(tmp_path), "--workers", "1"),
        "--task-hours",
        "20",
        "--deadline-hours",
        "30",
    )

    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "out-of-sample (2 traces)" in out and "in-sample (" not in out
    assert "cluster-a avail" in out and "us-central1-a avail" in out
    assert re.search(r"^calibration: cost \d+\.\d{3} time \d+\.\d{3}$", out, flags=re.M)


def test_a_folder_without_traces_or_with_a_bad_one_gets_one_line(tmp_path: Path) -> None:
    empty = run_bench("estimator.py", "--traces", str(tmp_path))
    (tmp_path / "bad.json").write_text('{"metadata": {"gap_seconds": 60}, "data": [0, -1]}')
    bad = run_bench("estimator.py", "--traces", str(tmp_path))

    assert empty.returncode != 0 and "no trace files" in empty.stderr
    assert bad.returncode != 0 and "value -1 at tick 1" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

"""`bench/checkpoint.py`: a user runs one part of the benchmark and reads its verdicts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import run_bench

pytestmark = pytest.mark.slow


def test_the_async_section_judges_its_target_by_the_interval_of_the_median(
    tmp_path: Path,
) -> None:
    out = run_bench("checkpoint.py",
        "--sections", "async", "--dir", str(tmp_path), "--async-mb", "8",
        "--async-pairs", "5", "--async-max-pairs", "7", "--async-per-block", "2",
        "--async-interval", "0.2",
    )  # fmt: skip

    assert out.returncode == 0, out.stderr
    assert "This machine's limits" not in out.stdout  # only the part asked for ran
    found = re.search(
        r"(\d+) pairs of 2 .* cost ([+-]\d+\.\d)% \(90% interval of the median ([+-]\d+\.\d) to "
        r"([+-]\d+\.\d); min-max ([+-]\d+\.\d) to ([+-]\d+\.\d)\)\s+cost <= 2%\s+(.+)",
        out.stdout,
    )
    assert found, out.stdout
    pairs = int(found.group(1))
    median, low, high, least, most = (float(found.group(i)) for i in range(2, 7))
    assert least <= low <= median <= high <= most
    # Seven pairs or fewer are too few for a 90% interval inside the extremes: it is min to max.
    assert (low, high) == (least, most)
    verdict = found.group(7).strip()
    # Five pairs at least; more only while undecided, up to seven.
    assert 5 <= pairs <= 7
    assert pairs == 7 or not verdict.startswith("not judged")
    # The figures are printed to 0.1; within 0.05 of the 2% target the rounding hides the side.
    if high < 1.95:
        assert verdict == "met"
    elif low > 2.05:
        assert verdict == "MISSED"
    elif low < 1.95 and high > 2.05:
        assert verdict.startswith("not judged")
    else:
        assert verdict in ("met", "MISSED") or verdict.startswith("not judged")
    assert list(tmp_path.iterdir()) == []  # the scratch folder is left as it was


def test_an_unknown_section_is_named() -> None:
    out = run_bench("checkpoint.py", "--sections", "async,speed")

    assert out.returncode == 2
    assert "unknown section(s) ['speed']" in out.stderr


def test_the_sizes_section_shows_what_the_store_layout_alone_costs_on_this_disk(
    tmp_path: Path,
) -> None:
    out = run_bench(
        "checkpoint.py", "--sections", "sizes", "--sizes", "20", "--repeat", "5",
        "--dir", str(tmp_path),
    )  # fmt: skip

    assert out.returncode == 0, out.stderr
    ratio = r"(\d+\.\d\d)x \((\d+\.\d\d)-(\d+\.\d\d)\)"
    rows = {
        "layout": rf"raw write as 16 MiB chunk files at once \(the store's layout\)\s+20 MiB"
        rf"\s+\d\.\d+\s+\d+\.\d\d GiB/s\s+{ratio} raw",
        "busy": rf"the same while every core copies and hashes other memory\s+20 MiB"
        rf"\s+\d\.\d+\s+\d+\.\d\d GiB/s\s+{ratio} raw",
        "save over layout": rf"the same / the raw write as chunk files\s+20 MiB\s+{ratio} "
        r"chunk files",
    }
    for name, pattern in rows.items():
        found = re.search(pattern, out.stdout)
        assert found, f"{name} row missing:\n{out.stdout}"
        median, low, high = (float(found.group(i)) for i in (1, 2, 3))
        assert low <= median <= high
    # The rows come between the raw write they are measured against and the save.
    order = [
        out.stdout.index(s) for s in ("raw write + fsync", "chunk files at once", "Baton full")
    ]
    assert order == sorted(order)
    assert list(tmp_path.iterdir()) == []  # every contender's files are removed

"""The table every benchmark here prints: min / median / max over repetitions, the ratio of each
row's median to its baseline's (measured in the same run), and the target when there is one."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Collection
from dataclasses import dataclass


@dataclass
class Row:
    name: str
    values: list[float]
    ratios: list[float]
    target: float | None = None  # an upper bound on the median, in the table's unit


def print_table(title: str, unit: str, rows: list[Row], baseline: str) -> None:
    print(f"\n{title} ({unit}; ratio = median / median of {baseline})")
    head = f"{'':44} {'min':>9} {'median':>9} {'max':>9} {'ratio':>8} {'target':>8}"
    print(head)
    print("-" * len(head))
    for row in rows:
        lo, mid, hi = min(row.values), statistics.median(row.values), max(row.values)
        ratio = statistics.median(row.ratios)
        line = f"{row.name:44} {lo:9.3f} {mid:9.3f} {hi:9.3f} {ratio:7.2f}x"
        if row.target is not None:
            line += (
                f" {'<= ' + format(row.target, 'g'):>8} {'met' if mid <= row.target else 'MISSED'}"
            )
        print(line)


def median_interval(values: list[float], confidence: float = 0.9) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the k-th smallest and k-th
    largest value, k the largest rank whose two tails hold at most 1 - `confidence` of the
    binomial(n, 1/2) mass (with too few values for that, the minimum and maximum)."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k = 0.0, 0
    while k < n // 2:
        tail += math.comb(n, k) / 2**n  # P(fewer than k + 1 values below the median)
        if 2 * tail > 1 - confidence:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def print_columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Rows of ready-made cells under a header, each column as wide as its widest cell (for
    tables whose rows mix units, such as the checkpoint benchmark's)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for line in [header, tuple("-" * w for w in widths), *rows]:
        cells = zip(line, widths, strict=True)
        print("  ".join(cell.ljust(width) for cell, width in cells).rstrip())


def sections(parser: argparse.ArgumentParser, wanted: str, known: Collection[str]) -> list[str]:
    """The comma-separated section names asked for; an unknown one is a usage error."""
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {sorted(known)}")
    return names


def print_machine(parser: argparse.ArgumentParser, repeats: int, *more: str) -> None:
    """The machine and the run's settings, first in every table (at least one repetition)."""
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    details = ", ".join([f"repeats {repeats}", *more])
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {details}")

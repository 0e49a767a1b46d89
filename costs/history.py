"""Reading price history files and turning availability into runs. Pure: no Django."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import numpy as np

from costs.traces import Trace


@dataclass(frozen=True)
class PriceRow:
    """One spot price observation of one instance type in one availability-zone id."""

    zone: str
    instance_type: str
    price: Decimal
    at: datetime


def read_spot_price_rows(path: Path) -> list[PriceRow]:
    """Rows of a describe-spot-price-history export (az_id, instance_type, product, price, time).

    Raises ValueError naming the line when a row cannot be read.
    """
    rows: list[PriceRow] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        missing = {"az_id", "instance_type", "spot_price_usd_per_hour", "timestamp"} - set(
            reader.fieldnames or []
        )
        if missing:
            raise ValueError(f"{path.name}: missing column(s) {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                at = datetime.fromisoformat(row["timestamp"])
                rows.append(
                    PriceRow(
                        row["az_id"],
                        row["instance_type"],
                        Decimal(row["spot_price_usd_per_hour"]),
                        at if at.tzinfo else at.replace(tzinfo=UTC),
                    )
                )
            except (ValueError, ArithmeticError) as exc:
                raise ValueError(f"{path.name} line {line}: {exc}") from None
    return rows


def latest_prices(rows: list[PriceRow]) -> dict[tuple[str, str], Decimal]:
    """The most recent price per (zone, instance type)."""
    latest: dict[tuple[str, str], PriceRow] = {}
    for row in rows:
        key = (row.zone, row.instance_type)
        if key not in latest or row.at > latest[key].at:
            latest[key] = row
    return {key: row.price for key, row in latest.items()}


_DATASET_DATE = re.compile(r"(\d{2})-(\d{2})-(\d{4})")


def trace_start(path: Path) -> datetime:
    """When a trace starts: its dataset folder is named after the day (aws-MM-DD-YYYY)."""
    for part in reversed(path.parts[:-1]):
        found = _DATASET_DATE.search(part)
        if found:
            month, day, year = (int(g) for g in found.groups())
            return datetime(year, month, day, tzinfo=UTC)
    raise ValueError(
        f"cannot tell when {path.name} starts: put it in a folder named like aws-MM-DD-YYYY "
        "or give --start"
    )


@dataclass(frozen=True)
class Run:
    """`ticks` consecutive ticks with the same availability, starting at tick `start`."""

    start: int
    ticks: int
    available: bool


def runs(unavailable: np.ndarray) -> list[Run]:
    """Run-length encoding of a trace's availability."""
    values = np.asarray(unavailable, dtype=bool)
    if values.size == 0:
        return []
    edges = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [values.size]))
    return [Run(int(s), int(e - s), not bool(values[s])) for s, e in zip(starts, ends, strict=True)]


def trace_from_runs(
    name: str, region: str, accelerator: str, gap_seconds: float, stored: list[Run]
) -> Trace:
    """Rebuild a trace from its runs (the inverse of `runs`)."""
    unavailable = np.repeat(
        np.array([not r.available for r in stored], dtype=bool),
        np.array([r.ticks for r in stored], dtype=int),
    )
    return Trace(
        name=name,
        region=region,
        zone=region,
        accelerator=accelerator,
        nodes=1,
        gap_seconds=gap_seconds,
        unavailable=unavailable,
    )

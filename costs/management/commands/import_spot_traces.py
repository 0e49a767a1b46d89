"""`manage.py import_spot_traces <file or folder>`: store availability traces as history."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs.services import import_spot_traces


def _day(text: str) -> datetime:
    try:
        day = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"--start must be a date like 2023-02-15, not {text!r}") from None
    return day if day.tzinfo else day.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Import spot availability traces in the shared format ({'metadata': {'gap_seconds'}, "
        "'data': [...]}: 0/1 per tick, or how many of N nodes could not be had) from a file or "
        "a folder, and refresh the pools' interruption figures. A name like "
        "us-east-1c_v100_1.json or us-central1-a_k80_1.json says the region and the card; "
        "otherwise give --region and --accelerator. A trace starts on the date of its folder "
        "(aws-MM-DD-YYYY) or at --start."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path, help="a trace file or a folder of them")
        parser.add_argument("--region", help="region code for traces whose name says none")
        parser.add_argument("--accelerator", help="card name for traces whose name says none")
        parser.add_argument("--start", help="day the traces start (ISO date), if not the folder's")

    def handle(self, *args: Any, path: Path, **options: Any) -> None:
        start = _day(options["start"]) if options["start"] else None
        try:
            report = import_spot_traces(
                path, region=options["region"], accelerator=options["accelerator"], start=start
            )
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if not report.imported:
            raise CommandError("nothing imported: " + "; ".join(report.skipped[:5]))
        self.stdout.write(report.describe("trace(s)") + "; pools' interruption figures refreshed")

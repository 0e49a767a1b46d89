"""`manage.py import_spot_traces <folder>`: store availability traces as history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs.services import import_spot_traces


class Command(BaseCommand):
    help = (
        "Import spot availability traces ({'metadata': {'gap_seconds'}, 'data': [0|1...]}, one "
        "JSON file per zone, named like us-east-1c_v100_1.json, in folders named aws-MM-DD-YYYY) "
        "and refresh the pools' interruption rates."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path)

    def handle(self, *args: Any, folder: Path, **options: Any) -> None:
        try:
            report = import_spot_traces(folder)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(report.describe("trace(s)") + "; pools' interruption rates refreshed")

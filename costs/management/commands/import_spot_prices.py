"""`manage.py import_spot_prices <tsv>`: store spot price observations as history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs.services import import_spot_prices


class Command(BaseCommand):
    help = (
        "Import spot prices (tab-separated: az_id, instance_type, product, "
        "spot_price_usd_per_hour, timestamp) for the pools they belong to, and refresh the "
        "pools' prices."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tsv", type=Path)

    def handle(self, *args: Any, tsv: Path, **options: Any) -> None:
        try:
            report = import_spot_prices(tsv)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(report.describe("price observation(s)") + "; pools' prices refreshed")

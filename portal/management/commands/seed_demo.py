"""`manage.py seed_demo`: the demo catalogue and the demo user (idempotent)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from costs.models import AvailabilitySample, PriceSample
from costs.services import import_spot_prices, import_spot_traces
from jobs.services import ensure_demo_user
from migration.catalogue import SPOT_PRICES, TRACES, seed_catalogue


class Command(BaseCommand):
    help = "Create or update the demo regions, accelerators, compatibility matrix, pools and user."

    def handle(self, *args: Any, **options: Any) -> None:
        counts = seed_catalogue()
        # History once: it feeds the pools' interruption rates and prices.
        if not AvailabilitySample.objects.exists():
            import_spot_traces(settings.BATON_DATA_DIR / TRACES)
        if not PriceSample.objects.exists():
            import_spot_prices(settings.BATON_DATA_DIR / SPOT_PRICES)
        username, password = ensure_demo_user()
        self.stdout.write(
            "seeded {regions} regions, {accelerators} accelerators, {rules} compatibility rules, "
            "{pools} pools".format(**counts)
        )
        # The last line is what `make run` prints at every start (DESIGN §9).
        self.stdout.write(f"Log in as {username} / {password}")

"""`manage.py seed_demo`: the demo catalogue and the demo user (idempotent)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from jobs.services import ensure_demo_user
from migration.catalogue import seed_catalogue


class Command(BaseCommand):
    help = "Create or update the demo regions, accelerators, compatibility matrix, pools and user."

    def handle(self, *args: Any, **options: Any) -> None:
        counts = seed_catalogue()
        username, password = ensure_demo_user()
        self.stdout.write(
            "seeded {regions} regions, {accelerators} accelerators, {rules} compatibility rules, "
            "{pools} pools".format(**counts)
        )
        # The last line is what `make run` prints at every start (DESIGN §9).
        self.stdout.write(f"Log in as {username} / {password}")

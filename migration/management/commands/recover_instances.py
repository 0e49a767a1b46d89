"""`manage.py recover_instances`: end instances left by a crash and re-place their jobs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from migration.sweeps import recover_local_instances


class Command(BaseCommand):
    help = "End local instances left from a previous run and send their jobs back to placement."

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = recover_local_instances()
        if jobs:
            self.stdout.write(
                f"moving {len(jobs)} job(s) whose instances were left running: {jobs}"
            )

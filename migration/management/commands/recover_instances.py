"""`manage.py recover_instances`: end instances left by a crash and re-place their jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from migration.backends import localproc
from migration.sweeps import recover_local_instances


class Command(BaseCommand):
    help = (
        "At start-up, before any worker runs: end the local instances a previous run left "
        "(their jobs migrate from their last checkpoints) and any process still running in an "
        "instance folder. Not for a running system: it ends every local instance."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        # Instances still active in the database: their processes end through the backend,
        # then the instance is failed and its job sent back to placement.
        jobs = recover_local_instances()
        # What is left belongs to instances already ended in the database (an agent that
        # outlived its release when the process holding the release's timer died).
        leftovers = localproc.end_all(Path(settings.BATON_INSTANCE_ROOT), grace_s=0)
        if jobs:
            self.stdout.write(
                f"moving {len(jobs)} job(s) whose instances were left running: {jobs}"
            )
        if leftovers:
            self.stdout.write(
                f"ended the leftover processes of {len(leftovers)} instance(s): "
                f"{', '.join(leftovers)}"
            )

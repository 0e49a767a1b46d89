"""Queue a Celery task by name once the current transaction commits.

Services schedule their side effects through this instead of importing task modules, so a
service never imports the edge that calls it (the import-linter layers contract).
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction


def enqueue_on_commit(task: str, *args: Any, countdown: float | None = None) -> None:
    """Send `task` (its dotted name) with `args` after commit; at once outside a transaction.

    The queue comes from CELERY_TASK_ROUTES, as for `.delay()`.
    """

    def send() -> None:
        current_app.send_task(task, args=args, countdown=countdown)

    transaction.on_commit(send, robust=True)

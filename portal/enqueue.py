"""Queue a Celery task by name once the current transaction commits.

Services schedule their side effects through this instead of importing task modules, so a
service never imports the edge that calls it (the import-linter layers contract).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from portal.celery import app

logger = logging.getLogger(__name__)


def enqueue_on_commit(task: str, *args: Any, countdown: float | None = None) -> None:
    """Send `task` (its dotted name) with `args` after commit; at once outside a transaction.

    The queue comes from CELERY_TASK_ROUTES, as for `.delay()`.
    """

    def send() -> None:
        # Our app by name, not Celery's `current_app`, which depends on the thread asking.
        result = app.send_task(task, args=args, countdown=countdown)
        logger.debug("queued %s%s as %s", task, args, result.id)

    transaction.on_commit(send, robust=True)

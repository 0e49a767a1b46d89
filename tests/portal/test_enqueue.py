"""Tasks queued by services reach this install's broker from any thread."""

from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings

from portal.enqueue import enqueue_on_commit


@pytest.mark.django_db(transaction=True)
def test_a_task_queued_from_a_web_servers_thread_reaches_our_broker() -> None:
    # Sync views run in a server's worker threads; their tasks go to this install's queues.
    queue = f"{settings.BATON_REDIS_PREFIX}:default"
    broker = redis.Redis.from_url(settings.REDIS_URL)
    before = broker.llen(queue)

    sender = threading.Thread(
        target=enqueue_on_commit, args=("migration.tasks.retry_waiting_jobs_task",)
    )
    sender.start()
    sender.join(10)

    assert broker.llen(queue) == before + 1
    broker.rpop(queue)  # leave nothing for a worker started later

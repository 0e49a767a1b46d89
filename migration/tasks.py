"""Celery edges of placement: take ids, call a service, safe to run twice."""

from __future__ import annotations

from celery import shared_task

from migration import services


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5)
def place_job_task(job_id: int) -> str:
    """Place a job (queue `placement`)."""
    return services.place_job(job_id).reason


@shared_task(acks_late=True)
def retry_waiting_jobs_task() -> int:
    """Queue placement for waiting jobs, migrations first (run by beat and when capacity frees)."""
    ids = services.jobs_to_retry()
    for job_id in ids:
        place_job_task.delay(job_id)
    return len(ids)

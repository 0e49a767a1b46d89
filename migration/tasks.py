"""Celery edges of placement: take ids, call a service, safe to run twice."""

from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from migration import interruptions, market_tick, orchestration, replication, services, sweeps
from migration.checkpoint import StoreError
from portal.enqueue import enqueue_on_commit

# The database's transient errors (a lock timeout, a dropped connection) are retried.
TRANSIENT = (ConnectionError, OperationalError)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def place_job_task(job_id: int) -> str:
    """Place a job (queue `placement`)."""
    return services.place_job(job_id).reason


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def start_job_task(job_id: int) -> int:
    """Start a placed job: its checkpoint in the target region, then its instances (queue
    `placement`: it is the second half of a placement)."""
    return orchestration.start_job(job_id)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def replicate_for_start_task(job_id: int) -> int:
    """Copy a starting job's checkpoint to the region it was placed in, then start it (queue
    `replication`, so placement never waits behind a copy)."""
    return orchestration.copy_for_start(job_id)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def replicate_checkpoint_task(checkpoint_id: int, region: str | None = None) -> int:
    """Copy a new checkpoint to the regions the job may land in next (or to `region`), then
    apply retention (queue `replication`). Returns how many copies were made."""
    return len(replication.replicate(checkpoint_id, region))


@shared_task(
    acks_late=True, autoretry_for=(*TRANSIENT, StoreError), retry_backoff=True, max_retries=8
)
def forget_checkpoints_task(
    project: str, key: str, regions: list[str], sweep_later: bool = True
) -> dict[str, int]:
    """Remove a deleted job's checkpoints from the region stores, then (`sweep_later`) once
    more after the grace period (queue `replication`); a store that cannot be reached is
    tried again later."""
    return replication.forget_checkpoints(project, key, regions, sweep_later=sweep_later)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def validate_replica_task(migration_id: int, checkpoint_id: int, region: str) -> bool:
    """Read back and hash-check the replica a migration restores from (queue `validation`)."""
    return orchestration.validate_replica(migration_id, checkpoint_id, region)


@shared_task(acks_late=True, autoretry_for=TRANSIENT, retry_backoff=True, max_retries=5)
def reclaim_instance_task(instance_id: int) -> bool:
    """Take an interrupted instance away at its reclaim time."""
    return interruptions.reclaim_instance(instance_id)


@shared_task(acks_late=True)
def sweep_instances_task() -> dict[str, int]:
    """Find lost instances, stuck jobs and overdue reclaims; accrue costs (run by beat)."""
    return sweeps.sweep()


@shared_task(acks_late=True)
def retry_waiting_jobs_task() -> int:
    """Queue placement for waiting jobs, migrations first (run by beat and when capacity frees)."""
    ids = services.jobs_to_retry()
    for job_id in ids:
        enqueue_on_commit("migration.tasks.place_job_task", job_id)
    return len(ids)


@shared_task
def simulate_market_task() -> int:
    """One tick of the market simulator (beat; does nothing while it is off)."""
    return len(market_tick.run_market_tick())

"""A job's name in the checkpoint stores (`Job.checkpoint_key`, its `BATON_JOB_ID`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from jobs.models import Job
from tests.conftest import submit


@pytest.mark.django_db
def test_a_job_is_named_by_its_id_and_a_random_part(alice: Any, catalogue: Any) -> None:
    first, second = submit(alice, catalogue), submit(alice, catalogue)

    assert first.checkpoint_key.startswith(f"{first.pk}-")
    assert Job.objects.get(pk=first.pk).checkpoint_key == first.checkpoint_key
    assert first.checkpoint_key.split("-")[1] != second.checkpoint_key.split("-")[1]


@pytest.mark.django_db(transaction=True)
def test_jobs_submitted_before_the_upgrade_keep_their_checkpoints_under_their_id(
    alice: Any, catalogue: Any
) -> None:
    job = submit(alice, catalogue)
    executor = MigrationExecutor(connection)
    executor.migrate([("jobs", "0004_checkpoint_storage")])
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert Job.objects.get(pk=job.pk).checkpoint_key == str(job.pk)
    later = submit(alice, catalogue)
    assert later.checkpoint_salt and later.checkpoint_key == f"{later.pk}-{later.checkpoint_salt}"

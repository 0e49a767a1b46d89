"""End to end, with every real part: the portal over HTTP (agents and the metadata endpoint),
a Celery worker through real Redis, the local backend starting real agent processes, and the
built-in workloads training under them. A job is interrupted by a real two-level notice,
checkpoints inside the window, moves, restores, is validated and finishes bit-exactly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.models import Job
from migration import sweeps
from migration.choices import MIGRATION_TIMELINE
from migration.models import CapacityPool, Instance, Migration, TimelineEvent
from tests.conftest import ROOT, job_body, running_worker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MIGRATION_KINDS = list(MIGRATION_TIMELINE)
FINAL = re.compile(r"final step=(\d+) val_loss=(\S+) weights_sha256=([0-9a-f]{64})")


@pytest.fixture
def stack(live_server: Any, catalogue: dict[str, Any]) -> Iterator[subprocess.Popen[bytes]]:
    """The worker the local backend launches agents from, pointed at the live portal."""
    with running_worker(
        BATON_PUBLIC_URL=live_server.url,
        BATON_PROVISIONING_DELAY_S="0",
        BATON_AGENT_HEARTBEAT_SECONDS="0.5",
        BATON_HEARTBEAT_TIMEOUT_SECONDS="5",
    ) as worker:
        yield worker
    # Whatever a failed test left running is ended with its instances.
    for instance in Instance.objects.filter(launched_at__isnull=False).select_related("pool"):
        from migration.backends import get_backend

        get_backend(instance.pool.backend).release(instance)


@pytest.fixture
def staff_client(make_user: Any, client_for: Any) -> Any:
    return client_for(make_user("operator", staff=True))


def twin_result(params: dict[str, Any], steps: int) -> str:
    """weights_sha256 of the same workload run once, uninterrupted, outside Baton (in a fresh
    folder: on its own the SDK resumes from whatever checkpoint it finds there)."""
    argv = [sys.executable, "-m", "jobs.workloads.mlp_numpy", "--steps", str(steps)]
    for name, value in params.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    with tempfile.TemporaryDirectory() as folder:
        env["BATON_CHECKPOINT_DIR"] = folder
        out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    found = FINAL.search(out.stdout)
    assert found, out.stdout + out.stderr
    return found.group(3)


def submit(client: Any, **overrides: Any) -> dict[str, Any]:
    response = client.post("/api/jobs/", job_body(**overrides), format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def running_instance(job_id: int, min_step: int = 1) -> Instance:
    def ready() -> Instance | None:
        job = Job.objects.get(pk=job_id)
        if job.state != "running" or job.step < min_step:
            return None
        return Instance.objects.filter(job_id=job_id, state="running").first()

    found: Instance = wait_until(ready, timeout=60)
    return found


def start(
    client: Any,
    params: dict[str, Any],
    steps: int,
    every: int,
    min_step: int,
    template: str = "mlp_numpy",
    **fields: Any,
) -> tuple[dict[str, Any], Instance]:
    """Submit a built-in workload and wait until it runs past `min_step`."""
    job = submit(
        client,
        workload={"template": template, "params": params},
        total_steps=steps,
        checkpoint_every_steps=every,
        **fields,
    )
    return job, running_instance(job["id"], min_step=min_step)


def finished_like_twin(
    job_id: int, params: dict[str, Any], steps: int, timeout: float = 120
) -> Job:
    """Wait for the job; it succeeded with the weights of an uninterrupted run."""
    done = finished(job_id, timeout)
    assert done.state == "succeeded", (done.error, kinds(job_id))
    assert done.result is not None
    assert done.result["weights_sha256"] == twin_result(params, steps)
    return done


def interrupt(staff_client: Any, instance: Instance, advance_s: float, window_s: float) -> None:
    answer = staff_client.post(
        f"/api/instances/{instance.pk}/interrupt/",
        {"advance_notice_s": advance_s, "final_window_s": window_s},
        format="json",
    )
    assert answer.status_code == 202, answer.content


def finished(job_id: int, timeout: float = 120) -> Job:
    def done() -> Job | None:
        sweeps.sweep()
        job = Job.objects.get(pk=job_id)
        return job if job.state in ("succeeded", "failed", "cancelled") else None

    job: Job = wait_until(done, timeout=timeout, every=0.5)
    return job


def kinds(job_id: int) -> list[str]:
    return list(TimelineEvent.objects.filter(job_id=job_id).values_list("kind", flat=True))


def test_an_interrupted_job_migrates_and_finishes_bit_exact(
    stack: Any, alice: Any, staff_client: Any, client_for: Any
) -> None:
    params = {"seed": 7, "step_ms": 15, "state_mb": 4}
    job, instance = start(client_for(alice), params, 400, 50, 60)

    interrupt(staff_client, instance, 1, 20)

    done = finished_like_twin(job["id"], params, 400)
    migration = Migration.objects.get(job_id=job["id"])
    assert migration.phase == "done"
    assert migration.lost_steps == 0
    events = list(TimelineEvent.objects.filter(migration=migration).order_by("id"))
    for event in events:  # on a failure, why a phase went another way (printed whole)
        print(event.kind, event.data)
    assert [e.kind for e in events] == MIGRATION_KINDS
    committed = next(e for e in events if e.kind == "checkpoint_committed")
    restored = next(e for e in events if e.kind == "restore_done")
    assert restored.data["step"] == committed.data["step"]
    assert set(migration.timings) >= {*MIGRATION_KINDS[1:], "total"}
    assert done.interruptions == 1
    assert done.cost_so_far > 0


def test_an_emergency_save_that_misses_the_window_resumes_from_the_last_periodic_one(
    stack: Any, alice: Any, staff_client: Any, client_for: Any
) -> None:
    # Steps of 3 s: the notice reaches the workload within a second or two of the progress
    # report this test waits for, so the 1 s window ends before that step does (with 1.5 s
    # steps a notice that arrived late in a step, on a busy machine, let the save fit).
    params = {"seed": 3, "step_ms": 3000}
    job, instance = start(client_for(alice), params, 10, 3, 4)

    interrupt(staff_client, instance, 0, 1)

    finished_like_twin(job["id"], params, 10, timeout=180)
    migration = Migration.objects.get(job_id=job["id"])
    assert "checkpoint_missed" in kinds(job["id"])
    assert "notice_advance" not in kinds(job["id"])
    assert migration.lost_steps <= 3


def test_a_killed_agent_is_declared_lost_and_its_job_migrates(
    stack: Any, alice: Any, client_for: Any
) -> None:
    params = {"seed": 5, "step_ms": 20}
    job, instance = start(client_for(alice), params, 500, 40, 80)

    os.killpg(int(instance.backend_id), signal.SIGKILL)

    finished_like_twin(job["id"], params, 500)
    assert Instance.objects.get(pk=instance.pk).state == "failed"
    assert "checkpoint_missed" in kinds(job["id"])


def test_a_job_waits_without_capacity_and_is_placed_when_it_frees(
    stack: Any, alice: Any, client_for: Any, catalogue: dict[str, Any]
) -> None:
    # One V100 spot slot and one on-demand slot: the third job has nowhere to go.
    client = client_for(alice)
    body = {
        "workload": {"template": "mlp_numpy", "params": {"seed": 1, "step_ms": 5}},
        "accelerator": "V100-16GB",
        "tolerance": "balanced",
    }
    first = submit(client, total_steps=300, **body)
    second = submit(client, total_steps=300, **body)
    third = submit(client, total_steps=50, **body)
    wait_until(lambda: Job.objects.get(pk=third["id"]).state == "waiting", timeout=60)

    for job in (first, second, third):
        assert finished(job["id"]).state == "succeeded", kinds(job["id"])
    assert "waiting" in kinds(third["id"])
    pools = {p.pk for p in CapacityPool.objects.filter(accelerator__name="V100-16GB")}
    assert Job.objects.get(pk=third["id"]).pool_id in pools


# Known flake, not understood yet: in 2 of about 6 full runs the gang did not finish within
# 180 s (never when run alone, on SQLite or PostgreSQL). One rerun, until it is found.
@pytest.mark.flaky(reruns=1)
def test_a_two_rank_torch_gang_migrates_together_and_finishes(
    stack: Any, alice: Any, staff_client: Any, client_for: Any
) -> None:
    pytest.importorskip("torch")
    job = submit(
        client_for(alice),
        workload={"template": "mlp_torch", "params": {"seed": 2, "step_ms": 20}},
        nodes=2,
        total_steps=400,
        checkpoint_every_steps=50,
    )
    instance = running_instance(job["id"], min_step=60)

    interrupt(staff_client, instance, 0, 30)

    done = finished(job["id"], timeout=180)
    assert done.state == "succeeded", (done.error, kinds(job["id"]))
    migration = Migration.objects.get(job_id=job["id"])
    assert migration.lost_steps == 0 and migration.phase == "done"
    committed = TimelineEvent.objects.get(migration=migration, kind="checkpoint_committed")
    restored = TimelineEvent.objects.get(migration=migration, kind="restore_done")
    assert committed.data["ranks"] == 2
    assert [r["step"] for r in restored.data["ranks"]] == [committed.data["step"]] * 2
    new = Instance.objects.filter(migration=migration)
    assert new.count() == 2 and len({i.pool_id for i in new}) == 1  # one pool for the gang
    assert done.result is not None and done.result["step"] == 400


def test_a_worker_killed_mid_migration_starts_exactly_one_new_instance(
    live_server: Any,
    catalogue: dict[str, Any],
    alice: Any,
    staff_client: Any,
    client_for: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {
        "BATON_PUBLIC_URL": live_server.url,
        "BATON_PROVISIONING_DELAY_S": "0",
        "BATON_AGENT_HEARTBEAT_SECONDS": "0.5",
    }
    params = {"seed": 9, "step_ms": 15}
    with running_worker(**env) as worker:
        job = submit(
            client_for(alice),
            workload={"template": "mlp_numpy", "params": params},
            total_steps=500,
            checkpoint_every_steps=50,
        )
        instance = running_instance(job["id"], min_step=50)
        interrupt(staff_client, instance, 0, 20)
        wait_until(lambda: "released" in kinds(job["id"]), timeout=60, every=0.05)
        worker.kill()  # mid-migration: its tasks are neither finished nor acknowledged
    monkeypatch.setattr(sweeps, "STUCK_AFTER", sweeps.timedelta(0))
    from migration.tasks import place_job_task, start_job_task

    with running_worker(**env):
        for _ in range(2):  # the lost tasks come back, twice over
            place_job_task.delay(job["id"])
            start_job_task.delay(job["id"])
        done = finished(job["id"])
    for leftover in Instance.objects.filter(launched_at__isnull=False).select_related("pool"):
        from migration.backends import get_backend

        get_backend(leftover.pool.backend).release(leftover)
    assert done.state == "succeeded", (done.error, kinds(job["id"]))
    migration = Migration.objects.get(job_id=job["id"])
    assert Instance.objects.filter(migration=migration).count() == 1
    assert Instance.objects.filter(job_id=job["id"]).count() == 2
    assert done.result is not None
    assert done.result["weights_sha256"] == twin_result(params, 500)


@pytest.mark.asyncio
async def test_the_browser_sees_every_phase_live_and_a_reconnect_fills_the_gap(
    stack: Any, alice: Any, staff_client: Any, client_for: Any
) -> None:
    from asgiref.sync import sync_to_async

    from tests.migration.test_consumers import connect

    client = await sync_to_async(client_for)(alice)
    job = await sync_to_async(submit)(
        client,
        workload={"template": "mlp_numpy", "params": {"seed": 4, "step_ms": 15}},
        total_steps=600,
        checkpoint_every_steps=50,
    )
    instance = await sync_to_async(running_instance)(job["id"], 40)
    connected, ws = await connect(f"/ws/jobs/{job['id']}/", alice)
    assert connected
    await ws.send_json_to({"type": "resume", "since": 0})
    await sync_to_async(staff_client.post)(
        f"/api/instances/{instance.pk}/interrupt/",
        {"advance_notice_s": 1, "final_window_s": 20},
        format="json",
    )

    async def receive_until(socket: Any, kind: str, seen: list[dict[str, Any]]) -> None:
        while not seen or seen[-1]["kind"] != kind:
            message = await socket.receive_json_from(timeout=60)
            if message["type"] == "timeline.event":
                seen.append(message["event"])

    seen: list[dict[str, Any]] = []
    await receive_until(ws, "checkpoint_committed", seen)
    await ws.disconnect()  # the page goes away mid-migration...
    connected, ws = await connect(f"/ws/jobs/{job['id']}/", alice)
    await ws.send_json_to({"type": "resume", "since": seen[-1]["id"]})  # ...and comes back
    await receive_until(ws, "running", seen)
    await ws.disconnect()

    ids = [event["id"] for event in seen]
    assert ids == sorted(set(ids))  # nothing twice, in order
    stored = await sync_to_async(
        lambda: list(
            TimelineEvent.objects.filter(job_id=job["id"], id__lte=ids[-1])
            .order_by("id")
            .values_list("id", flat=True)
        )
    )()
    assert ids == stored  # nothing missed
    migration_kinds = [e["kind"] for e in seen if e["migration"] is not None]
    for event in seen:  # on a failure, why a phase went another way (printed whole)
        print(event["kind"], event["data"])
    assert migration_kinds == MIGRATION_KINDS


def test_a_corrupt_replica_rolls_back_to_the_previous_checkpoint_and_the_job_finishes(
    stack: Any, alice: Any, staff_client: Any, client_for: Any
) -> None:
    from migration import replication
    from migration.models import CheckpointReplica

    params = {"seed": 3, "step_ms": 20, "base_mb": 8}
    job, instance = start(client_for(alice), params, 400, 40, 50, template="lora_sim")
    # Replication copies each checkpoint to us-west-2, the other region with T4 capacity.
    replica = wait_until(
        lambda: (
            CheckpointReplica.objects.filter(
                checkpoint__job_id=job["id"], region__code="us-west-2", status="ready"
            )
            .select_related("checkpoint__job__project")
            .first()
        ),
        timeout=60,
    )
    # The frozen base (the largest chunk) is shared by every later checkpoint: rot it there.
    checkpoint = replica.checkpoint
    with replication.open_region("us-west-2", checkpoint.job) as store:
        chunks = store.load_manifest(checkpoint.manifest_key).chunks()
    base = max(chunks, key=lambda chunk: chunks[chunk])
    url = replication.region_store("us-west-2", checkpoint.job.project.slug).url
    rotten = ROOT / url.removeprefix("file://") / "chunks" / base[:2] / base
    rotten.write_bytes(b"\xff" * chunks[base])
    # us-east-1 goes away: the job can only move to us-west-2.
    CapacityPool.objects.filter(region__code="us-east-1").update(enabled=False)

    interrupt(staff_client, instance, 0, 20)

    done = finished(job["id"], timeout=180)
    assert done.state == "succeeded", (done.error, kinds(job["id"]))
    assert done.result is not None and done.result["step"] == 400
    migration = Migration.objects.get(job_id=job["id"])
    assert migration.rollbacks >= 1
    events = list(TimelineEvent.objects.filter(migration=migration).order_by("id"))
    order = [e.kind for e in events]
    failed, rolled = order.index("validation_failed"), order.index("rollback")
    assert failed < rolled < order.index("restore_done") < order.index("validation_passed")
    rollback = events[rolled].data
    assert rollback["to_step"] < rollback["from_step"]
    assert "corrupt" in rollback["reason"]
    restored = next(e for e in events[rolled:] if e.kind == "restore_done")
    assert restored.data["step"] == rollback["to_step"]
    assert Instance.objects.get(job_id=job["id"], state="released", migration=migration)

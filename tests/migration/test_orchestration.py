"""The migration's phases as the portal drives them from agents' reports, without processes:
the capacity backend is replaced by a recorder (the end-to-end tests run the real one)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Job
from migration import interruptions, orchestration, services
from migration.agent_tokens import issue_agent_token
from migration.backends import AgentSpec, BackendStatus
from migration.checkpoint import open_store
from migration.checkpoint.sdk import Checkpointer
from migration.choices import MIGRATION_TIMELINE
from migration.models import CapacityPool, Checkpoint, Instance, Migration, TimelineEvent
from portal import enqueue
from tests.conftest import submit

pytestmark = pytest.mark.django_db


class Recorder:
    """Stands in for the local backend and the broker: remembers what it was asked to do."""

    name = "local"

    def __init__(self) -> None:
        self.launched: list[tuple[int, AgentSpec]] = []
        self.released: list[tuple[int, float]] = []
        self.tasks: list[tuple[str, tuple[Any, ...]]] = []

    def send_task(self, name: str, args: tuple[Any, ...] = (), **options: Any) -> None:
        self.tasks.append((name, tuple(args)))

    def launch(self, instance: Instance, agent: AgentSpec) -> str:
        self.launched.append((instance.pk, agent))
        return str(10_000 + instance.pk)

    def release(self, instance: Instance, grace_s: float = 0.0) -> None:
        self.released.append((instance.pk, grace_s))

    def describe(self, instance: Instance) -> BackendStatus:
        return BackendStatus("running")


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    for module in (orchestration, services):
        monkeypatch.setattr(module, "get_backend", lambda name: recorder)
    monkeypatch.setattr(enqueue, "app", recorder)
    return recorder


def agents_of(job: Job, **filters: Any) -> dict[int, APIClient]:
    """An agent API client per instance of the job (a fresh token each)."""
    clients = {}
    for instance in Instance.objects.filter(job=job, **filters).order_by("rank"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Agent {issue_agent_token(instance)}")
        clients[instance.rank] = client
    return clients


class Agent:
    """One instance's agent: numbered events, as the real one sends them."""

    def __init__(self, client: APIClient) -> None:
        self.client = client
        self.seq = 0

    def send(self, type: str, **fields: Any) -> Any:
        self.seq += 1
        event = {"seq": self.seq, "type": type, **fields}
        return self.client.post("/api/agent/events/", {"events": [event]}, format="json")

    def checkpoint(self, job: Job, step: int, kind: str, rank: int = 0) -> None:
        key = f"jobs/{job.checkpoint_key}/manifests/{step:012d}-{kind}-r{rank}.json"
        self.send(
            "checkpoint",
            manifest=key,
            step=step,
            kind=kind,
            bytes_total=1000,
            bytes_new=100,
            validation_reference=0.5,
            rank=rank,
        )


def kinds(job: Job) -> list[str]:
    return list(TimelineEvent.objects.filter(job=job).values_list("kind", flat=True))


def running_job(alice: Any, catalogue: Any, backend: Recorder, nodes: int = 1) -> Any:
    job = submit(alice, catalogue, nodes=nodes, total_steps=1000)
    services.place_job(job.pk)
    assert orchestration.start_job(job.pk) == nodes
    agents = {rank: Agent(c) for rank, c in agents_of(job).items()}
    for agent in agents.values():
        agent.send("self_check", ok=True)
    job.refresh_from_db()
    assert job.state == "running"
    return job, agents


def test_a_placed_job_is_launched_once_with_its_environment(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job = submit(alice, catalogue, checkpoint_every_steps=25)
    services.place_job(job.pk)

    assert orchestration.start_job(job.pk) == 1
    assert orchestration.start_job(job.pk) == 0  # a retried task starts nothing more

    ((instance_id, spec),) = backend.launched
    env = spec.environ
    assert env["BATON_JOB_ID"] == job.checkpoint_key
    assert env["BATON_RANK"] == "0" and env["BATON_WORLD_SIZE"] == "1"
    assert env["BATON_RESUME"] == ""
    assert env["BATON_CHECKPOINT_EVERY_STEPS"] == "25"
    assert env["BATON_STORE_URL"].startswith("file://")
    assert env["BATON_STORE_URL"].endswith(f"/us-east-1/{job.project.slug}")
    assert f"/imds/{instance_id}/" in env["BATON_METADATA_URL"]
    assert spec.argv[1:4] == ["-m", "migration.agent", "--"]
    assert spec.argv[4:7] == [spec.argv[0], "-m", "jobs.workloads.mlp_numpy"]
    assert Instance.objects.get(pk=instance_id).backend_id == str(10_000 + instance_id)


def test_a_new_job_never_resumes_from_checkpoints_left_under_its_id(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    # Ids start again with a new database, and two portals may share a store: what a job of
    # the same id left in the region's store must not become this job's starting point.
    job = submit(alice, catalogue)
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    ((_, spec),) = backend.launched
    env = spec.environ
    with open_store(env["BATON_STORE_URL"]) as stale:
        stale.save(str(job.pk), 900, {"w": np.ones(1000, np.float32)})

    with Checkpointer.from_env(env, install_signal_handlers=False) as checkpointer:
        assert checkpointer.restore() is None
    assert env["BATON_JOB_ID"].startswith(f"{job.pk}-")  # readable in a store's listing
    assert submit(alice, catalogue).checkpoint_key != job.checkpoint_key


def test_an_interruption_moves_the_job_through_every_phase_in_order(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    old = agents[0]
    old.checkpoint(job, 40, "periodic")
    old.send("progress", step=57)

    old.send("notice", level="advance", source="imds")
    migration = Migration.objects.get(job=job)
    advance = TimelineEvent.objects.get(job=job, kind="notice_advance")
    assert advance.data["target"]["pool"] == migration.to_pool_id  # pre-reserved, named
    old.send("notice", level="final", source="imds", deadline="2030-01-01T00:00:00Z")
    job.refresh_from_db()
    assert job.state == "migrating"
    old.checkpoint(job, 57, "emergency")
    old.send("exit", reason="preempted", returncode=0)

    job.refresh_from_db()
    assert job.interruptions == 1
    services.place_job(job.pk)
    job.refresh_from_db()
    assert job.state == "starting" and job.pool_id == migration.to_pool_id
    orchestration.start_job(job.pk)
    new = Instance.objects.get(job=job, migration=migration)
    assert new.resume_manifest == f"jobs/{job.checkpoint_key}/manifests/{57:012d}-emergency-r0.json"
    agent = Agent(agents_of(job, pk=new.pk)[0])
    agent.send("self_check", ok=True)
    agent.send("restore", manifest=new.resume_manifest, step=57, val_loss=0.5, reference=0.5)

    job.refresh_from_db()
    migration.refresh_from_db()
    assert job.state == "running"
    assert migration.phase == "done" and migration.lost_steps == 0
    assert kinds(job)[-11:] == list(MIGRATION_TIMELINE)
    assert migration.timings["total"] >= 0 and "restore_done" in migration.timings


def test_a_missed_emergency_checkpoint_resumes_from_the_last_periodic_one(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    agents[0].checkpoint(job, 40, "periodic")
    agents[0].send("progress", step=57)
    agents[0].send("notice", level="final", source="imds")
    agents[0].send("exit", reason="preempted", returncode=None, signal="SIGKILL")

    missed = TimelineEvent.objects.get(job=job, kind="checkpoint_missed")
    assert missed.data["step"] == 40 and missed.data["lost_steps"] == 17
    assert Migration.objects.get(job=job).lost_steps == 17


def test_a_final_notice_on_one_rank_reaches_every_rank_of_the_gang(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job, agents = running_job(alice, catalogue, backend, nodes=2)
    agents[1].send("notice", level="final", source="imds")

    rank0 = Instance.objects.get(job=job, rank=0)
    assert rank0.final_notice_at is not None and rank0.reclaim_at is not None
    # Rank 0's emergency checkpoint alone is not the gang's.
    agents[0].checkpoint(job, 30, "emergency", rank=0)
    assert "checkpoint_committed" not in kinds(job)
    agents[1].checkpoint(job, 30, "emergency", rank=1)
    assert kinds(job).count("checkpoint_committed") == 1

    agents[0].send("exit", reason="preempted")
    assert "released" not in kinds(job)  # rank 1 still holds its slot
    agents[1].send("exit", reason="preempted")
    assert "released" in kinds(job)


def test_a_restore_that_does_not_match_its_reference_rolls_back_to_the_previous_checkpoint(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    agents[0].checkpoint(job, 20, "periodic")
    agents[0].send("notice", level="final", source="imds")
    agents[0].checkpoint(job, 33, "emergency")
    agents[0].send("exit", reason="preempted")
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    agent = Agent(agents_of(job, state="provisioning")[0])
    agent.send("self_check", ok=True)

    agent.send("restore", step=33, val_loss=9.0, reference=0.5)

    assert kinds(job)[-3:] == ["restore_done", "validation_failed", "rollback"]
    assert set(Checkpoint.objects.filter(step=33).values_list("status", flat=True)) == {"corrupt"}
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    again = Instance.objects.get(job=job, state="provisioning")
    assert again.resume_manifest.endswith(f"{20:012d}-periodic-r0.json")
    agent = Agent(agents_of(job, pk=again.pk)[0])
    agent.send("self_check", ok=True)
    agent.send("restore", step=20, val_loss=0.5, reference=0.5)
    job.refresh_from_db()
    assert job.state == "running"
    assert Migration.objects.get(job=job).rollbacks == 1


def test_a_final_notice_or_a_reclaim_starts_the_spot_pools_spell_of_room_again(
    catalogue: Any, alice: Any, backend: Recorder, django_capture_on_commit_callbacks: Any
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    instance = Instance.objects.select_related("pool").get(job=job)
    pools = CapacityPool.objects.filter(pk=instance.pool_id)
    assert instance.pool.market == "spot" and instance.pool.last_preempted_at is None

    agents[0].send("notice", level="advance", source="imds")
    assert pools.get().last_preempted_at is None  # a rebalance recommendation takes nothing
    before = timezone.now()
    agents[0].send("notice", level="final", source="imds")
    noticed = pools.get().last_preempted_at
    assert noticed is not None and noticed >= before

    # A reclaim counts on its own, for an agent that never reported the notice.
    pools.update(last_preempted_at=None)
    Instance.objects.filter(pk=instance.pk).update(reclaim_at=timezone.now() - timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert interruptions.reclaim_instance(instance.pk)
    reclaimed = pools.get().last_preempted_at
    assert reclaimed is not None and reclaimed >= noticed
    assert not CapacityPool.objects.filter(market="on_demand", last_preempted_at__isnull=False)


def test_a_released_instances_token_is_refused(
    catalogue: Any, alice: Any, backend: Recorder, django_capture_on_commit_callbacks: Any
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    agents[0].send("notice", level="final", source="imds")
    instance = Instance.objects.get(job=job)

    Instance.objects.filter(pk=instance.pk).update(reclaim_at=instance.created_at)
    with django_capture_on_commit_callbacks(execute=True):
        assert interruptions.reclaim_instance(instance.pk)

    assert agents[0].send("heartbeat", step=99).status_code == 401
    assert (instance.pk, 0.0) in backend.released


def test_an_instance_that_cannot_hear_notices_moves_its_job_to_on_demand_for_good(
    catalogue: Any, alice: Any, backend: Recorder, django_capture_on_commit_callbacks: Any
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    assert job.market == "spot"

    with django_capture_on_commit_callbacks(execute=True):
        agents[0].send("listener_failed", recovered=False, error="endpoint gone")

    job.refresh_from_db()
    migration = Migration.objects.get(job=job)
    assert job.on_demand_only and job.state == "migrating"
    assert migration.trigger == "awareness_abnormal"
    assert backend.released  # the gang was asked to stop (SIGTERM, then a grace period)
    agents[0].send("exit", reason="preempted")
    services.place_job(job.pk)
    job.refresh_from_db()
    assert job.market == "on_demand"


def test_a_staff_interrupt_schedules_both_notices_and_refuses_what_is_not_running(
    catalogue: Any, alice: Any, make_user: Any, client_for: Any, backend: Recorder
) -> None:
    job, _agents = running_job(alice, catalogue, backend)
    instance = Instance.objects.get(job=job)
    staff = client_for(make_user("operator", staff=True))
    url = f"/api/instances/{instance.pk}/interrupt/"

    assert client_for(alice).post(url, {}, format="json").status_code == 403
    bad = staff.post(url, {"advance_notice_s": -1}, format="json")
    assert bad.status_code == 400 and "advance_notice_s" in bad.json()
    answer = staff.post(url, {"advance_notice_s": 5, "final_window_s": 20}, format="json")
    assert answer.status_code == 202
    instance.refresh_from_db()
    assert instance.advance_notice_at is not None and instance.final_notice_at is not None
    assert instance.reclaim_at is not None
    assert (instance.final_notice_at - instance.advance_notice_at).total_seconds() == 5
    assert (instance.reclaim_at - instance.final_notice_at).total_seconds() == 20
    assert staff.post(url, {}, format="json").status_code == 409  # already under notice


def test_a_spot_job_whose_deadline_is_at_risk_moves_to_on_demand(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    from migration import sweeps

    relaxed, _ = running_job(alice, catalogue, backend)
    job = submit(alice, catalogue, total_steps=1000, expected_hours=10.0)
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    agent = Agent(agents_of(job)[0])
    agent.send("self_check", ok=True)
    # Ten hours of work left and ten hours and a minute to the deadline: no room for restarts.
    Job.objects.filter(pk=job.pk).update(deadline=timezone.now() + timedelta(hours=10, minutes=1))

    assert sweeps.review_markets() == 1

    job.refresh_from_db()
    migration = Migration.objects.get(job=job)
    assert job.state == "migrating" and migration.trigger == "policy"
    notice = TimelineEvent.objects.get(job=job, kind="notice_final")
    assert notice.data["source"] == "policy" and "Deadline" in notice.data["reason"]
    assert not Migration.objects.filter(job=relaxed).exists()  # no deadline: never reviewed
    # Baton's own stop is not the market taking the instance back: the spot pool's spell goes on.
    agent.send("notice", level="final", source="sigterm")
    agent.send("notice", level="final", source="imds")  # as a gang's other ranks would see it
    assert job.market == "spot"
    assert CapacityPool.objects.get(pk=job.pool_id).last_preempted_at is None


def test_a_new_instance_reclaimed_before_its_restore_is_judged_starts_again_from_its_checkpoint(
    catalogue: Any, alice: Any, backend: Recorder
) -> None:
    job, agents = running_job(alice, catalogue, backend)
    agents[0].send("notice", level="final", source="imds")
    agents[0].checkpoint(job, 44, "emergency")
    agents[0].send("exit", reason="preempted")
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    first = Instance.objects.get(job=job, state="provisioning")
    Agent(agents_of(job, pk=first.pk)[0]).send("self_check", ok=True)

    Instance.objects.filter(pk=first.pk).update(reclaim_at=first.created_at)
    interruptions.reclaim_instance(first.pk)

    job.refresh_from_db()
    assert job.state == "migrating"
    assert set(Checkpoint.objects.values_list("status", flat=True)) == {"committed"}
    services.place_job(job.pk)
    orchestration.start_job(job.pk)
    second = Instance.objects.get(job=job, state="provisioning")
    assert second.resume_manifest == first.resume_manifest
    assert kinds(job).count("replica_ready") == 2  # made ready again for the new placement

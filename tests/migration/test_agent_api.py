"""The portal side of the agent API: token auth, at-most-once batches, and what each report
does to instances, jobs, checkpoints and the timeline."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from jobs.models import Job
from migration import agent_reports, services
from migration.agent_tokens import issue_agent_token
from migration.models import Checkpoint, Instance, InterruptionEvent, LogLine, TimelineEvent
from tests.conftest import placed_instance, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed(catalogue: Any, alice: Any) -> dict[str, Any]:
    """A two-node job placed on spot, with an agent client per rank."""
    job = submit(alice, catalogue, nodes=2)
    services.place_job(job.pk)
    agents = []
    for instance in Instance.objects.filter(job=job).order_by("rank"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Agent {issue_agent_token(instance)}")
        agents.append(client)
    return {"job": job, "agents": agents}


def send(agent: APIClient, *events: dict[str, Any]) -> Any:
    return agent.post("/api/agent/events/", {"events": list(events)}, format="json")


def kinds(job: Job) -> list[str]:
    return list(TimelineEvent.objects.filter(job=job).values_list("kind", flat=True))


def test_an_unknown_token_is_refused(placed: dict[str, Any]) -> None:
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Agent not-a-token")

    assert send(stranger, {"seq": 1, "type": "heartbeat"}).status_code == 401


def test_a_user_token_cannot_speak_for_an_agent_and_an_agent_token_opens_nothing_else(
    placed: dict[str, Any], alice: Any, client_for: Any
) -> None:
    user = client_for(alice)
    agent = placed["agents"][0]

    assert send(user, {"seq": 1, "type": "heartbeat"}).status_code in (401, 403)
    assert agent.get("/api/jobs/").status_code in (401, 403)


def test_the_job_runs_once_every_rank_has_checked_in(placed: dict[str, Any]) -> None:
    job = placed["job"]
    first, second = placed["agents"]

    send(first, {"seq": 1, "type": "self_check", "ok": True, "checks": {"imds": "ok"}})
    job.refresh_from_db()
    assert job.state == "starting"
    send(second, {"seq": 1, "type": "self_check", "ok": True})

    job.refresh_from_db()
    assert job.state == "running"
    assert kinds(job)[-3:] == ["instance_started", "instance_started", "running"]
    assert not Instance.objects.filter(job=job, state="provisioning").exists()


def test_a_batch_sent_twice_is_applied_once(placed: dict[str, Any]) -> None:
    agent = placed["agents"][0]
    batch = [
        {"seq": 1, "type": "self_check", "ok": True},
        {"seq": 2, "type": "notice", "level": "advance", "source": "imds"},
    ]

    first = send(agent, *batch).json()
    again = send(
        agent,
        *batch,
        {
            "seq": 3,
            "type": "notice",
            "level": "final",
            "source": "imds",
            "deadline": "2030-01-01T00:00:00Z",
        },
    ).json()

    assert first == {"acked": 2} and again == {"acked": 3}
    assert InterruptionEvent.objects.filter(level="advance").count() == 1
    assert kinds(placed["job"]).count("notice_advance") == 1
    assert kinds(placed["job"]).count("notice_final") == 1


def test_only_the_gangs_emergency_checkpoint_appears_on_the_timeline(
    placed: dict[str, Any],
) -> None:
    job = placed["job"]
    first, second = placed["agents"]

    def checkpoint(seq: int, step: int, kind: str, rank: int) -> dict[str, Any]:
        return {
            "seq": seq,
            "type": "checkpoint",
            "manifest": f"jobs/{job.checkpoint_key}/manifests/{step:012d}-{kind}-r{rank}.json",
            "step": step,
            "kind": kind,
            "bytes_new": 10,
            "bytes_total": 100,
            "rank": rank,
            "world_size": 2,
            "validation_reference": 0.5,
        }

    send(
        first,
        {"seq": 1, "type": "self_check", "ok": True},
        checkpoint(2, 20, "periodic", 0),
        {"seq": 3, "type": "notice", "level": "final", "source": "imds"},
        checkpoint(4, 25, "emergency", 0),
    )
    assert "checkpoint_committed" not in kinds(job)  # rank 1 has not saved step 25 yet
    send(second, checkpoint(1, 25, "emergency", 1))

    assert list(Checkpoint.objects.values_list("step", "kind", "status")) == [
        (20, "periodic", "committed"),
        (25, "emergency", "committed"),
        (25, "emergency", "committed"),
    ]
    committed = TimelineEvent.objects.get(kind="checkpoint_committed")
    assert committed.data["step"] == 25
    region = Checkpoint.objects.filter(step=25).first()
    assert region is not None and region.region is not None
    assert region.region.code == "us-east-1"


def test_a_checkpoint_report_with_a_malformed_manifest_key_is_ignored(
    placed: dict[str, Any],
) -> None:
    bad = {"seq": 1, "type": "checkpoint", "manifest": "../../etc/passwd", "step": 3}
    answer = send(placed["agents"][0], {**bad, "kind": "periodic"})

    assert answer.status_code == 200
    assert not Checkpoint.objects.exists()


def test_progress_of_rank_zero_moves_the_job(placed: dict[str, Any]) -> None:
    first, second = placed["agents"]

    send(first, {"seq": 1, "type": "progress", "step": 42, "val_loss": 0.3})
    send(second, {"seq": 1, "type": "progress", "step": 7})

    placed["job"].refresh_from_db()
    assert placed["job"].step == 42


def test_a_finished_gang_with_a_result_succeeds(placed: dict[str, Any]) -> None:
    job = placed["job"]
    first, second = placed["agents"]
    for agent in (first, second):
        send(agent, {"seq": 1, "type": "self_check", "ok": True})
    result = {"step": 100, "val_loss": 0.12, "weights_sha256": "ab" * 32}

    send(
        first,
        {"seq": 2, "type": "result", **result},
        {"seq": 3, "type": "exit", "reason": "finished", "returncode": 0},
    )
    job.refresh_from_db()
    assert job.state == "running"  # rank 1 still works
    send(second, {"seq": 2, "type": "exit", "reason": "finished", "returncode": 0})

    job.refresh_from_db()
    assert job.state == "succeeded" and job.result == result and job.step == 100
    assert kinds(job)[-1] == "succeeded"
    assert set(Instance.objects.filter(job=job).values_list("state", flat=True)) == {"released"}


def test_a_failed_rank_fails_the_job_and_releases_the_gang(placed: dict[str, Any]) -> None:
    job = placed["job"]
    first, second = placed["agents"]
    for agent in (first, second):
        send(agent, {"seq": 1, "type": "self_check", "ok": True})

    send(
        second, {"seq": 2, "type": "exit", "reason": "failed", "returncode": 3, "error": "CUDA OOM"}
    )

    job.refresh_from_db()
    assert job.state == "failed" and "CUDA OOM" in job.error
    assert dict(Instance.objects.filter(job=job).values_list("rank", "state")) == {
        0: "released",
        1: "failed",
    }


def test_a_listener_that_gives_up_marks_the_instance_abnormal(placed: dict[str, Any]) -> None:
    agent = placed["agents"][0]

    send(
        agent,
        {"seq": 1, "type": "listener_failed", "error": "boom", "restarts": 1, "recovered": True},
    )
    assert not Instance.objects.get(rank=0).awareness_abnormal
    send(
        agent,
        {"seq": 2, "type": "listener_failed", "error": "boom", "restarts": 5, "recovered": False},
    )

    assert Instance.objects.get(rank=0).awareness_abnormal


def test_a_failed_self_check_marks_the_instance_abnormal(placed: dict[str, Any]) -> None:
    send(
        placed["agents"][0],
        {"seq": 1, "type": "self_check", "ok": False, "checks": {"imds": "unreachable"}},
    )

    instance = Instance.objects.get(rank=0)
    assert instance.awareness_abnormal and instance.self_check is not None
    assert instance.self_check["checks"] == {"imds": "unreachable"}


def test_a_malformed_batch_is_refused_with_field_errors(placed: dict[str, Any]) -> None:
    response = send(placed["agents"][0], {"seq": 0, "type": "heartbeat"}, {"type": "heartbeat"})

    assert response.status_code == 400
    assert "events" in response.json()


def test_log_lines_are_stored_per_rank_and_drops_are_said(
    placed: dict[str, Any], alice: Any, client_for: Any
) -> None:
    first, second = placed["agents"]
    first.post(
        "/api/agent/logs/",
        {"lines": [{"rank": 0, "line": "step 1"}, {"rank": 0, "line": "step 2"}]},
        format="json",
    )
    answer = second.post(
        "/api/agent/logs/", {"lines": [{"rank": 1, "line": "hello"}], "dropped": 5}, format="json"
    ).json()

    job = placed["job"]
    lines = client_for(alice).get(f"/api/jobs/{job.pk}/logs/").json()
    rank1 = client_for(alice).get(f"/api/jobs/{job.pk}/logs/?rank=1").json()

    assert answer == {"stored": 2}
    assert [line["line"] for line in lines][:3] == ["step 1", "step 2", "hello"]
    assert "5 line(s) dropped" in rank1[-1]["line"]


def test_a_timestamp_without_a_zone_is_read_as_utc(placed: dict[str, Any]) -> None:
    from datetime import UTC, datetime

    send(placed["agents"][0], {"seq": 1, "type": "heartbeat", "at": "2030-01-01T12:00:00"})

    assert Instance.objects.get(rank=0).last_heartbeat == datetime(2030, 1, 1, 12, tzinfo=UTC)


def in_thread(work: Callable[[], object]) -> threading.Thread:
    """Run `work` on a thread with a database connection of its own."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@contextmanager
def event_batch_held(instance: Instance, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An event batch of `instance` inside its transaction, holding its locks, for the block."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks exist on PostgreSQL only")
    holding, release = threading.Event(), threading.Event()
    heartbeat = agent_reports.HANDLERS["heartbeat"]

    def slow_heartbeat(instance: Instance, job: Job, event: dict[str, Any]) -> None:
        heartbeat(instance, job, event)
        if event.get("hold"):
            holding.set()
            release.wait(20)

    monkeypatch.setitem(agent_reports.HANDLERS, "heartbeat", slow_heartbeat)
    batch = [{"seq": 1, "type": "heartbeat", "hold": True}]
    events = in_thread(lambda: agent_reports.record_agent_events(instance.pk, batch))
    try:
        assert holding.wait(10), "the event batch never took its locks"
        yield
    finally:
        release.set()
        events.join(20)
    instance.refresh_from_db()
    assert instance.last_event_seq == 1


def finishes_within(seconds: float, work: Callable[[], object]) -> bool:
    thread = in_thread(work)
    thread.join(seconds)
    return not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_log_lines_go_in_while_an_event_batch_holds_its_job_and_instance(
    placed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An event batch locks the job and the instance while it applies; log lines are rows that
    # reference both. Under FOR UPDATE locks the lines waited, and a batch of lines and a
    # batch of events taking the two rows in opposite orders deadlocked on PostgreSQL.
    instance = Instance.objects.filter(job=placed["job"]).order_by("rank").first()
    assert instance is not None
    with event_batch_held(instance, monkeypatch):
        lines = [{"line": "step 1"}]
        assert finishes_within(5, lambda: agent_reports.record_log_lines(instance.pk, lines)), (
            "log lines waited for the event batch's locks"
        )
    assert LogLine.objects.filter(instance=instance, line="step 1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_event_batches_of_two_jobs_in_one_pool_do_not_wait_for_each_other(
    catalogue: Any, alice: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An event batch reads its instance's pool and region with the instance; locking them too
    # made every instance of a pool wait for the others' event batches.
    first, second = (placed_instance(alice, catalogue) for _ in range(2))
    assert first.pool_id == second.pool_id
    with event_batch_held(first, monkeypatch):
        batch = [{"seq": 1, "type": "heartbeat"}]
        assert finishes_within(5, lambda: agent_reports.record_agent_events(second.pk, batch)), (
            "an event batch waited for another job's batch in the same pool"
        )
    second.refresh_from_db()
    assert second.last_event_seq == 1

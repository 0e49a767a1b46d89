"""Events reach the portal in order, once each, across outages, lost answers and restarts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from migration.agent.outbox import EventOutbox
from migration.agent.portal import Backoff, PortalClient
from tests.migration.agent.conftest import TOKEN, AgentRun, FakePortal, signal_workload, wait_until


def make_outbox(portal: FakePortal, path: Path | None, **kwargs: Any) -> EventOutbox:
    client = PortalClient(portal.url, TOKEN, timeout=5)
    return EventOutbox(path, client, backoff=Backoff(0.05, 0.2), **kwargs)


def stored_numbers(portal: FakePortal) -> list[int]:
    return [int(e["n"]) for e in portal.events if "n" in e]


def test_events_are_buffered_through_an_outage_and_delivered_in_order_once(
    portal: FakePortal, tmp_path: Path
) -> None:
    outbox = make_outbox(portal, tmp_path / "outbox.json", batch_size=7)
    outbox.start()
    for n in range(1, 21):
        outbox.emit("checkpoint", n=n)
    wait_until(lambda: len(portal.events) == 20, message="the first 20 events")
    portal.down()
    for n in range(21, 61):
        outbox.emit("checkpoint", n=n)
    assert json.loads((tmp_path / "outbox.json").read_text())["events"], "buffered on disk"
    portal.up()
    for n in range(61, 81):
        outbox.emit("checkpoint", n=n)
    assert outbox.close(timeout=30)
    assert stored_numbers(portal) == list(range(1, 81))
    assert [e["seq"] for e in portal.events] == list(range(1, 81))
    assert outbox.pending == 0


def test_a_batch_whose_answer_was_lost_is_sent_again_with_the_same_seqs(
    portal: FakePortal, tmp_path: Path
) -> None:
    portal.lose_answers = 3
    outbox = make_outbox(portal, tmp_path / "outbox.json", batch_size=5)
    for n in range(1, 13):
        outbox.emit("checkpoint", n=n)
    outbox.start()
    assert outbox.close(timeout=30)
    assert stored_numbers(portal) == list(range(1, 13))
    # Every copy the portal received of a seq is the same event.
    by_seq: dict[object, list[object]] = {}
    for event in portal.received:
        by_seq.setdefault(event["seq"], []).append(event["n"])
    assert len(portal.received) > 12, "the lost answers caused re-sends"
    assert all(len(set(copies)) == 1 for copies in by_seq.values())


def test_buffered_events_survive_an_agent_restart_and_numbering_continues(
    portal: FakePortal, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.json"
    portal.down()
    first = make_outbox(portal, path)
    first.start()
    for n in range(1, 6):
        first.emit("checkpoint", n=n)
    # The agent dies with events in flight (numbered, never acknowledged).
    wait_until(lambda: json.loads(path.read_text())["next_seq"] > 1, message="a numbered batch")
    assert not first.close(timeout=0)
    portal.up()
    second = make_outbox(portal, path)
    second.emit("checkpoint", n=6)
    second.start()
    assert second.close(timeout=30)
    assert stored_numbers(portal) == [1, 2, 3, 4, 5, 6]
    assert [e["seq"] for e in portal.events] == [1, 2, 3, 4, 5, 6]


def test_a_newer_heartbeat_replaces_an_unsent_one(portal: FakePortal) -> None:
    portal.down()
    outbox = make_outbox(portal, None)
    outbox.emit("heartbeat", step=1)
    outbox.emit("progress", step=1)
    outbox.emit("notice", level="final")
    outbox.emit("heartbeat", step=2)
    outbox.emit("progress", step=2)
    outbox.emit("heartbeat", step=3)
    portal.up()
    outbox.start()
    assert outbox.close(timeout=30)
    assert [(e["type"], e.get("step")) for e in portal.events] == [
        ("notice", None),
        ("progress", 2),
        ("heartbeat", 3),
    ]


def test_the_buffer_is_bounded_and_counts_what_it_dropped(portal: FakePortal) -> None:
    portal.down()
    outbox = make_outbox(portal, None, max_events=10)
    for n in range(1, 26):
        outbox.emit("checkpoint", n=n)
    assert outbox.pending == 10
    assert outbox.dropped == 15
    portal.up()
    outbox.start()
    assert outbox.close(timeout=30)
    assert stored_numbers(portal) == list(range(16, 26))


def test_an_agent_run_across_a_portal_outage_loses_and_repeats_nothing(
    start_agent: Callable[..., AgentRun], portal: FakePortal, tmp_path: Path
) -> None:
    portal.down()
    run = start_agent(
        signal_workload(str(tmp_path / "signals"), "--steps", "60", "--report"),
        BATON_AGENT_FLUSH_TIMEOUT="60",
    )
    wait_until(lambda: (run.agent_dir / "outbox.json").exists(), message="buffered events")
    wait_until(lambda: "final step=60" in run.output(), message="the workload to finish")
    portal.up()
    assert run.wait() == 0
    seqs = [e["seq"] for e in portal.events]
    assert seqs == list(range(1, len(seqs) + 1))
    types = portal.types()
    assert types[0] == "self_check"
    assert types[-1] == "exit"
    assert types.count("result") == 1
    assert portal.of_type("exit")[0]["reason"] == "finished"

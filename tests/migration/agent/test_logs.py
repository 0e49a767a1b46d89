"""Workload output: every line in the rank's log file, batched and bounded towards the portal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from migration.agent.logs import LogForwarder, clip
from migration.agent.portal import Backoff, PortalClient
from tests.migration.agent.conftest import TOKEN, AgentRun, FakePortal, signal_workload, wait_until


def make_forwarder(portal: FakePortal, **kwargs: Any) -> LogForwarder:
    client = PortalClient(portal.url, TOKEN, timeout=5)
    return LogForwarder(
        client,
        rank=3,
        flush_interval=0.05,
        backoff=Backoff(0.05, 0.2),
        **kwargs,
    )


def test_lines_are_sent_in_batches_of_at_most_the_batch_size(portal: FakePortal) -> None:
    forwarder = make_forwarder(portal, batch_lines=40)
    forwarder.start()
    for n in range(1, 301):
        forwarder.add(f"line {n}")
    forwarder.close(timeout=30)
    assert [line["line"] for line in portal.lines] == [f"line {n}" for n in range(1, 301)]
    assert [line["n"] for line in portal.lines] == list(range(1, 301))
    assert {line["rank"] for line in portal.lines} == {3}
    assert max(len(post["lines"]) for post in portal.log_posts) <= 40
    assert all(post["dropped"] == 0 for post in portal.log_posts)


def test_while_the_portal_is_away_the_oldest_lines_are_dropped_and_counted(
    portal: FakePortal,
) -> None:
    portal.down()
    forwarder = make_forwarder(portal, max_lines=100, batch_lines=30)
    forwarder.start()
    for n in range(1, 5001):
        forwarder.add(f"line {n}")
    portal.up()
    forwarder.close(timeout=30)
    received = [int(str(line["line"]).split()[1]) for line in portal.lines]
    # At most the buffer plus the one batch that was in flight when the portal went away.
    assert len(received) <= 100 + 30
    assert received == sorted(received)
    assert received[-100:] == list(range(4901, 5001)), "the newest lines are kept"
    reported = sum(int(post["dropped"]) for post in portal.log_posts)
    assert reported == 5000 - len(received)
    assert forwarder.total_dropped == reported


def test_a_very_long_line_is_cut_and_says_so() -> None:
    line = clip("x" * 10_000, 200)
    assert len(line) == 200
    assert line.endswith("[9800 characters cut]")
    assert clip("short", 200) == "short"


def test_the_agent_keeps_every_line_locally_and_forwards_them(
    start_agent: Callable[..., AgentRun], portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(
        signal_workload(
            str(tmp_path / "signals"), "--steps", "20", "--spam", "2000", "--long-line", "20000"
        ),
        BATON_AGENT_LOG_BATCH="250",
        BATON_AGENT_MAX_LINE="1000",
    )
    assert run.wait() == 0
    local = run.output().splitlines()
    assert local[0] == "ready"
    assert local[1:2001] == [f"spam line {n}" for n in range(1, 2001)]
    assert local[2001] == "x" * 20000, "the local file keeps the line whole"
    assert local[-1].startswith("final step=20 ")
    wait_until(lambda: len(portal.lines) == len(local), message="every line forwarded")
    assert [line["line"] for line in portal.lines][:2001] == local[:2001]
    long_line = str(portal.lines[2001]["line"])
    assert len(long_line) == 1000 and long_line.endswith("characters cut]")
    assert max(len(post["lines"]) for post in portal.log_posts) <= 250

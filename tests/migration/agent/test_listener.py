"""A listener that dies is restarted; one that keeps dying is reported as unrecoverable."""

from __future__ import annotations

import threading
from collections.abc import Callable

from migration.agent.listener import FAILED, RUNNING, Listener
from tests.migration.agent.conftest import (
    AgentRun,
    FakeMetadata,
    FakePortal,
    signal_workload,
    wait_until,
)


class Poller:
    """A poll function that raises for its first `failures` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            self.calls += 1
            if self.calls <= self.failures:
                raise RuntimeError(f"poll {self.calls} broke")


def test_a_dead_listener_is_restarted_and_reported_as_recovered() -> None:
    reports: list[tuple[str, int, bool]] = []
    poller = Poller(failures=2)
    listener = Listener(
        poller, 0.01, lambda *r: reports.append(r), max_restarts=5, restart_window=60
    )
    listener.start()
    try:
        wait_until(lambda: poller.calls >= 10, message="polling to go on after two deaths")
        assert listener.state == RUNNING
        assert reports == [
            ("RuntimeError: poll 1 broke", 1, True),
            ("RuntimeError: poll 2 broke", 2, True),
        ]
    finally:
        listener.stop()


def test_a_listener_dying_too_often_is_reported_as_not_recovered() -> None:
    reports: list[tuple[str, int, bool]] = []
    poller = Poller(failures=10**6)
    listener = Listener(
        poller,
        0.01,
        lambda *r: reports.append(r),
        max_restarts=3,
        restart_window=60,
        slow_interval=0.05,
    )
    listener.start()
    try:
        wait_until(lambda: listener.state == FAILED, message="the listener to give up")
        calls_at_give_up = poller.calls
        assert [r[2] for r in reports] == [True, True, True, False]
        assert reports[-1][1] == 4
        # It keeps trying quietly after giving up, without more reports.
        wait_until(lambda: poller.calls > calls_at_give_up + 2, message="quiet retries")
        assert len(reports) == 4
    finally:
        listener.stop()


def test_deaths_outside_the_window_do_not_add_up() -> None:
    reports: list[tuple[str, int, bool]] = []
    calls = {"n": 0}
    gate = threading.Event()

    def poll() -> None:
        calls["n"] += 1
        # Die every few calls, slower than the window, for as long as the test lets it.
        if calls["n"] % 5 == 0 and not gate.is_set():
            raise RuntimeError("broke")

    listener = Listener(
        poll, 0.02, lambda *r: reports.append(r), max_restarts=1, restart_window=0.01
    )
    listener.start()
    try:
        wait_until(lambda: len(reports) >= 4, message="several restarts")
        gate.set()
        assert all(recovered for _, _, recovered in reports)
        assert listener.state != FAILED
    finally:
        listener.stop()


def test_the_agent_reports_a_listener_that_cannot_recover(
    start_agent: Callable[..., AgentRun],
    metadata: FakeMetadata,
    portal: FakePortal,
    tmp_path: object,
) -> None:
    metadata.always_fail = True
    record = str(tmp_path) + "/signals"
    run = start_agent(
        signal_workload(record, "--steps", "100000"),
        BATON_AGENT_LISTENER_MAX_RESTARTS="2",
        BATON_AGENT_LISTENER_RESTART_WINDOW="60",
    )
    wait_until(
        lambda: [e for e in portal.of_type("listener_failed") if e["recovered"] is False],
        message="listener_failed with recovered false",
    )
    assert "500" in portal.of_type("listener_failed")[-1]["error"]
    recovered = [e["recovered"] for e in portal.of_type("listener_failed")]
    assert recovered == [True, True, False]
    self_check = portal.of_type("self_check")[0]
    assert self_check["ok"] is False
    assert self_check["checks"]["metadata"]["ok"] is False
    assert self_check["checks"]["signals"]["ok"] is True
    wait_until(
        lambda: any(e["listener"] == "failed" for e in portal.of_type("heartbeat")),
        message="a heartbeat saying the listener failed",
    )
    # The workload keeps running: an instance without awareness is moved, not stopped.
    assert run.process.poll() is None

"""The agent supervising a real workload process through notices, signals and exits."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from migration.agent.runner import EXIT_FAILED, EXIT_FINISHED, EXIT_PREEMPTED
from tests.migration.agent.conftest import (
    AgentRun,
    FakeMetadata,
    FakePortal,
    signal_workload,
    wait_until,
)

StartAgent = Callable[..., AgentRun]


def received_signals(record: Path) -> list[str]:
    return record.read_text().split() if record.exists() else []


def started(run: AgentRun) -> None:
    wait_until(lambda: "step=10" in run.output(), message="the workload to make progress")


def test_an_sdk_workload_gets_sigusr1_on_the_advance_notice_then_sigterm_on_the_final(
    start_agent: StartAgent, metadata: FakeMetadata, portal: FakePortal, tmp_path: Path
) -> None:
    record = tmp_path / "signals"
    run = start_agent(signal_workload(str(record), "--report"))
    started(run)
    metadata.notice_advance()
    wait_until(lambda: received_signals(record) == ["SIGUSR1"], message="SIGUSR1")
    assert run.process.poll() is None, "the advance notice does not stop the workload"
    metadata.notice_final(in_seconds=30)
    assert run.wait() == EXIT_PREEMPTED
    assert received_signals(record) == ["SIGUSR1", "SIGTERM"]
    assert "stopped step=" in run.output()
    notices = portal.of_type("notice")
    assert [(n["level"], n["source"]) for n in notices] == [("advance", "imds"), ("final", "imds")]
    assert notices[1]["deadline"] is not None
    exit_event = portal.of_type("exit")[0]
    assert (exit_event["reason"], exit_event["returncode"], exit_event["killed"]) == (
        "preempted",
        0,
        False,
    )
    checkpoint = portal.of_type("checkpoint")[0]
    assert (checkpoint["kind"], checkpoint["rank"], checkpoint["world_size"]) == (
        "emergency",
        0,
        1,
    )
    types = portal.types()
    assert types.index("notice") < types.index("checkpoint") < types.index("exit")


def test_a_directory_mode_command_gets_no_signal_on_the_advance_notice(
    start_agent: StartAgent,
    metadata: FakeMetadata,
    portal: FakePortal,
    tmp_path: Path,
    store_url: str,
) -> None:
    record = tmp_path / "signals"
    run = start_agent(
        signal_workload(str(record)), BATON_AGENT_MODE="directory", BATON_STORE_URL=store_url
    )
    started(run)
    metadata.notice_advance()
    wait_until(lambda: portal.of_type("notice"), message="the advance notice reported")
    # Give a wrongly sent SIGUSR1 every chance to arrive before looking.
    wait_until(lambda: len(portal.of_type("heartbeat")) >= 3, message="two more heartbeats")
    assert received_signals(record) == []
    metadata.notice_final(in_seconds=30)
    assert run.wait() == EXIT_PREEMPTED
    assert received_signals(record) == ["SIGTERM"]
    assert portal.of_type("self_check")[0]["checks"]["signals"]["signals"] == ["SIGTERM"]


def test_a_workload_that_ignores_sigterm_is_killed_when_its_window_closes(
    start_agent: StartAgent, metadata: FakeMetadata, portal: FakePortal, tmp_path: Path
) -> None:
    record = tmp_path / "signals"
    run = start_agent(signal_workload(str(record), "--ignore-term"), BATON_AGENT_SAFETY_MARGIN="1")
    started(run)
    metadata.notice_final(in_seconds=3)
    noticed = time.monotonic()
    assert run.wait() == EXIT_PREEMPTED
    waited = time.monotonic() - noticed
    assert received_signals(record) == ["SIGTERM"]
    exit_event = portal.of_type("exit")[0]
    assert exit_event["signal"] == "SIGKILL"
    assert exit_event["killed"] is True
    assert exit_event["returncode"] is None
    # Window 3-4 s (whole seconds) minus the 1 s margin: not killed early.
    assert waited >= 2


def test_sigterm_to_the_agent_is_a_final_notice_with_the_grace_period(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    record = tmp_path / "signals"
    run = start_agent(signal_workload(str(record), "--report"), BATON_AGENT_GRACE_PERIOD="20")
    started(run)
    run.signal(signal.SIGTERM)
    assert run.wait() == EXIT_PREEMPTED
    assert received_signals(record) == ["SIGTERM"]
    notice = portal.of_type("notice")[0]
    assert (notice["level"], notice["source"]) == ("final", "sigterm")
    assert portal.of_type("exit")[0]["reason"] == "preempted"


def test_a_final_notice_window_shorter_than_the_margin_still_allows_a_moment(
    start_agent: StartAgent, metadata: FakeMetadata, portal: FakePortal, tmp_path: Path
) -> None:
    record = tmp_path / "signals"
    run = start_agent(
        signal_workload(str(record), "--ignore-term"), BATON_AGENT_SAFETY_MARGIN="120"
    )
    started(run)
    metadata.notice_final(in_seconds=5)
    assert run.wait() == EXIT_PREEMPTED
    assert received_signals(record) == ["SIGTERM"]
    notice = portal.of_type("notice")[0]
    exit_event = portal.of_type("exit")[0]
    assert exit_event["killed"] is True
    # The margin is larger than the window, yet the kill comes a second after the notice.
    waited = datetime.fromisoformat(exit_event["at"]) - datetime.fromisoformat(notice["at"])
    assert waited.total_seconds() >= 0.9


def test_a_finished_workload_is_reported_with_its_result_parsed_from_its_last_line(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(signal_workload(str(tmp_path / "signals"), "--steps", "30"))
    assert run.wait() == EXIT_FINISHED
    result = portal.of_type("result")
    assert len(result) == 1
    assert result[0]["source"] == "output"
    assert result[0]["step"] == 30 and result[0]["val_loss"] == 0.25
    assert len(str(result[0]["weights_sha256"])) == 64
    exit_event = portal.of_type("exit")[0]
    assert (exit_event["reason"], exit_event["returncode"]) == ("finished", 0)
    assert portal.types()[-2:] == ["result", "exit"]


def test_an_sdk_result_is_not_reported_twice(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(signal_workload(str(tmp_path / "signals"), "--steps", "30", "--report"))
    assert run.wait() == EXIT_FINISHED
    assert [r["source"] for r in portal.of_type("result")] == ["sdk"]
    assert [p["step"] for p in portal.of_type("progress")][-1] == 30


def test_a_failing_workload_fails_the_agent(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(signal_workload(str(tmp_path / "signals"), "--steps", "5", "--exit", "3"))
    assert run.wait() == EXIT_FAILED
    exit_event = portal.of_type("exit")[0]
    assert (exit_event["reason"], exit_event["returncode"]) == ("failed", 3)


def test_a_command_that_cannot_start_fails_the_agent(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent([str(tmp_path / "no-such-program")])
    assert run.wait() == EXIT_FAILED
    exit_event = portal.of_type("exit")[0]
    assert exit_event["reason"] == "failed"
    assert "no-such-program" in str(exit_event["error"])


def test_the_workload_gets_its_environment_and_reports_through_the_local_endpoint(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    record = tmp_path / "signals"
    run = start_agent(
        signal_workload(str(record), "--steps", "30", "--report"),
        BATON_RANK="1",
        BATON_WORLD_SIZE="2",
        BATON_MASTER_ADDR="10.1.2.3",
        BATON_CHECKPOINT_EVERY_STEPS="25",
    )
    run.rank = 1
    assert run.wait() == EXIT_FINISHED
    env = json.loads(record.with_name("signals.env.json").read_text())
    assert "BATON_AGENT_TOKEN" not in env
    assert env["BATON_AGENT_URL"].startswith("http://127.0.0.1:")
    assert (env["BATON_RANK"], env["BATON_WORLD_SIZE"]) == ("1", "2")
    assert env["BATON_MASTER_ADDR"] == "10.1.2.3"
    assert env["BATON_CHECKPOINT_EVERY_STEPS"] == "25"
    assert env["BATON_CHECKPOINT_DIR"] == str(run.checkpoint_dir)
    assert "final step=30" in run.output()
    assert {line["rank"] for line in portal.lines} == {1}
    assert portal.of_type("progress")


def test_heartbeats_carry_the_step_and_the_listener_state(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(signal_workload(str(tmp_path / "signals"), "--report"))
    wait_until(
        lambda: any(h["step"] for h in portal.of_type("heartbeat")),
        message="a heartbeat with a step",
    )
    heartbeat = [h for h in portal.of_type("heartbeat") if h["step"]][-1]
    assert heartbeat["listener"] == "ok"
    assert heartbeat["pid"]
    run.signal(signal.SIGINT)
    assert run.wait() == EXIT_PREEMPTED


def test_the_agent_runs_without_a_portal(metadata: FakeMetadata, tmp_path: Path) -> None:
    import subprocess

    from tests.migration.agent.conftest import agent_environment

    env = agent_environment(tmp_path, metadata, None, BATON_AGENT_DIR=str(tmp_path / "agent"))
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "migration.agent",
            "--",
            *signal_workload(str(tmp_path / "signals"), "--steps", "20"),
        ],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert finished.returncode == EXIT_FINISHED
    assert "final step=20" in (tmp_path / "agent" / "logs" / "rank-0.log").read_text()


def test_processes_the_workload_leaves_behind_are_killed_with_its_group(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    script = f"sleep 300 & echo $! > {pid_file}; echo started; exit 0"
    run = start_agent(["/bin/sh", "-c", script])
    assert run.wait() == EXIT_FINISHED
    child = int(pid_file.read_text())

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        # A zombie until its new parent reaps it: dead all the same.
        status = Path(f"/proc/{child}/stat")
        return status.exists() and status.read_text().split()[2] == "Z"

    wait_until(gone, message="the background child to be killed")
    assert run.output().splitlines() == ["started"]


def test_a_report_cannot_forge_the_event_envelope(
    start_agent: StartAgent, portal: FakePortal, tmp_path: Path
) -> None:
    run = start_agent(signal_workload(str(tmp_path / "signals")))
    started(run)
    env = json.loads((tmp_path / "signals.env.json").read_text())
    request = urllib.request.Request(
        env["BATON_AGENT_URL"] + "/checkpoint",
        data=json.dumps(
            {
                "seq": 10**6,
                "type": "exit",
                "event_type": "x",
                "manifest": "m",
                "step": 5,
                "kind": "periodic",
            }
        ).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read()) == {"ok": True}
    for path, body, status in (
        ("/nope", b"{}", 404),
        ("/progress", b"[1]", 400),
        ("/progress", b"not json", 400),
    ):
        bad = urllib.request.Request(env["BATON_AGENT_URL"] + path, data=body, method="POST")
        try:
            urllib.request.urlopen(bad, timeout=10)
        except urllib.error.HTTPError as exc:
            assert exc.code == status
        else:
            raise AssertionError(f"{path} {body!r} was accepted")
    wait_until(lambda: portal.of_type("checkpoint"), message="the checkpoint")
    checkpoint = portal.of_type("checkpoint")
    assert checkpoint[0]["seq"] < 10**6 and checkpoint[0]["manifest"] == "m"
    run.signal(signal.SIGTERM)
    assert run.wait() == EXIT_PREEMPTED
    seqs = [e["seq"] for e in portal.events]
    assert seqs == list(range(1, len(seqs) + 1))

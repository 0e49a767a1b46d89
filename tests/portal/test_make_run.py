"""`make run`'s launcher end to end: every process up, a job placed, a clean stop."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from tests.conftest import wait_until
from tests.portal.conftest import DEMO_PASSWORD


def test_it_prints_the_url_and_the_demo_login(stack: Any) -> None:
    output = wait_until(
        lambda: "Log in as" in (out := (stack.home / "launcher.log").read_text()) and out
    )

    assert f"running at {stack.base.replace('127.0.0.1', '127.0.0.1')}/" in output
    assert f"Log in as demo / {DEMO_PASSWORD}" in output


def test_a_submitted_job_is_placed_by_the_stacks_worker(stack: Any) -> None:
    status, body = stack.http(
        "POST", "/api/auth/token/", {"username": "demo", "password": DEMO_PASSWORD}
    )
    assert status == 200
    token = body["token"]
    pools = stack.http("GET", "/api/pools/", token=token)[1]
    first_spot = next(p for p in pools if p["market"] == "spot")
    job_body = {
        "workload": {"template": "mlp_numpy", "params": {"seed": 1}},
        "accelerator": first_spot["accelerator"],
        "total_steps": 100,
    }

    status, job = stack.http("POST", "/api/jobs/", job_body, token=token)
    assert status == 201, job

    def placed() -> Any:
        events = stack.http("GET", f"/api/jobs/{job['id']}/timeline/", token=token)[1]
        return next((e for e in events if e["kind"] == "placement_decided"), None)

    event = wait_until(placed, timeout=60, every=0.5)
    assert event["data"]["pool"] == first_spot["id"]


def test_each_process_logs_to_its_own_file(stack: Any) -> None:
    logs = {p.name for p in (stack.home / "logs").iterdir()}

    assert {"web.log", "worker-placement.log", "worker-data.log", "beat.log"} <= logs


# A stand-in agent launched through the local backend: like the real one, it starts its
# workload in a session of its own and passes a SIGTERM on to it.
STAND_IN_AGENT = (
    "import os, signal, subprocess, sys, time; "
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
    "start_new_session=True); "
    "open('workload', 'w').write(str(w.pid)); "
    "signal.signal(signal.SIGTERM, lambda *_: (os.killpg(w.pid, signal.SIGTERM), w.wait(), "
    "sys.exit(0))); "
    "time.sleep(600)"
)


def test_sigterm_stops_every_child_and_every_local_instance(stack: Any) -> None:
    """Stops the session's stack (the next test that needs one starts another)."""
    launched = stack.manage(
        "shell",
        "-c",
        "import sys; from migration.backends import AgentSpec, get_backend; "
        "from migration.models import Instance; "
        "print(get_backend('local').launch(Instance(pk=900001), "
        f"AgentSpec([sys.executable, '-c', {STAND_IN_AGENT!r}], {{}}, 0.0)))",
    )
    agent = int(launched.strip().splitlines()[-1])
    workload_file = stack.home / "instances" / "900001" / "workload"
    workload = int(wait_until(lambda: workload_file.exists() and workload_file.read_text()))
    pids = _descendants(stack.proc.pid)
    assert len(pids) >= 4  # web, two workers, beat (and the workers' pool processes)

    os.killpg(stack.proc.pid, signal.SIGTERM)
    stack.proc.wait(60)
    time.sleep(0.5)

    assert [pid for pid in [*pids, agent, workload] if _alive(pid)] == []
    assert stack.proc.returncode == 0
    ended = next(
        line for line in (stack.home / "launcher.log").read_text().splitlines() if "ended" in line
    )
    assert "900001" in ended


def _descendants(root: int) -> list[int]:
    import subprocess

    table = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    parents = dict(
        (int(pid), int(ppid)) for pid, ppid in (line.split() for line in table.splitlines())
    )
    found: list[int] = []
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
        found.extend(frontier)
    return found


def _alive(pid: int) -> bool:
    """Running, not merely waiting to be reaped: a local instance's processes are re-parented
    to init when the worker that launched them stops, and init reaps them in its own time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"

"""The local backend: an instance is a detached process group in its own folder, started after
its provisioning delay, ended as a whole, never signalled by mistake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from migration import services
from migration.backends import AgentSpec, get_backend, instance_dir, localproc
from migration.models import Instance
from tests.conftest import ROOT, submit, wait_until

pytestmark = pytest.mark.django_db

# A stand-in agent: records its environment, starts a grandchild, and waits.
SLEEPER = (
    "import os, subprocess, sys, time; "
    "open('started', 'w').write(os.environ['BATON_JOB_ID']); "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "open('grandchild', 'w').write(str(child.pid)); "
    "time.sleep(600)"
)


@pytest.fixture
def instance(catalogue: Any, alice: Any) -> Instance:
    job = submit(alice, catalogue)
    services.place_job(job.pk)
    found = Instance.objects.get(job=job)
    # Test databases roll back, so ids repeat between tests: start from an empty folder.
    shutil.rmtree(instance_dir(found.pk), ignore_errors=True)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def spec(delay: float = 0.0, **environ: str) -> AgentSpec:
    return AgentSpec(
        argv=[sys.executable, "-c", SLEEPER],
        environ={"BATON_JOB_ID": "7", **environ},
        delay_s=delay,
    )


def test_an_instance_starts_after_its_delay_in_its_own_folder_and_ends_as_a_group(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    folder = instance_dir(instance.pk)

    instance.backend_id = backend.launch(instance, spec(delay=1.0))
    assert backend.describe(instance).state == "provisioning"
    assert not (folder / "started").exists()
    wait_until(lambda: (folder / "grandchild").exists(), timeout=20)
    assert backend.describe(instance).state == "running"
    assert (folder / "started").read_text() == "7"
    assert (folder / "pid").read_text().strip() == instance.backend_id
    assert (folder / "agent.log").exists()
    grandchild = int((folder / "grandchild").read_text())

    backend.release(instance)
    wait_until(lambda: not alive(int(instance.backend_id)) and not alive(grandchild), timeout=10)
    assert backend.describe(instance).state == "gone"
    backend.release(instance)  # twice is fine


def test_a_second_launch_of_a_live_instance_starts_nothing(instance: Instance) -> None:
    backend = get_backend("local")
    first = backend.launch(instance, spec())
    try:
        assert backend.launch(instance, spec()) == first
    finally:
        instance.backend_id = first
        backend.release(instance)


def test_the_agent_gets_its_environment_and_none_of_the_portals_secrets(
    instance: Instance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/baton")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "do-not-leak")
    environ = localproc.agent_environment({"BATON_JOB_ID": "7"})

    assert environ["BATON_JOB_ID"] == "7"
    assert "PATH" in environ
    assert "DATABASE_URL" not in environ and "DJANGO_SECRET_KEY" not in environ


def test_a_pid_that_is_no_longer_the_instances_is_never_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "9").mkdir()
        (tmp_path / "9" / "pid").write_text(f"{stranger.pid}\n")  # a reused pid, say

        assert localproc.end_all(tmp_path, grace_s=0.2) == []
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_an_instance_outlives_the_process_that_launched_it(instance: Instance) -> None:
    # The launch happens in a short-lived process (as in a worker that restarts).
    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'; "
        "django.setup(); "
        "from migration.backends import AgentSpec, get_backend; "
        "from migration.models import Instance; "
        f"i = Instance(pk={instance.pk}); "
        f"print(get_backend('local').launch(i, AgentSpec([sys.executable, '-c', {SLEEPER!r}], "
        "{'BATON_JOB_ID': '7'}, 0.0)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    try:
        folder = instance_dir(instance.pk)
        wait_until(lambda: (folder / "started").exists(), timeout=20)
        assert alive(pid)
    finally:
        localproc.stop(pid, str(instance.pk), grace_s=0)
    wait_until(lambda: not alive(pid), timeout=10)


def test_stopping_every_instance_asks_first_and_kills_what_stays(instance: Instance) -> None:
    backend = get_backend("local")
    stubborn = AgentSpec(
        argv=[
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open('started', 'w').write('1'); time.sleep(600)",
        ],
        environ={},
        delay_s=0,
    )
    pid = int(backend.launch(instance, stubborn))
    wait_until(lambda: (instance_dir(instance.pk) / "started").exists(), timeout=20)

    began = time.monotonic()
    assert localproc.end_all(instance_dir(instance.pk).parent, grace_s=1.0) == [pid]

    assert 1.0 <= time.monotonic() - began < 5
    wait_until(lambda: not alive(pid), timeout=10)
    assert os.path.exists(instance_dir(instance.pk) / "agent.log")

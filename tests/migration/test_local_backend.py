"""The local backend: an instance is a detached process tree in its own folder, started after
its provisioning delay, ended as a whole (the workload's own session too), never signalled by
mistake."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from migration.backends import (
    AgentSpec,
    get_backend,
    instance_dir,
    localproc,
    provisioning_delay,
)
from migration.models import Instance
from tests.conftest import ROOT, placed_instance, wait_until

pytestmark = pytest.mark.django_db

# A stand-in agent: records its environment, starts a grandchild in its group, and waits.
SLEEPER = (
    "import os, subprocess, sys, time; "
    "open('started', 'w').write(os.environ['BATON_JOB_ID']); "
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "open('grandchild', 'w').write(str(child.pid)); "
    "time.sleep(600)"
)
# A stand-in agent that, as the real one, starts its workload in a session of its own.
SUPERVISOR = (
    "import subprocess, sys, time; "
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
    "start_new_session=True); "
    "open('workload', 'w').write(str(w.pid)); "
    "time.sleep(600)"
)


@pytest.fixture(autouse=True)
def instance_root(settings: Any, tmp_path: Path) -> Path:
    """A folder of instances per test (test databases roll back, so instance ids repeat)."""
    settings.BATON_INSTANCE_ROOT = tmp_path / "instances"
    return Path(settings.BATON_INSTANCE_ROOT)


@pytest.fixture
def instance(catalogue: Any, alice: Any) -> Instance:
    return placed_instance(alice, catalogue)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def spec(code: str = SLEEPER, delay: float = 0.0, **environ: str) -> AgentSpec:
    return AgentSpec(
        argv=[sys.executable, "-c", code],
        environ={"BATON_JOB_ID": "7", **environ},
        delay_s=delay,
    )


def read_int(path: Path) -> int:
    wait_until(lambda: path.exists() and path.read_text().strip(), timeout=20, every=0.05)
    return int(path.read_text())


def test_an_instance_starts_after_its_delay_in_its_own_folder_and_ends_as_a_group(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    folder = instance_dir(instance.pk)

    instance.backend_id = backend.launch(instance, spec(delay=1.0))
    assert backend.describe(instance).state == "provisioning"
    assert not (folder / "started").exists()
    grandchild = read_int(folder / "grandchild")
    assert backend.describe(instance).state == "running"
    assert (folder / "started").read_text() == "7"
    assert (folder / "pid").read_text().strip() == instance.backend_id
    assert (folder / "agent.log").exists()

    backend.release(instance)
    wait_until(lambda: not alive(int(instance.backend_id)) and not alive(grandchild), timeout=10)
    assert backend.describe(instance).state == "gone"
    backend.release(instance)  # twice is fine
    backend.release(instance, grace_s=5)


def test_release_ends_the_workload_the_agent_started_in_a_session_of_its_own(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    instance.backend_id = backend.launch(instance, spec(SUPERVISOR))
    workload = read_int(instance_dir(instance.pk) / "workload")
    assert os.getsid(workload) != int(instance.backend_id)

    backend.release(instance)

    wait_until(lambda: not alive(workload) and not alive(int(instance.backend_id)), timeout=10)


def test_a_new_instance_never_starts_among_files_an_earlier_one_of_its_id_left(
    instance: Instance, instance_root: Path
) -> None:
    # Ids start again with a new database: the folder may hold an earlier instance's log and a
    # directory-mode job's files, which the new job must not find as its own.
    folder = instance_dir(instance.pk)
    (folder / "checkpoint").mkdir(parents=True)
    (folder / "checkpoint" / "model.pt").write_text("an earlier job's weights")
    (folder / "agent.log").write_text("an earlier agent's log\n")
    backend = get_backend("local")

    instance.backend_id = backend.launch(instance, spec())
    try:
        wait_until(lambda: (folder / "started").exists(), timeout=20)
        assert not (folder / "checkpoint").exists()
        assert "earlier" not in (folder / "agent.log").read_text()
        (aside,) = instance_root.glob(f"{instance.pk}.replaced-*")
        assert (aside / "checkpoint" / "model.pt").read_text() == "an earlier job's weights"
        assert backend.launch(instance, spec()) == instance.backend_id  # its own: left alone
        assert (folder / "started").exists()
    finally:
        backend.release(instance)


def test_what_a_dead_agent_left_is_gone_to_describe_and_ended_by_release(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    instance.backend_id = agent = backend.launch(instance, spec(SUPERVISOR))
    workload = read_int(instance_dir(instance.pk) / "workload")

    os.kill(int(agent), signal.SIGKILL)  # the agent alone dies (say, out of memory)
    wait_until(lambda: not alive(int(agent)), timeout=10)
    assert backend.describe(instance).state == "gone"
    assert alive(workload)

    backend.release(instance)
    wait_until(lambda: not alive(workload), timeout=10)


def test_a_release_during_the_delay_ends_the_instance_before_its_agent_starts(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    instance.backend_id = backend.launch(instance, spec(delay=30))
    assert backend.describe(instance).state == "provisioning"

    backend.release(instance)

    wait_until(lambda: not alive(int(instance.backend_id)), timeout=10)
    assert localproc.members_of(instance_dir(instance.pk)) == []  # its `sleep` too
    assert not (instance_dir(instance.pk) / "started").exists()
    assert backend.describe(instance).state == "gone"


def test_a_release_with_grace_asks_first_and_ends_the_instance_after_it(
    instance: Instance,
) -> None:
    backend = get_backend("local")
    stubborn = (
        "import signal, time; "
        "signal.signal(signal.SIGTERM, lambda *_: open('asked', 'w').write('1')); "
        "open('started', 'w').write('1'); time.sleep(600)"
    )
    instance.backend_id = backend.launch(instance, spec(stubborn))
    folder = instance_dir(instance.pk)
    wait_until(lambda: (folder / "started").exists(), timeout=20, every=0.05)

    began = time.monotonic()
    backend.release(instance, grace_s=1.0)
    assert time.monotonic() - began < 0.5  # the caller does not wait out the grace

    wait_until(lambda: (folder / "asked").exists(), timeout=5, every=0.05)
    assert alive(int(instance.backend_id))
    wait_until(lambda: not alive(int(instance.backend_id)), timeout=10, every=0.05)
    assert time.monotonic() - began >= 1.0


def test_a_second_launch_of_a_live_instance_starts_nothing(instance: Instance) -> None:
    backend = get_backend("local")
    first = backend.launch(instance, spec())
    try:
        assert backend.launch(instance, spec()) == first
    finally:
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
        localproc.stop(tmp_path / "9", grace_s=0)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_another_installs_instance_with_the_same_id_is_never_signalled(tmp_path: Path) -> None:
    theirs = tmp_path / "other-home" / "instances" / "5"
    pid = localproc.spawn(
        theirs,
        [sys.executable, "-c", "import time; time.sleep(60)"],
        {"PATH": os.environ["PATH"]},
        0,
    )
    ours = tmp_path / "our-home" / "instances"
    try:
        (ours / "5").mkdir(parents=True)
        (ours / "5" / "pid").write_text(f"{pid}\n")  # left by a crash, the pid since reused

        assert localproc.end_all(ours, grace_s=0.2) == []
        localproc.stop(ours / "5", grace_s=0)
        time.sleep(0.2)
        assert alive(pid)
    finally:
        localproc.stop(theirs, grace_s=0)
    wait_until(lambda: not alive(pid), timeout=10)


def test_an_instance_outlives_the_process_that_launched_it(
    instance: Instance, instance_root: Path
) -> None:
    # The launch happens in a short-lived process (as in a worker that restarts).
    code = (
        "import django, os, sys; os.environ['DJANGO_SETTINGS_MODULE'] = 'tests.settings'; "
        "django.setup(); "
        "from django.conf import settings; "
        f"settings.BATON_INSTANCE_ROOT = {str(instance_root)!r}; "
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
        assert get_backend("local").describe(instance).state == "running"
    finally:
        get_backend("local").release(instance)
    wait_until(lambda: not alive(pid), timeout=10)


def test_stopping_every_instance_asks_first_and_kills_what_stays(instance: Instance) -> None:
    backend = get_backend("local")
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "open('started', 'w').write('1'); time.sleep(600)"
    )
    pid = int(backend.launch(instance, spec(stubborn)))
    wait_until(lambda: (instance_dir(instance.pk) / "started").exists(), timeout=20)

    began = time.monotonic()
    assert localproc.end_all(instance_dir(instance.pk).parent, grace_s=1.0) == [str(instance.pk)]

    assert 1.0 <= time.monotonic() - began < 5
    wait_until(lambda: not alive(pid), timeout=10)
    assert os.path.exists(instance_dir(instance.pk) / "agent.log")


def test_recovery_ends_the_processes_of_active_instances_and_any_leftover(
    instance: Instance, instance_root: Path, django_capture_on_commit_callbacks: Any
) -> None:
    backend = get_backend("local")
    pid = int(backend.launch(instance, spec(SUPERVISOR)))
    workload = read_int(instance_dir(instance.pk) / "workload")
    # An instance the database has ended already, whose process is still there.
    leftover = localproc.spawn(
        instance_root / "999999",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        dict(os.environ),
        0,
    )
    out = io.StringIO()

    with django_capture_on_commit_callbacks(execute=False):
        call_command("recover_instances", stdout=out)

    wait_until(lambda: not any(alive(p) for p in (pid, workload, leftover)), timeout=10)
    instance.refresh_from_db()
    assert instance.state == "failed"
    assert f"job(s) whose instances were left running: [{instance.job_id}]" in out.getvalue()
    assert "leftover processes of 1 instance(s): 999999" in out.getvalue()


def test_the_provisioning_delay_setting_overrides_every_pool(catalogue: Any, settings: Any) -> None:
    pool = catalogue["pools"]["t4_spot"]
    pool.provisioning_delay_s = 7.5
    settings.BATON_PROVISIONING_DELAY_S = None
    assert provisioning_delay(pool) == 7.5

    settings.BATON_PROVISIONING_DELAY_S = 0.0
    assert provisioning_delay(pool) == 0.0


def test_a_pool_on_a_backend_not_built_yet_gets_a_clear_error() -> None:
    with pytest.raises(NotImplementedError, match="'aws' capacity backend"):
        get_backend("aws")

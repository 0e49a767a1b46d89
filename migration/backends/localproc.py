"""Process groups of local instances, without Django (the launcher uses this too).

Each local instance is one detached process group: `sh` waits out the provisioning delay and
then becomes the agent (`exec`), so the instance exists as a process from the moment it is
launched and one signal to its group ends it, agent and workload alike. Its pid is written to
`<folder>/pid`. Before signalling a pid read from there, we check that the process still
carries the instance's `BATON_INSTANCE_ID` in its environment: a pid reused by an unrelated
process after a crash is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

# What an agent inherits from the process that launches it; everything else (database URLs,
# secrets, Django settings) stays with the portal.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "VIRTUAL_ENV", "PYTHONPATH")
INHERITED_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_")
DELAY_THEN_EXEC = 'sleep "$0"; exec "$@"'


def agent_environment(spec_environ: Mapping[str, str]) -> dict[str, str]:
    base = {
        k: v for k, v in os.environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)
    }
    return {**base, **spec_environ}


def spawn(folder: Path, argv: list[str], environ: Mapping[str, str], delay_s: float) -> int:
    """Start `argv` after `delay_s` seconds in a new session in `folder`; returns its pid.

    The child is reaped by a daemon thread of this process, and is not tied to this process's
    life: a worker restarting does not end the training it launched.
    """
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "agent.log").open("ab") as log:
        proc = subprocess.Popen(
            ["sh", "-c", DELAY_THEN_EXEC, f"{max(0.0, delay_s):.3f}", *argv],
            cwd=folder,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    temporary = folder / "pid.tmp"
    temporary.write_text(f"{proc.pid}\n")
    temporary.replace(folder / "pid")
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return proc.pid


def read_pid(folder: Path) -> int | None:
    try:
        return int((folder / "pid").read_text().strip())
    except (OSError, ValueError):
        return None


def is_ours(pid: int, instance_id: str) -> bool:
    """Whether `pid` is alive and is the process started for `instance_id`."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":  # exited, not yet reaped
        return False
    return f"BATON_INSTANCE_ID={instance_id}".encode() in environ


def still_waiting(pid: int) -> bool:
    """Whether the group's leader is still the `sh` waiting out the provisioning delay."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sh"
    except OSError:
        return False


def signal_group(pid: int, instance_id: str, sig: signal.Signals) -> bool:
    if not is_ours(pid, instance_id):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    return True


def stop(pid: int, instance_id: str, grace_s: float) -> None:
    """End the group now (grace 0) or ask it to stop and end it after `grace_s` seconds."""
    if grace_s <= 0:
        signal_group(pid, instance_id, signal.SIGKILL)
        return
    if signal_group(pid, instance_id, signal.SIGTERM):
        timer = threading.Timer(grace_s, signal_group, (pid, instance_id, signal.SIGKILL))
        timer.daemon = True
        timer.start()


def end_all(root: Path, grace_s: float, poll: float = 0.2) -> list[int]:
    """Stop every instance under `root` (`<root>/<id>/pid`): SIGTERM to each group (its agent
    takes an emergency checkpoint), SIGKILL to what is left after `grace_s`. Returns the pids
    it signalled."""
    found = _instances(root)
    signalled = [pid for pid, iid in found if signal_group(pid, iid, signal.SIGTERM)]
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(is_ours(pid, iid) for pid, iid in found):
        time.sleep(poll)
    for pid, iid in found:
        signal_group(pid, iid, signal.SIGKILL)
    return signalled


def _instances(root: Path) -> list[tuple[int, str]]:
    if not root.is_dir():
        return []
    found = []
    for folder in sorted(root.iterdir()):
        pid = read_pid(folder)
        if pid is not None:
            found.append((pid, folder.name))
    return found


def alive(pairs: Iterable[tuple[int, str]]) -> list[int]:
    return [pid for pid, iid in pairs if is_ours(pid, iid)]

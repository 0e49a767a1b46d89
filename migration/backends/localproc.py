"""Processes of local instances, without Django (the launcher uses this too).

A local instance is a detached process tree. `spawn` starts `sh` in a new session; it waits out
the provisioning delay and then becomes the agent (`exec`), so the instance exists as a process
from the moment it is launched and a stop during the delay ends it. Its pid (also its process
group and session id) is written to `<folder>/pid`.

One process group does not hold the whole instance: the agent starts its workload in a session
of its own (so it can signal the workload's group without signalling itself). What does hold
it is the environment: `spawn` gives the agent `BATON_INSTANCE_DIR=<the instance's folder>`,
the agent passes its environment on to the workload, and children inherit it. So:

- the pid in the pid file is signalled only while `/proc/<pid>/environ` (the environment the
  process was started with) carries that marker: a pid reused by an unrelated process after a
  crash is never touched. The marker is the folder's full path, not only the instance id, so
  another install on this machine, whose instance ids repeat ours, is never touched either;
- ending an instance signals the process group of every live process carrying its marker: a
  process group id is never handed out again while one of its members lives, so a group with
  a live marked member is one of ours.

Start times would prove the pid file's process but would not find the workload's session; a
cgroup per instance would hold everything, but needs a delegated cgroup tree that an ordinary
install does not have.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# What an agent inherits from the process that launches it; everything else (database URLs,
# secrets, Django settings) stays with the portal.
INHERITED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "VIRTUAL_ENV", "PYTHONPATH")
INHERITED_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_")
DELAY_THEN_EXEC = 'sleep "$0"; exec "$@"'
MARKER = "BATON_INSTANCE_DIR"
# SIGKILL rounds: a process forked between a scan and the kill is found by the next scan.
KILL_ROUNDS = 5


@dataclass(frozen=True)
class Member:
    """A live process of a local instance."""

    pid: int
    pgid: int
    folder: str  # the instance folder's name (the instance id)


def agent_environment(spec_environ: Mapping[str, str]) -> dict[str, str]:
    base = {
        k: v for k, v in os.environ.items() if k in INHERITED or k.startswith(INHERITED_PREFIXES)
    }
    return {**base, **spec_environ}


def set_aside(folder: Path) -> Path | None:
    """Move what an earlier instance left in `folder` to a sibling named after the time, and
    return where it went (None when the folder is absent or empty). An instance is launched
    once, so files there belong to an instance of the same id that a previous database had
    (ids start again with a new one): its log, its state and a directory-mode job's files, which
    a new job would otherwise find as its own."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    aside = folder.with_name(f"{folder.name}.replaced-{stamp}")
    folder.rename(aside)
    return aside


def spawn(folder: Path, argv: list[str], environ: Mapping[str, str], delay_s: float) -> int:
    """Start `argv` after `delay_s` seconds in a new session in `folder`; returns its pid.

    The child is reaped by a daemon thread of this process (no zombies in a long-lived worker)
    and is not tied to this process's life (no parent-death signal): a worker restarting does
    not end the training it launched.
    """
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    with (folder / "agent.log").open("ab") as log:
        proc = subprocess.Popen(
            ["sh", "-c", DELAY_THEN_EXEC, f"{max(0.0, delay_s):.3f}", *argv],
            cwd=folder,
            env={**environ, MARKER: str(folder)},
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


def _marker(folder: Path) -> bytes:
    return f"{MARKER}={folder.resolve()}".encode()


def _environ(pid: int | str) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:  # gone, or not ours to read (another user's process)
        return []


def _group_if_live(pid: int | str) -> int | None:
    """The process group of `pid`, or None when it is gone or exited (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name may hold spaces and parentheses
    return None if fields[0] == "Z" else int(fields[2])


def is_ours(pid: int, folder: Path) -> bool:
    """Whether `pid` is alive and was started for the instance in `folder`."""
    return _marker(folder) in _environ(pid) and _group_if_live(pid) is not None


def still_waiting(pid: int) -> bool:
    """Whether the instance's first process is still the `sh` waiting out the delay."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "sh"
    except OSError:
        return False


def members(root: Path) -> list[Member]:
    """Every live process of every instance whose folder is in `root`."""
    prefix = f"{MARKER}={root.resolve()}/".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        tagged = next((v for v in _environ(name) if v.startswith(prefix)), None)
        if tagged is None:
            continue
        folder = tagged[len(prefix) :].decode(errors="replace")
        pgid = _group_if_live(name)
        if pgid is not None and "/" not in folder:
            found.append(Member(int(name), pgid, folder))
    return found


def members_of(folder: Path) -> list[Member]:
    """Every live process of the instance in `folder`."""
    folder = folder.resolve()
    return [m for m in members(folder.parent) if m.folder == folder.name]


def _signal_groups(
    found: Iterable[Member], sig: signal.Signals, first: Iterable[int | None] = ()
) -> None:
    """Signal the group of each process found; the groups in `first` (the agents') before the
    others, so an agent never sees its workload end and reports it before it ends itself."""
    groups = dict.fromkeys(m.pgid for m in found)
    leading = [pgid for pgid in first if pgid in groups]
    for pgid in dict.fromkeys([*leading, *groups]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def kill(folder: Path) -> bool:
    """SIGKILL every process of the instance in `folder`; whether there was any."""
    return _kill_all(lambda: members_of(folder), [read_pid(folder)])


def _kill_all(scan: Callable[[], list[Member]], first: Iterable[int | None]) -> bool:
    found_any = False
    first = list(first)
    for _ in range(KILL_ROUNDS):
        found = scan()
        if not found:
            break
        found_any = True
        _signal_groups(found, signal.SIGKILL, first)
        time.sleep(0.02)  # let the kernel finish them before looking again
    return found_any


def _ask_to_stop(folder: Path, found: list[Member]) -> None:
    """SIGTERM to the agent's group: the agent treats it as a final notice and passes it on
    to its workload (a second SIGTERM straight to the workload could cut its emergency
    checkpoint short). Without a live agent, the leftover groups get it themselves."""
    leader = read_pid(folder)
    if leader is not None and is_ours(leader, folder):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGTERM)
    else:
        _signal_groups(found, signal.SIGTERM)


def stop(folder: Path, grace_s: float) -> None:
    """End the instance in `folder`: at once (grace 0: SIGKILL, as a cloud reclaims), or ask it
    to stop and end what is left after `grace_s` seconds. Never blocks for the grace: a daemon
    timer of this process does the end (the agent's own grace period ends it first anyway).
    Idempotent; nothing happens when the instance is already gone."""
    if grace_s <= 0:
        kill(folder)
        return
    found = members_of(folder)
    if not found:
        return
    _ask_to_stop(folder, found)
    timer = threading.Timer(grace_s, kill, (folder,))
    timer.daemon = True
    timer.start()


def end_all(root: Path, grace_s: float, poll: float = 0.2) -> list[str]:
    """End every instance whose folder is in `root`: SIGTERM to each (its agent takes an
    emergency checkpoint), up to `grace_s` seconds for them to exit, SIGKILL to what is left.
    Found by their processes, so an instance whose pid file was never written ends too.
    Returns the names of the instance folders that had processes."""
    found = members(root)
    folders = sorted({m.folder for m in found})
    if grace_s > 0:
        for name in folders:
            _ask_to_stop(root / name, [m for m in found if m.folder == name])
        end = time.monotonic() + grace_s
        while time.monotonic() < end and members(root):
            time.sleep(poll)
    _kill_all(lambda: members(root), [read_pid(root / name) for name in folders])
    return folders

"""Which files of a folder the workload is writing right now (Linux `/proc`).

The workload leads a session of its own (see workload.py), so its processes are those whose
session id is the leader's pid, however they were started (a shell, torchrun, a data loader).
A file one of them holds open with write access may be half-written: the directory sync keeps
the previous version of such a file (decision 060). Where `/proc` is missing or unreadable
nothing is reported as written, and the other safeguards (the check that a file did not change
while it was read, and distrust of files that changed when the workload died) still hold.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PROC = Path("/proc")
_WRITE_ACCESS = (os.O_WRONLY, os.O_RDWR)
HAS_CHILDREN_LISTS = (PROC / "self" / "task" / str(os.getpid()) / "children").exists()


def session_pids(session: int) -> list[int]:
    """The processes of session `session` (its leader included while it lives): a scan of
    every process, a few milliseconds on a busy machine."""
    pids = []
    try:
        names = os.listdir(PROC)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = (PROC / name / "stat").read_bytes()
        except OSError:
            continue  # gone since the listing
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == session:
            pids.append(int(name))
    return pids


def descendants(pid: int) -> set[int]:
    """`pid` and every process below it, from the kernel's children lists (fast; misses a
    process whose parent died, which `session_pids` finds)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.add(current)
        try:
            tasks = os.listdir(PROC / str(current) / "task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = (PROC / str(current) / "task" / task / "children").read_text()
            except OSError:
                continue
            todo.extend(int(child) for child in children.split())
    return found


class Session:
    """The processes of one workload session, looked up cheaply: the leader's descendants on
    every call, plus a full scan (which also finds orphans) at most every `rescan` seconds."""

    def __init__(self, leader: int, rescan: float = 1.0) -> None:
        self.leader = leader
        self.rescan = rescan
        self._scanned: list[int] = []
        self._scanned_at = -rescan

    def pids(self) -> set[int]:
        now = time.monotonic()
        # Without the kernel's children lists the fast path sees only the leader: scan always.
        if not HAS_CHILDREN_LISTS or now - self._scanned_at >= self.rescan:
            self._scanned = session_pids(self.leader)
            self._scanned_at = now
        return descendants(self.leader) | set(self._scanned)


def alive(pid: int) -> bool:
    """True while process `pid` runs (False once it has exited, even before it is reaped)."""
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to ask: assume it runs, as without this check
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def _opened_for_writing(pid: int, fd: str) -> bool:
    try:
        with open(PROC / str(pid) / "fdinfo" / fd, "rb") as info:
            for line in info:
                if line.startswith(b"flags:"):
                    return (int(line.split()[1], 8) & os.O_ACCMODE) in _WRITE_ACCESS
    except (OSError, ValueError, IndexError):
        return False
    return False


def files_being_written(session: Session, folder: Path) -> set[str]:
    """Paths, relative to `folder`, of files a process of `session` has open for writing."""
    root = os.path.realpath(folder) + os.sep
    found: set[str] = set()
    for pid in session.pids():
        fd_dir = PROC / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith(root) and _opened_for_writing(pid, fd):
                found.add(target[len(root) :])
    return found

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
from pathlib import Path

logger = logging.getLogger(__name__)

PROC = Path("/proc")
_WRITE_ACCESS = (os.O_WRONLY, os.O_RDWR)


def session_pids(session: int) -> list[int]:
    """The processes of session `session` (its leader included while it lives)."""
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


def files_being_written(session: int, folder: Path) -> set[str]:
    """Paths, relative to `folder`, of files a process of `session` has open for writing."""
    root = os.path.realpath(folder) + os.sep
    found: set[str] = set()
    for pid in session_pids(session):
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

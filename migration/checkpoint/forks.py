"""What a forked child makes anew of its parent's objects (decision 073).

A child forked from a process (a sweep forking its trials, a data loader's workers,
`multiprocessing` with the fork start method) has only the thread that forked. An object that
hands work to threads of its own, or holds a lock another thread may have held at the fork,
registers itself here; in the child its `_after_fork()` forgets the parent's threads and makes
its locks anew, so that its next use starts threads of the child's own.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class RenewedAfterFork(Protocol):
    def _after_fork(self) -> None:
        """Called in a forked child, before anything else runs there."""


_RENEWED: weakref.WeakSet[RenewedAfterFork] = weakref.WeakSet()


def renew_after_fork(obj: RenewedAfterFork) -> None:
    """Call `obj._after_fork()` in every child forked while `obj` lives."""
    _RENEWED.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_RENEWED):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

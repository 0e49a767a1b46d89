"""The supervised workload: one process in its own process group, its output read line by line.

The workload leads a new session, so it and everything it starts (data loader workers,
torchrun's children, a shell's pipeline) form one process group the agent can kill at once,
and a Ctrl-C meant for the agent's terminal never reaches it directly.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 16


class WorkloadStartError(RuntimeError):
    """The command could not be started (not found, not executable, ...)."""


class Workload:
    """Runs `argv` with its stdout and stderr merged into `on_line`, one call per line."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        on_line: Callable[[str], None],
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.on_line = on_line
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        """The process id (also the process group id)."""
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        """Start the process; raise WorkloadStartError when it cannot be started."""
        try:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise WorkloadStartError(f"cannot start {self.argv[0]!r}: {exc}") from exc
        logger.info("workload started, pid %d: %s", self.process.pid, " ".join(self.argv))
        self._reader = threading.Thread(target=self._read, name="workload-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        stream = self.process.stdout
        # readline with a limit: a workload printing megabytes without a newline cannot make
        # the agent hold them all in memory; the line just arrives in pieces.
        while chunk := stream.readline(MAX_LINE_BYTES):
            line = chunk.decode("utf-8", "replace").rstrip("\r\n")
            try:
                self.on_line(line)
            except Exception:
                logger.exception("could not handle a line of workload output")
        stream.close()

    def poll(self) -> int | None:
        """The return code once the process has exited (negative: killed by that signal)."""
        assert self.process is not None
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` seconds for the process; its return code or None."""
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def exited(self) -> bool:
        """True once the leader has exited, without reaping it.

        An exited but unreaped leader (a zombie) keeps its process id, so its process group
        id cannot be given to anyone else before `kill_group` and `wait`: signals sent until
        then never reach an unrelated process. Hence no `poll()` here.
        """
        assert self.process is not None
        if self.process.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def send(self, sig: signal.Signals, group: bool = False) -> bool:
        """Send `sig` to the process, or to its whole group; False when it is already gone."""
        assert self.process is not None
        if self.exited():
            return False
        try:
            if group:
                os.killpg(self.process.pid, sig)
            else:
                os.kill(self.process.pid, sig)
        except ProcessLookupError:
            return False
        logger.info("sent %s to the workload%s", sig.name, "'s process group" if group else "")
        return True

    def kill_group(self) -> None:
        """SIGKILL the whole process group (the leader and anything it left behind)."""
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        except PermissionError as exc:
            # The group id may have been reused after every member exited; never guess.
            logger.warning("could not kill the workload's process group: %s", exc)

    def finish_output(self, timeout: float = 5.0) -> None:
        """Wait for the last output lines to be handled (after the process has exited)."""
        if self._reader is not None:
            self._reader.join(timeout)

"""Child processes for tests: one whose stdout and stderr lines can be awaited while it runs, and
a fork of the test process itself."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


class Proc:
    """Runs `argv` with `env` from the repository root; lines are collected as they come."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.argv = list(argv)
        self.process = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._events: queue.Queue[tuple[str, str]] = queue.Queue()
        for name, stream, sink in (
            ("out", self.process.stdout, self.stdout),
            ("err", self.process.stderr, self.stderr),
        ):
            threading.Thread(target=self._read, args=(name, stream, sink), daemon=True).start()

    def _read(self, name: str, stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append(line.rstrip("\n"))
            self._events.put((name, line.rstrip("\n")))
        self._events.put((name, "\0eof"))

    def wait_for(self, pattern: str, stream: str = "out", timeout: float = 60.0) -> re.Match[str]:
        """Block until a line of `stream` ("out" or "err") matches `pattern`."""
        regex = re.compile(pattern)
        for line in self.stdout if stream == "out" else self.stderr:
            if match := regex.search(line):
                return match
        deadline = time.monotonic() + timeout
        eofs = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line matching {pattern!r}; {self.describe()}")
            try:
                name, line = self._events.get(timeout=left)
            except queue.Empty:
                continue
            if line == "\0eof":
                eofs += 1
                if eofs == 2:
                    raise EOFError(f"exited before {pattern!r}; {self.describe()}")
                continue
            if name == stream and (match := regex.search(line)):
                return match

    def signal(self, signum: int) -> None:
        """Send a signal (if the process still runs)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)

    def finish(self, timeout: float = 120.0) -> int:
        """Wait for the exit; the return code (negative: killed by that signal)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        time.sleep(0.05)  # let the reader threads drain the pipes
        return code

    def describe(self) -> str:
        tail = "\n".join(self.stderr[-15:])
        return f"argv={self.argv}\nstdout={self.stdout[-5:]}\nstderr tail:\n{tail}"

    def kill(self) -> None:
        """SIGKILL, no questions asked."""
        self.signal(signal.SIGKILL)


def python(*args: str) -> list[str]:
    """argv running this interpreter."""
    return [sys.executable, *args]


def in_forked_child(run: Callable[[], None], timeout: float = 60.0) -> int:
    """Fork, call `run` in the child and return the child's exit code: 0 when `run` returned, 1
    when it raised (its traceback goes to stderr). A child still running after `timeout`
    seconds is killed and reported as -9."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            run()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        time.sleep(0.05)
    return os.waitstatus_to_exitcode(waited[1])

"""The whole system as `make run` starts it: a session-wide stack for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from portal.embedded_redis import free_port

ROOT = Path(__file__).resolve().parents[2]
DEMO_PASSWORD = "demo-password-for-tests"


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    home: Path
    base: str
    env: dict[str, str]

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def http(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Token {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


def redis_url_for_stacks(database: int = 14) -> str:
    """The test Redis server, in a database of the stacks' own (their workers must not share
    queues with the test worker)."""
    return os.environ["REDIS_URL"].rsplit("/", 1)[0] + f"/{database}"


def launch_stack(home: Path, redis_url: str, **extra_env: str) -> Stack:
    """Start the launcher on a free port in `home`; `wait_for_http` before using it."""
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "BATON_TEST_DATABASE_NAME", "BATON_TEST_HOME"}
    }
    env.update(
        BATON_HOME=str(home),
        PORT=str(port),
        DJANGO_SETTINGS_MODULE="portal.settings",
        REDIS_URL=redis_url,
        BATON_DEMO_PASSWORD=DEMO_PASSWORD,
        **extra_env,
    )
    with open(home / "launcher.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "portal.launcher"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Stack(proc, home, f"http://127.0.0.1:{port}", env)


def wait_for_http(stack: Stack, timeout: float = 120) -> Stack:
    end = time.monotonic() + timeout
    while True:
        assert stack.proc.poll() is None, (stack.home / "launcher.log").read_text()[-2000:]
        assert time.monotonic() < end, f"the stack did not serve HTTP within {timeout} s"
        try:
            urllib.request.urlopen(stack.base + "/login/", timeout=2)
            return stack
        except OSError:
            time.sleep(0.5)


def start_stack(home: Path) -> Stack:
    """Start the launcher on a free port in `home` and wait until it serves HTTP."""
    import redis

    redis_url = redis_url_for_stacks()
    redis.Redis.from_url(redis_url).flushdb()
    return wait_for_http(launch_stack(home, redis_url, BATON_CHANNEL_PREFIX="baton-stack"))


def stop_stack(stack: Stack) -> None:
    if stack.proc.poll() is None:
        os.killpg(stack.proc.pid, signal.SIGTERM)
        stack.proc.wait(30)


@pytest.fixture(scope="session")
def _stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Stack]]:
    started: list[Stack] = []
    yield started
    for stack in started:
        stop_stack(stack)


@pytest.fixture
def stack(_stacks: list[Stack], tmp_path_factory: pytest.TempPathFactory) -> Stack:
    """The running system, shared by the session's tests; restarted if a test stopped it."""
    if not _stacks or _stacks[-1].proc.poll() is not None:
        _stacks.append(start_stack(tmp_path_factory.mktemp("stack")))
    return _stacks[-1]

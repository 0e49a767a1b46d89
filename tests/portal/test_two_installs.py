"""Two `make run` installs started at once on one Redis: each places and finishes its own
job, and a websocket on one never receives the other's events. An idle websocket stays open
through the whole test (more than 60 s). Afterwards no file in BATON_HOME is readable by group
or others, and no token or secret key is written anywhere it should not be."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from tests.conftest import wait_until
from tests.portal.conftest import (
    DEMO_PASSWORD,
    Stack,
    launch_stack,
    redis_url_for_stacks,
    stop_stack,
    wait_for_http,
)

pytestmark = pytest.mark.slow

IDLE_SECONDS = 60
# Written by this test, not by Baton: the launcher's captured output.
TEST_FILES = {"launcher.log"}


def token_of(stack: Stack) -> str:
    status, body = stack.http(
        "POST", "/api/auth/token/", {"username": "demo", "password": DEMO_PASSWORD}
    )
    assert status == 200, body
    return str(body["token"])


def submit(stack: Stack, token: str, name: str) -> int:
    status, job = stack.http(
        "POST",
        "/api/jobs/",
        {
            "name": name,
            "workload": {"template": "mlp_numpy", "params": {"seed": 1}},
            "accelerator": "T4",
            "total_steps": 60,
            "checkpoint_every_steps": 20,
        },
        token=token,
    )
    assert status == 201, job
    return int(job["id"])


@contextmanager
def watch(stack: Stack, token: str, job_id: int) -> Iterator[ClientConnection]:
    """A script's websocket on a job: a token header, the resume message sent."""
    with connect(
        stack.base.replace("http", "ws") + f"/ws/jobs/{job_id}/",
        additional_headers={"Authorization": f"Token {token}"},
        origin=Origin(stack.base),
        open_timeout=10,
    ) as socket:
        socket.send(json.dumps({"type": "resume", "since": 0}))
        yield socket


def timeline_kinds(stack: Stack, token: str, job_id: int) -> set[str]:
    events = stack.http("GET", f"/api/jobs/{job_id}/timeline/", token=token)[1]
    return {e["kind"] for e in events}


def drain(socket: ClientConnection, seconds: float = 2.0) -> list[dict[str, Any]]:
    """Timeline events received until the socket stays quiet for `seconds`."""
    events: list[dict[str, Any]] = []
    while True:
        try:
            message = json.loads(socket.recv(timeout=seconds))
        except TimeoutError:
            return events
        if message["type"] == "timeline.event":
            events.append(message["event"])


def succeeded(stack: Stack, token: str, job_id: int) -> bool:
    return bool(stack.http("GET", f"/api/jobs/{job_id}/", token=token)[1]["state"] == "succeeded")


def loose_files(home: Path) -> list[str]:
    return [
        f"{path.relative_to(home)} {oct(path.stat().st_mode & 0o777)}"
        for path in [home, *home.rglob("*")]
        if not path.is_symlink() and path.name not in TEST_FILES and path.stat().st_mode & 0o077
    ]


def files_holding(home: Path, secret: str, allowed: set[str]) -> list[str]:
    return [
        str(path.relative_to(home))
        for path in home.rglob("*")
        if path.is_file()
        and path.name not in allowed | TEST_FILES
        and secret.encode() in path.read_bytes()
    ]


def test_two_installs_on_one_redis_keep_to_their_own_jobs_and_events(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    shared_redis = redis_url_for_stacks(13)
    redis.Redis.from_url(shared_redis).flushdb()
    stacks = [
        launch_stack(
            tmp_path_factory.mktemp(f"install-{name}"),
            shared_redis,
            BATON_PROVISIONING_DELAY_S="0",
        )
        for name in ("a", "b")
    ]
    with ExitStack() as sockets:
        try:
            a, b = (wait_for_http(stack) for stack in stacks)
            token_a, token_b = token_of(a), token_of(b)
            # Job 1 on each install: the same id, so the same websocket group name; a leak
            # between installs would reach the other's socket.
            first_a, first_b = submit(a, token_a, "on-a"), submit(b, token_b, "on-b")
            assert first_a == first_b
            on_a = sockets.enter_context(watch(a, token_a, first_a))
            on_b = sockets.enter_context(watch(b, token_b, first_b))
            # Ids only A has: a task of A's taken by B's worker would find no such job there,
            # and A's job would stay pending.
            more_a = [submit(a, token_a, f"more-a-{i}") for i in range(2)]
            # A job with no events after its cancellation: its socket sits idle.
            quiet = submit(a, token_a, "quiet")
            a.http("POST", f"/api/jobs/{quiet}/cancel/", token=token_a)
            idle = sockets.enter_context(watch(a, token_a, quiet))
            idle_since = time.monotonic()

            finished = [(a, token_a, j) for j in (first_a, *more_a)] + [(b, token_b, first_b)]
            for stack, token, job in finished:
                wait_until(partial(succeeded, stack, token, job), 180, 1)
            checks = (
                (a, token_a, first_a, on_a),
                (b, token_b, first_b, on_b),
                (a, token_a, quiet, idle),
            )
            for stack, token, job, socket in checks:
                timeline = stack.http("GET", f"/api/jobs/{job}/timeline/", token=token)[1]
                assert drain(socket) == timeline  # its own install's events, none of the other's
            assert {"placement_decided", "succeeded"} <= timeline_kinds(a, token_a, first_a)

            time.sleep(max(0.0, IDLE_SECONDS - (time.monotonic() - idle_since)))
            idle.send(json.dumps({"type": "resume", "since": 0}))  # still open, still answering
            assert json.loads(idle.recv(timeout=10))["type"] in {"timeline.event", "job.state"}
            assert time.monotonic() - idle_since >= IDLE_SECONDS

            for stack, token in ((a, token_a), (b, token_b)):
                assert not loose_files(stack.home)
                assert not files_holding(stack.home, token, allowed=set())
                secret_key = (stack.home / "secret-key").read_text().strip()
                assert not files_holding(stack.home, secret_key, allowed={"secret-key"})
        finally:
            for stack in stacks:
                stop_stack(stack)

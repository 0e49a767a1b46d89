"""Real servers and real processes for the agent's tests.

- `metadata`: an IMDS-compatible HTTP server whose notices a test posts and withdraws; it can
  require IMDSv2 tokens, refuse them (IMDSv1 only), or fail.
- `portal`: the portal's agent API as a small HTTP server that records what the agent sends,
  stores events once per `seq` as the real portal does, and can be switched off (connections
  refused) or made to lose its answers.
- `start_agent`: runs `python -m migration.agent` as a real process against both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SIGNAL_WORKLOAD = HERE / "signal_workload.py"
TOKEN = "agent-test-token"
# Generous: the suite must pass on a loaded two-core machine.
TIMEOUT = 60.0


def wait_until(
    condition: Callable[[], object], timeout: float = TIMEOUT, message: str = ""
) -> object:
    """Poll `condition` until it returns something true; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {message or condition}"
            )
        time.sleep(0.05)


class _Server:
    """A ThreadingHTTPServer on 127.0.0.1 that can be stopped and started on the same port."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _json_answer(handler: BaseHTTPRequestHandler, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _lower(headers: object) -> dict[str, str]:
    """Header names in lower case (HTTP names are case-insensitive; urllib title-cases them)."""
    return {k.lower(): v for k, v in headers.items()}  # type: ignore[attr-defined]


def iso_in(seconds: float) -> str:
    """An IMDS timestamp `seconds` from now."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeMetadata(_Server):
    """The two notice documents of EC2's instance metadata service, plus the IMDSv2 token."""

    def __init__(self, require_token: bool = False, token_support: bool = True) -> None:
        super().__init__()
        self.require_token = require_token
        self.token_support = token_support
        self.advance: dict[str, object] | None = None
        self.final: dict[str, object] | None = None
        self.fail_gets = 0  # the next n GETs answer 500
        self.always_fail = False
        self.tokens: list[str] = []
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def notice_advance(self) -> None:
        self.advance = {"noticeTime": iso_in(0)}

    def notice_final(self, in_seconds: float) -> None:
        # EC2 timestamps have whole seconds: round up so the window is never shorter than asked.
        self.final = {"action": "terminate", "time": iso_in(in_seconds + 1)}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_PUT(self) -> None:
                with fake.lock:
                    fake.requests.append(("PUT", self.path, _lower(self.headers)))
                if self.path != "/latest/api/token" or not fake.token_support:
                    self.send_error(405 if fake.token_support is False else 404)
                    return
                ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                if not ttl or not ttl.isdigit():
                    self.send_error(400)
                    return
                token = f"token-{len(fake.tokens) + 1}"
                fake.tokens.append(token)
                data = token.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with fake.lock:
                    fake.requests.append(("GET", self.path, _lower(self.headers)))
                    failing = fake.always_fail or fake.fail_gets > 0
                    if fake.fail_gets > 0:
                        fake.fail_gets -= 1
                if failing:
                    self.send_error(500)
                    return
                if fake.require_token and (
                    self.headers.get("X-aws-ec2-metadata-token") not in fake.tokens
                ):
                    self.send_error(401)
                    return
                documents = {
                    "/latest/meta-data/events/recommendations/rebalance": fake.advance,
                    "/latest/meta-data/spot/instance-action": fake.final,
                }
                if self.path not in documents:
                    self.send_error(404)
                    return
                document = documents[self.path]
                if document is None:
                    self.send_error(404)
                else:
                    _json_answer(self, 200, document)

        return Handler


class FakePortal(_Server):
    """The portal's agent API: stores each event once per seq and answers the highest seq held."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []  # stored, once per instance and seq
        self.highest: dict[str, int] = {}
        self.received: list[dict[str, Any]] = []  # every event of every request
        self.lines: list[dict[str, Any]] = []
        self.log_posts: list[dict[str, Any]] = []
        self.lose_answers = 0  # store the next n event batches but drop the connection
        self.unauthorised = 0
        self.lock = threading.Lock()

    def down(self) -> None:
        """Switch the portal off: connections are refused until `up()`."""
        self.stop()

    def up(self) -> None:
        self.start()

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e["type"] == kind]

    def types(self) -> list[str]:
        with self.lock:
            return [str(e["type"]) for e in self.events]

    def handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                token = (self.headers.get("Authorization") or "").removeprefix("Agent ")
                if not token.startswith(TOKEN):
                    with fake.lock:
                        fake.unauthorised += 1
                    _json_answer(self, 401, {"detail": "bad agent token"})
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/api/agent/events/":
                    with fake.lock:
                        # Each instance (token) numbers its own events, as on the real portal.
                        for event in body["events"]:
                            fake.received.append(event)
                            if event["seq"] > fake.highest.get(token, 0):
                                fake.highest[token] = event["seq"]
                                fake.events.append({**event, "instance": token})
                        acked = fake.highest.get(token, 0)
                        lose = fake.lose_answers > 0
                        if lose:
                            fake.lose_answers -= 1
                    if lose:
                        self.close_connection = True
                        return
                    _json_answer(self, 200, {"acked": acked})
                elif self.path == "/api/agent/logs/":
                    with fake.lock:
                        fake.log_posts.append(body)
                        fake.lines.extend(body["lines"])
                    _json_answer(self, 200, {"stored": len(body["lines"])})
                else:
                    _json_answer(self, 404, {"detail": "not found"})

        return Handler


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    server = FakeMetadata()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    server = FakePortal()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A real file store, in a folder of its own."""
    folder = tmp_path / "store"
    folder.mkdir()
    return folder.as_uri()


@dataclass
class AgentRun:
    """One agent process and the folders it writes."""

    process: subprocess.Popen[bytes]
    agent_dir: Path
    checkpoint_dir: Path
    stderr_path: Path
    rank: int = 0
    returncode: int | None = field(default=None)

    def wait(self, timeout: float = TIMEOUT) -> int:
        try:
            self.returncode = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"the agent did not exit in {timeout} s:\n{self.stderr()}"
            ) from None
        return self.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def output(self) -> str:
        """The workload's output as the agent logged it for this rank."""
        path = self.agent_dir / "logs" / f"rank-{self.rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)


def agent_environment(
    tmp_path: Path, metadata: FakeMetadata, portal: FakePortal | None, **overrides: str
) -> dict[str, str]:
    """The environment a capacity backend would give the agent, with fast test timings."""
    # The test process's own environment (minus Baton's): numerical libraries read settings
    # from it (OPENBLAS_CORETYPE picks the BLAS kernels), and a run under the agent must
    # compute exactly what the same command computes outside it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "BATON_JOB_ID": "42",
            "BATON_RANK": "0",
            "BATON_WORLD_SIZE": "1",
            "BATON_METADATA_URL": metadata.url,
            "BATON_AGENT_MODE": "sdk",
            "BATON_AGENT_POLL_INTERVAL": "0.1",
            "BATON_AGENT_HEARTBEAT_INTERVAL": "1",
            "BATON_AGENT_SAFETY_MARGIN": "0.5",
            "BATON_AGENT_GRACE_PERIOD": "10",
            "BATON_AGENT_SYNC_INTERVAL": "0.5",
            "BATON_AGENT_LOG_FLUSH_INTERVAL": "0.2",
            "BATON_AGENT_FLUSH_TIMEOUT": "15",
            "BATON_AGENT_LOG_LEVEL": "DEBUG",
        }
    )
    if portal is not None:
        env["BATON_PORTAL_URL"] = portal.url
        env["BATON_AGENT_TOKEN"] = TOKEN
    env.update(overrides)
    return env


@pytest.fixture
def start_agent(
    tmp_path: Path, metadata: FakeMetadata, portal: FakePortal
) -> Iterator[Callable[..., AgentRun]]:
    """Start `python -m migration.agent -- <command>`; every agent is ended after the test."""
    runs: list[AgentRun] = []

    def start(command: list[str], name: str = "agent", **overrides: str) -> AgentRun:
        agent_dir = tmp_path / f"{name}-{len(runs)}"
        env = agent_environment(tmp_path, metadata, portal)
        env["BATON_AGENT_DIR"] = str(agent_dir)
        env["BATON_AGENT_TOKEN"] = f"{TOKEN}-{len(runs)}"  # one instance per agent
        env.setdefault("BATON_CHECKPOINT_DIR", str(agent_dir / "checkpoint"))
        env.update(overrides)
        agent_dir.mkdir(parents=True)
        stderr_path = agent_dir.with_name(agent_dir.name + ".stderr")
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "migration.agent", "--", *command],
                env=env,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
            )
        run = AgentRun(process, agent_dir, Path(env["BATON_CHECKPOINT_DIR"]), stderr_path)
        runs.append(run)
        return run

    yield start
    for run in runs:
        # A stop request first, so the agent ends its workload's process group too.
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGINT)
            run.process.send_signal(signal.SIGINT)
            try:
                run.process.wait(20)
            except subprocess.TimeoutExpired:
                run.process.kill()
                run.process.wait()


def signal_workload(*args: str) -> list[str]:
    """The command of the test workload that records the signals it receives."""
    return [sys.executable, str(SIGNAL_WORKLOAD), *args]

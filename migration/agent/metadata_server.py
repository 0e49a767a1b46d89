"""The IMDS-compatible metadata endpoint's answers, and a small server of them (no Django).

One piece, two servers: the portal's view for local instances (`migration/imds.py`) and the
rehearsal's built-in endpoint (`baton-agent rehearse`) answer the same paths the same way, so
the agent's client (`metadata.py`) reads them exactly as it reads EC2's:

- `PUT latest/api/token` (header `X-aws-ec2-metadata-token-ttl-seconds`: 1..21600) -> a token;
- `GET latest/meta-data/events/recommendations/rebalance` -> `{"noticeTime"}` or 404;
- `GET latest/meta-data/spot/instance-action` -> `{"action": "terminate", "time"}` or 404.

GETs without a valid token are 401 (IMDSv2 only). How tokens are made and checked is the
server's own business: the portal signs them, the rehearsal keeps a set.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from migration.agent.metadata import (
    ADVANCE_PATH,
    FINAL_PATH,
    TOKEN_HEADER,
    TOKEN_PATH,
    TOKEN_TTL_HEADER,
)

MAX_TTL = 21600
ADVANCE = "advance"
FINAL = "final"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, body, content type and extra headers."""

    status: int
    body: str = ""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


NOT_FOUND = Answer(404, "Not Found")
UNAUTHORIZED = Answer(401, "Unauthorized")
NOT_ALLOWED = Answer(405, "Method Not Allowed")


def iso(moment: datetime) -> str:
    """A time as IMDS writes it: `2024-05-01T12:00:00Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def token_ttl(raw: str) -> int | None:
    """The TTL a token request asks for, or None when it is not 1..21600 seconds."""
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_TTL:
        return int(raw)
    return None


def token_answer(ttl_header: str, make_token: Callable[[int], str]) -> Answer:
    """The answer to `PUT latest/api/token`: 400 for a bad TTL, else a new token."""
    ttl = token_ttl(ttl_header)
    if ttl is None:
        return Answer(400, "Bad Request")
    return Answer(200, make_token(ttl), headers=((TOKEN_TTL_HEADER, str(ttl)),))


def notice_answer(
    level: str,
    now: datetime,
    advance_at: datetime | None,
    final_at: datetime | None,
    reclaim_at: datetime | None,
    gone: bool = False,
) -> Answer:
    """The notice document of `level` at `now` for an instance with this schedule.

    The advance notice appears at `advance_at`; the final one at `final_at`, saying the
    instance goes at `reclaim_at`; an instance already `gone` answers the final notice, as a
    machine being taken away would.
    """
    if level == ADVANCE and advance_at is not None and advance_at <= now:
        return _json({"noticeTime": iso(advance_at)})
    if level == FINAL and (gone or (final_at is not None and final_at <= now)):
        return _json({"action": "terminate", "time": iso(reclaim_at or now)})
    return NOT_FOUND


def _json(document: dict[str, str]) -> Answer:
    return Answer(200, json.dumps(document), "application/json")


@dataclass
class Schedule:
    """The notices of one simulated instance (times are aware datetimes)."""

    advance_at: datetime | None = None
    final_at: datetime | None = None
    reclaim_at: datetime | None = None


class MetadataServer:
    """A metadata endpoint on 127.0.0.1 for one simulated instance whose notices are set by
    calling `notify` (the rehearsal's; tokens live in memory)."""

    def __init__(self) -> None:
        self.schedule = Schedule()
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="metadata-endpoint",
            daemon=True,
        )

    @property
    def url(self) -> str:
        """The endpoint's base URL, as an agent's BATON_METADATA_URL."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def notify(self, advance_at: datetime | None, final_at: datetime, reclaim_at: datetime) -> None:
        """Post notices: advance (optional) and final, with the instance's end."""
        with self._lock:
            self.schedule = Schedule(advance_at, final_at, reclaim_at)

    def clear(self) -> None:
        """No notice any more (a new instance behind the same endpoint)."""
        with self._lock:
            self.schedule = Schedule()

    def _new_token(self, ttl: int) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return token

    def _valid(self, token: str) -> bool:
        with self._lock:
            expires = self._tokens.get(token)
        return expires is not None and time.monotonic() < expires

    def answer(self, method: str, path: str, headers: dict[str, str]) -> Answer:
        """The answer to one request (headers with lower-case names)."""
        if path == TOKEN_PATH:
            if method != "PUT":
                return NOT_ALLOWED
            return token_answer(headers.get(TOKEN_TTL_HEADER.lower(), ""), self._new_token)
        levels = {ADVANCE_PATH: ADVANCE, FINAL_PATH: FINAL}
        if path not in levels:
            return NOT_FOUND
        if method != "GET":
            return NOT_ALLOWED
        if not self._valid(headers.get(TOKEN_HEADER.lower(), "")):
            return UNAUTHORIZED
        with self._lock:
            schedule = self.schedule
        return notice_answer(
            levels[path],
            datetime.now(UTC),
            schedule.advance_at,
            schedule.final_at,
            schedule.reclaim_at,
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return  # every poll would be a line

            def _reply(self) -> None:
                headers = {name.lower(): value for name, value in self.headers.items()}
                answer = server.answer(self.command, self.path, headers)
                body = answer.body.encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", answer.content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in answer.headers:
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = _reply
            do_PUT = _reply

        return Handler

"""Client of the IMDS-compatible metadata endpoint: the two levels of spot interruption notice.

The same code runs on EC2 and on the local backend, which serves the same paths. On EC2 the
client uses IMDSv2 (a session token from `PUT /latest/api/token`); an endpoint that does not
support the PUT (404, 405, 400, 501) is spoken to as IMDSv1, without a token.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from migration.agent import httpjson

logger = logging.getLogger(__name__)

TOKEN_PATH = "/latest/api/token"
ADVANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
FINAL_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
# Statuses with which an endpoint says "I do not do IMDSv2 tokens".
_NO_TOKEN_SUPPORT = (400, 404, 405, 501)


class MetadataError(RuntimeError):
    """The metadata endpoint could not be read (unreachable, refused, or a bad document)."""


@dataclass(frozen=True)
class Notice:
    """One interruption notice: `advance` (rebalance) or `final` (instance-action)."""

    level: str
    source: str
    received_at: datetime
    deadline: datetime | None = None
    notice_time: str = ""
    document: dict[str, object] = field(default_factory=dict)

    def event(self) -> dict[str, object]:
        """The fields of the `notice` event the portal receives."""
        return {
            "level": self.level,
            "source": self.source,
            "deadline": self.deadline.isoformat() if self.deadline else None,
            "notice_time": self.notice_time or None,
            "document": self.document or None,
        }


def parse_time(text: object) -> datetime | None:
    """An IMDS timestamp (`2024-05-01T12:00:00Z`) as an aware datetime; None if unreadable."""
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class MetadataClient:
    """Reads the notice documents, with an IMDSv2 token when the endpoint supports one."""

    def __init__(self, base_url: str, timeout: float = 2.0, token_ttl: int = 21600) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.token_ttl = token_ttl
        self.version: int | None = None  # 2 or 1 once known
        self._token = ""
        self._token_expires = 0.0

    def _fetch_token(self) -> None:
        answer = self._send("PUT", TOKEN_PATH, {TOKEN_TTL_HEADER: str(self.token_ttl)})
        if answer.status == 200 and answer.body.strip():
            self._token = answer.body.decode("ascii", "replace").strip()
            # Renew a minute early so a poll never carries a token that expires in flight.
            self._token_expires = time.monotonic() + max(self.token_ttl - 60, 1)
            if self.version != 2:
                logger.info("metadata endpoint speaks IMDSv2; using session tokens")
            self.version = 2
        elif answer.status in _NO_TOKEN_SUPPORT:
            if self.version != 1:
                logger.info(
                    "metadata endpoint has no token support (HTTP %s); using IMDSv1", answer.status
                )
            self.version = 1
            self._token = ""
        else:
            raise MetadataError(f"PUT {TOKEN_PATH} answered HTTP {answer.status}")

    def _send(self, method: str, path: str, headers: dict[str, str]) -> httpjson.Response:
        try:
            return httpjson.request(
                self.base_url + path, method=method, headers=headers, timeout=self.timeout
            )
        except httpjson.TransportError as exc:
            raise MetadataError(str(exc)) from exc

    def _headers(self) -> dict[str, str]:
        if self.version is None or (self.version == 2 and time.monotonic() >= self._token_expires):
            self._fetch_token()
        return {TOKEN_HEADER: self._token} if self.version == 2 else {}

    def get_document(self, path: str) -> dict[str, object] | None:
        """The JSON document at `path`, or None for 404 (no notice)."""
        answer = self._send("GET", path, self._headers())
        if answer.status == 401:
            # The token expired or the endpoint started to require one: get a fresh token once.
            self.version = None
            answer = self._send("GET", path, self._headers())
        if answer.status == 404:
            return None
        if answer.status != 200:
            raise MetadataError(f"GET {path} answered HTTP {answer.status}")
        try:
            document = answer.json()
        except ValueError as exc:
            raise MetadataError(f"GET {path} did not return JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise MetadataError(f"GET {path} did not return a JSON object")
        return document

    def advance_notice(self) -> Notice | None:
        """The rebalance recommendation, if one is posted."""
        document = self.get_document(ADVANCE_PATH)
        if document is None:
            return None
        return Notice(
            level="advance",
            source="imds",
            received_at=datetime.now(UTC),
            notice_time=str(document.get("noticeTime") or ""),
            document=document,
        )

    def final_notice(self, default_window: float = 120.0) -> Notice | None:
        """The instance action (terminate, stop or hibernate), if one is posted.

        A document without a readable `time` gets `default_window` seconds, the window EC2
        promises, so the workload still gets its chance to checkpoint.
        """
        document = self.get_document(FINAL_PATH)
        if document is None:
            return None
        now = datetime.now(UTC)
        deadline = parse_time(document.get("time"))
        if deadline is None:
            logger.warning("instance-action without a readable time: %r", document)
            deadline = now + timedelta(seconds=default_window)
        return Notice(
            level="final",
            source="imds",
            received_at=now,
            deadline=deadline,
            notice_time=str(document.get("time") or ""),
            document=document,
        )

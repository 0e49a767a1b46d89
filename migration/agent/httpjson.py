"""A small HTTP helper over urllib: one call, a status and a body, transport errors as one type.

The agent talks to three HTTP peers (the metadata endpoint, the portal, its own loopback
endpoint in self-checks) and treats their answers the same way: an HTTP status is an answer
to inspect, a refused connection or a timeout is a `TransportError` to retry later.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlparse

# The metadata endpoint and loopback peers must never go through an HTTP proxy someone set
# for the instance's outbound traffic: a proxy cannot answer for this machine's IMDS.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_DEFAULT = urllib.request.build_opener()
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "169.254.169.254", "fd00:ec2::254")


class TransportError(OSError):
    """No HTTP answer: connection refused or reset, timeout, bad status line."""


@dataclass(frozen=True)
class Response:
    """An HTTP answer, whatever its status."""

    status: int
    body: bytes

    def json(self) -> object:
        """The body as JSON; ValueError when it is not JSON."""
        return json.loads(self.body.decode("utf-8"))


def request(
    url: str,
    method: str = "GET",
    body: object | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> Response:
    """Send one request; JSON-encode `body` when given. Raise TransportError without an answer."""
    data = None
    all_headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body, separators=(",", ":")).encode("utf-8")
        all_headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, headers=all_headers, method=method)
    opener = _DIRECT if urlparse(url).hostname in _LOOPBACK else _DEFAULT
    try:
        with opener.open(req, timeout=timeout) as answer:
            return Response(answer.status, answer.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Response(exc.code, exc.read() or b"")
    except (http.client.HTTPException, OSError) as exc:  # URLError and timeouts are OSErrors
        reason = getattr(exc, "reason", exc)
        raise TransportError(f"{method} {url}: {reason}") from exc

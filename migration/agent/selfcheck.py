"""The self-check at start: can the agent hear a notice, and can it tell the workload?

The signal check starts a tiny probe process the way the workload is started (its own session)
and sends it the signals the workload would get. A sandbox or container that blocks signals
between the two, or a final signal the probe never sees, fails the check before any training
time depends on it.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading

from migration.agent import httpjson
from migration.agent.metadata import ADVANCE_PATH, FINAL_PATH, MetadataClient, MetadataError

logger = logging.getLogger(__name__)

# The probe answers "ready", then the name of each signal it receives; it stops after the last.
# It takes the signals with sigwait, not in a handler: a handler that prints can be interrupted
# by the next signal inside print, which raises "reentrant call" and kills the probe (seen on a
# loaded machine as a failed self-check).
_PROBE = """
import signal, sys
names = sys.argv[1:]
wanted = {signal.Signals[name] for name in names}
signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
print("ready", flush=True)
while names:
    name = signal.Signals(signal.sigwait(wanted)).name
    print(name, flush=True)
    names.remove(name)
"""
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)


def check_metadata(client: MetadataClient) -> dict[str, object]:
    """Both notice paths answer (200 or 404); which IMDS version the endpoint speaks."""
    try:
        for path in (ADVANCE_PATH, FINAL_PATH):
            client.get_document(path)
    except MetadataError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "imds_version": client.version}


def check_signals(signals: list[signal.Signals], timeout: float = 20.0) -> dict[str, object]:
    """Start a probe in its own session and deliver `signals` to it, in order."""
    names = [sig.name for sig in signals]
    catchable = [name for name in names if signal.Signals[name] not in _UNCATCHABLE]
    try:
        probe = subprocess.Popen(
            [sys.executable, "-c", _PROBE, *catchable],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
    except OSError as exc:
        return {"ok": False, "signals": names, "error": f"cannot start a probe: {exc}"}
    assert probe.stdout is not None
    received: list[str] = []
    # A lost signal would leave the reads below waiting forever: the watchdog ends the probe.
    watchdog = threading.Timer(timeout, probe.kill)
    watchdog.start()
    try:
        if probe.stdout.readline().strip() != "ready":
            return {"ok": False, "signals": names, "error": "the probe did not start"}
        for sig in signals:
            probe.send_signal(sig)
            if sig in _UNCATCHABLE:
                probe.wait()
                if probe.returncode == -sig:
                    received.append(sig.name)
                break
            line = probe.stdout.readline().strip()
            if not line:
                break
            received.append(line)
        probe.wait()
    except OSError as exc:
        return {"ok": False, "signals": names, "received": received, "error": str(exc)}
    finally:
        watchdog.cancel()
        if probe.poll() is None:
            probe.kill()
            probe.wait()
        probe.stdout.close()
    ok = received == names
    result: dict[str, object] = {"ok": ok, "signals": names}
    if not ok:
        result["error"] = f"the probe received {received or 'nothing'}"
    return result


def check_local_endpoint(url: str) -> dict[str, object]:
    """The local endpoint answers its health check."""
    try:
        answer = httpjson.request(url + "/health", timeout=5.0)
    except httpjson.TransportError as exc:
        return {"ok": False, "url": url, "error": str(exc)}
    return {"ok": answer.status == 200, "url": url}

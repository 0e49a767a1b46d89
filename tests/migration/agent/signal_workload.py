"""A test workload that records which signals reach it (one line per signal in RECORD).

    signal_workload.py RECORD [--steps N] [--step-ms MS] [--ignore-term] [--report]
                              [--exit CODE] [--spam N] [--long-line N]

It writes its BATON_* environment to RECORD.env.json, prints `step=<n>` every ten steps, stops
cleanly on SIGTERM (unless --ignore-term) with `stopped step=<n>`, and prints the `final ...`
line after N steps. With --report it reports to BATON_AGENT_URL like the SDK does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from types import FrameType


def report(kind: str, body: dict[str, object]) -> None:
    """POST one report to the agent's local endpoint."""
    request = urllib.request.Request(
        os.environ["BATON_AGENT_URL"] + "/" + kind,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("record", type=Path)
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--step-ms", type=float, default=20)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--spam", type=int, default=0, help="print this many lines at once")
    parser.add_argument("--long-line", type=int, default=0, help="print one line this long")
    args = parser.parse_args()
    state = {"stop": False}

    def record(signum: int, frame: FrameType | None) -> None:
        with args.record.open("a") as handle:
            handle.write(signal.Signals(signum).name + "\n")
        if signum == signal.SIGTERM and not args.ignore_term:
            state["stop"] = True

    signal.signal(signal.SIGUSR1, record)
    signal.signal(signal.SIGTERM, record)
    env = {k: v for k, v in os.environ.items() if k.startswith("BATON_")}
    args.record.with_name(args.record.name + ".env.json").write_text(json.dumps(env))
    args.record.touch()
    sys.stdout.write("ready\n")
    for n in range(args.spam):
        sys.stdout.write(f"spam line {n + 1}\n")
    if args.long_line:
        sys.stdout.write("x" * args.long_line + "\n")
    sys.stdout.flush()

    step = 0
    while step < args.steps and not state["stop"]:
        time.sleep(args.step_ms / 1000)
        step += 1
        if step % 10 == 0:
            sys.stdout.write(f"step={step}\n")
            sys.stdout.flush()
            if args.report:
                report("progress", {"step": step, "val_loss": 1.0 / step})
    if state["stop"]:
        if args.report:
            report(
                "checkpoint",
                {
                    "manifest": f"jobs/42/manifests/{step:012d}-emergency-r0.json",
                    "step": step,
                    "kind": "emergency",
                    "bytes_new": 10,
                    "bytes_total": 10,
                    "validation_reference": 0.5,
                },
            )
        sys.stdout.write(f"stopped step={step}\n")
        return 0
    sha = hashlib.sha256(str(step).encode()).hexdigest()
    if args.report:
        report("result", {"step": step, "val_loss": 0.25, "weights_sha256": sha})
    sys.stdout.write(f"final step={step} val_loss=0.250000 weights_sha256={sha}\n")
    return args.exit


if __name__ == "__main__":
    sys.exit(main())

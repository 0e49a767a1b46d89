"""Migration benchmark: how long a job takes to run again after an interruption, phase by
phase, and how fast placement decides for a queue of jobs.

    .venv/bin/python bench/migration.py [--sections recovery,placement] [--repeats 5]
        [--state-mb 100] [--provisioning-delay 0] [--accelerator T4]

- recovery: the whole system (`make run`'s launcher in a throw-away BATON_HOME, SQLite, the
  local backend) runs an `mlp_numpy` job with a `--state-mb` state; it is interrupted
  `--repeats` times (no advance notice, a 30 s final window) and each recovery is split by the
  phases of its timeline: notice seen (from the interrupt call to the agent's report), the
  emergency checkpoint committed, released, placed, replica ready, started (includes the
  provisioning delay, 0 here unless `--provisioning-delay`), restored, validated, running.
  Baseline: the same job's cold start (submit -> running), measured in the same run.
- placement: 1,000 pending jobs (100 migrations first) over 500 pools (random cards, GPUs,
  markets, prices, interruption rates, notices and free slots), placed in one pass by
  `place_many` (capacity taken as it goes) against the baseline of one `choose_pool` call per
  job over every pool with the same capacity bookkeeping, interleaved, `--repeats` times each;
  the two must choose the same pools. Target: the whole queue in at most 1 s.

Every row prints min / median / max over the repetitions, the ratio of its median to the
baseline's median, and its target when it has one. A new section is a function returning rows,
registered in `SECTIONS`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.table import Row, print_machine, print_table, sections  # noqa: E402
from migration.compatibility import Rule, hardware_options  # noqa: E402
from migration.placement import (  # noqa: E402
    PlacementChoice,
    PlacementRequest,
    PoolView,
    Rejection,
    choose_pool,
    place_many,
)

# --- recovery: notice -> running again, on the whole system -----------------------------------

# Phases of a migration as the timeline records them (Migration.timings: seconds since the
# previous event), grouped into the steps the issue names.
RECOVERY_PHASES = [
    ("notice seen", ("notice_final",)),
    ("checkpoint committed", ("checkpoint_started", "checkpoint_committed")),
    ("released", ("released",)),
    ("placed", ("placement_decided",)),
    ("replica ready", ("replica_ready",)),
    ("started", ("instance_started",)),
    ("restored", ("restore_done",)),
    ("validated", ("validation_passed",)),
    ("running", ("running",)),
]


class Portal:
    """`make run`'s launcher in a throw-away BATON_HOME on a free port, spoken to over HTTP."""

    def __init__(self, provisioning_delay_s: float, keep: bool = False) -> None:
        self.keep = keep
        self.home = Path(tempfile.mkdtemp(prefix="baton-bench-"))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "DATABASE_URL"))
        }
        self.env.update(
            BATON_HOME=str(self.home),
            PORT=str(self.port),
            BATON_PROVISIONING_DELAY_S=str(provisioning_delay_s),
            DJANGO_SUPERUSER_USERNAME="bench",
            DJANGO_SUPERUSER_PASSWORD="bench-password-1",
            DJANGO_SUPERUSER_EMAIL="bench@example.com",
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def __enter__(self) -> Portal:
        log = (self.home / "launcher.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "portal.launcher"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: self.answers(), 180, "the portal to answer")
        subprocess.run(
            [sys.executable, "manage.py", "createsuperuser", "--noinput"],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
        )
        answer = self.http(
            "POST", "/api/auth/token/", {"username": "bench", "password": "bench-password-1"}
        )
        self.token = answer["token"]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.keep:
            print(f"kept BATON_HOME at {self.home}")
        else:
            shutil.rmtree(self.home, ignore_errors=True)

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(self.base + "/login/", timeout=2)
            return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def http(self, method: str, path: str, body: object | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _items(body: Any) -> list[Any]:
    return list(body["results"] if isinstance(body, dict) and "results" in body else body)


def section_recovery(args: argparse.Namespace) -> list[Row]:
    """Interrupt a running job with a 100 MiB state `args.repeats` times and split each
    recovery by phase; the baseline is the same job's cold start (submit -> running)."""
    portal = Portal(args.provisioning_delay, keep=args.keep)
    with portal:
        job_body = {
            "name": "bench-recovery",
            "workload": {
                "template": "mlp_numpy",
                "params": {"seed": 1, "state_mb": args.state_mb, "step_ms": 20},
            },
            "accelerator": args.accelerator,
            "total_steps": 10_000_000,
            "checkpoint_every_steps": 500,
            "tolerance": "aggressive",
        }
        submitted = time.monotonic()
        job = portal.http("POST", "/api/jobs/", job_body)
        path = f"/api/jobs/{job['id']}/"
        wait_for(lambda: portal.http("GET", path)["state"] == "running", 180, "the job to run")
        cold_start = time.monotonic() - submitted
        splits: list[dict[str, float]] = []
        for repetition in range(args.repeats):
            step = portal.http("GET", path)["step"]

            def trained(before: int = step) -> bool:
                return bool(portal.http("GET", path)["step"] > before + 20)

            wait_for(trained, 60, "training")
            instance = next(
                i
                for i in _items(portal.http("GET", f"/api/instances/?job={job['id']}"))
                if i["state"] == "running"
            )
            asked = datetime.now(UTC)
            portal.http(
                "POST",
                f"/api/instances/{instance['id']}/interrupt/",
                {"advance_notice_s": 0, "final_window_s": 30},
            )

            def finished(done: int = repetition + 1) -> list[Any] | None:
                found = _items(portal.http("GET", f"{path}migrations/"))
                closed = [m for m in found if m["finished_at"]]
                return closed if len(closed) >= done else None

            migration = max(wait_for(finished, 240, "the job to run again"), key=lambda m: m["id"])
            timings = migration["timings"]
            events = _items(portal.http("GET", f"{path}timeline/?since=0"))
            notice = next(
                e
                for e in events
                if e["migration"] == migration["id"] and e["kind"] == "notice_final"
            )
            seen = datetime.fromisoformat(notice["at"].replace("Z", "+00:00"))
            split = {"notice seen": (seen - asked).total_seconds()}
            for name, kinds in RECOVERY_PHASES[1:]:
                split[name] = sum(float(timings.get(kind, 0.0)) for kind in kinds)
            split["notice -> running"] = sum(split.values())
            splits.append(split)
            print(f"  recovery {repetition + 1}: {split['notice -> running']:.2f} s", flush=True)
        portal.http("POST", f"{path}cancel/", {})
    rows = []
    for name in [*(n for n, _ in RECOVERY_PHASES), "notice -> running"]:
        values = [s[name] for s in splits]
        rows.append(Row(name, values, [v / cold_start for v in values]))
    rows.append(Row("baseline: cold start (submit -> running)", [cold_start], [1.0]))
    return rows


# --- placement: 1,000 pending jobs over 500 pools --------------------------------------------

CARDS = ["T4", "A10G", "V100-16GB", "V100-32GB", "A100-40GB"]
RULES = [
    Rule("T4", "A10G", "cross_generation", 1),
    Rule("V100-16GB", "V100-32GB", "larger_memory", 1),
    Rule("V100-32GB", "V100-16GB", "model_parallel", 2),
]


PLACEMENT_JOBS = 1000
PLACEMENT_POOLS = 500
PLACEMENT_MIGRATIONS = 100  # at the head of the queue, as the orchestrator orders it
PLACEMENT_TARGET_S = 1.0


def placement_workload(seed: int) -> tuple[list[PlacementRequest], list[PoolView]]:
    """500 pools of random cards, GPUs, markets, prices, rates and free slots; 1,000 pending
    jobs, the first 100 of them migrations (a checkpoint with replicas in one or two regions)."""
    rng = random.Random(seed)
    regions = ["us-east-1", "us-west-2", "eu-west-1"]
    pools = [
        PoolView(
            id=i,
            region=rng.choice(regions),
            zone="",
            instance_type=f"type-{i % 40}",
            accelerator=rng.choice(CARDS),
            gpus_per_instance=rng.choice([1, 1, 2, 4, 8]),
            market=rng.choice(["spot", "on_demand"]),
            price_per_hour=rng.uniform(0.1, 30),
            free=rng.randint(0, 6),
            interruption_rate_per_hour=rng.uniform(0, 2),
            notice_s=rng.choice([120.0, 120.0, 300.0]),
        )
        for i in range(PLACEMENT_POOLS)
    ]
    requests = []
    for index in range(PLACEMENT_JOBS):
        card = rng.choice(CARDS)
        checkpoint_gb = rng.uniform(0.1, 200)
        migration = index < PLACEMENT_MIGRATIONS
        requests.append(
            PlacementRequest(
                options=tuple(
                    hardware_options(card, rng.choice([1, 2]), RULES, rng.random() < 0.3)
                ),
                nodes=rng.choice([1, 1, 1, 2, 4]),
                market=rng.choice(["spot", "on_demand"]),
                max_price_per_hour=rng.choice([None, 50.0, 100.0]),
                replica_regions=frozenset(rng.sample(regions, rng.randint(1, 2)))
                if migration
                else frozenset(),
                requested=card,
                remaining_hours=rng.uniform(0.5, 48),
                restart_overhead_hours=0.1 + checkpoint_gb / 0.2 / 3600,
                checkpoint_interval_hours=5 / 60,
                save_seconds=checkpoint_gb,
                copy_hours=checkpoint_gb / 0.1 / 3600,
            )
        )
    return requests, pools


def one_by_one(
    requests: list[PlacementRequest], pools: list[PoolView]
) -> list[PlacementChoice | Rejection]:
    """The baseline: one `choose_pool` per job over every pool, the chosen pool's free
    capacity lowered before the next job (what a loop over `place_job` would see)."""
    current = list(pools)
    index = {pool.id: i for i, pool in enumerate(current)}
    results: list[PlacementChoice | Rejection] = []
    for request in requests:
        result = choose_pool(request, current)
        if isinstance(result, PlacementChoice):
            at = index[result.pool.id]
            current[at] = replace(current[at], free=current[at].free - request.nodes)
        results.append(result)
    return results


def _timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def section_placement(args: argparse.Namespace) -> list[Row]:
    """1,000 pending jobs over 500 pools: `place_many` (pools indexed by hardware and market
    once) against one `choose_pool` per job over every pool, interleaved, the order of the
    two swapped every repetition; both must choose the same pools."""
    requests, pools = placement_workload(seed=1)
    batch_results, baseline_results = place_many(requests, pools), one_by_one(requests, pools)
    same = [
        (a.pool.id, a.option) if isinstance(a, PlacementChoice) else a.reason for a in batch_results
    ] == [
        (b.pool.id, b.option) if isinstance(b, PlacementChoice) else b.reason
        for b in baseline_results
    ]
    if not same:
        raise SystemExit("place_many and the choose_pool loop chose differently")
    batch: list[float] = []
    baseline: list[float] = []
    for repetition in range(args.repeats):  # interleaved, so a noisy moment hits both
        if repetition % 2:
            baseline.append(_timed(lambda: one_by_one(requests, pools)))
            batch.append(_timed(lambda: place_many(requests, pools)))
        else:
            batch.append(_timed(lambda: place_many(requests, pools)))
            baseline.append(_timed(lambda: one_by_one(requests, pools)))
    chosen = [r for r in batch_results if isinstance(r, PlacementChoice)]
    migrations = sum(isinstance(r, PlacementChoice) for r in batch_results[:PLACEMENT_MIGRATIONS])
    print(
        f"\nplacement: {len(requests)} jobs ({PLACEMENT_MIGRATIONS} migrations first) over "
        f"{len(pools)} pools; {len(chosen)} placed ({migrations} of the migrations), "
        f"{sum(c.option.substitute for c in chosen)} on a substitute; "
        "both ways chose the same pools"
    )
    return [
        Row(
            "place_many: 1,000 jobs, capacity as it goes",
            batch,
            [b / o for b, o in zip(batch, baseline, strict=True)],
            target=PLACEMENT_TARGET_S,
        ),
        Row("baseline: choose_pool per job, every pool", baseline, [1.0] * len(baseline)),
    ]


SECTIONS: dict[str, tuple[Callable[[argparse.Namespace], list[Row]], str, str]] = {
    "recovery": (section_recovery, "seconds", "the cold start"),
    "placement": (section_placement, "seconds", "one choose_pool per job"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="recovery,placement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--state-mb", type=float, default=100.0)
    parser.add_argument("--provisioning-delay", type=float, default=0.0)
    parser.add_argument("--accelerator", default="T4")
    parser.add_argument(
        "--keep", action="store_true", help="keep the recovery run's BATON_HOME (logs, database)"
    )
    args = parser.parse_args()
    names = sections(parser, args.sections, SECTIONS)
    print_machine(
        parser,
        args.repeats,
        f"state {args.state_mb:g} MiB",
        f"provisioning delay {args.provisioning_delay:g} s",
    )
    for name in names:
        section, unit, baseline = SECTIONS[name]
        print_table(name, unit, section(args), baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())

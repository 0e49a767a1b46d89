"""Calibration on the whole system: what each job's estimate at submission said against what
it really cost and how long it really took, with real agents preempted by replayed traces.

    .venv/bin/python bench/calibration.py [--jobs 6] [--work-minutes 8] [--scale 60]
        [--parallel 1] [--traces data/spot-traces/availability/1-node/aws-02-15-2023]
        [--history-hours 168] [--keep]

`make run`'s launcher starts in a throw-away BATON_HOME (SQLite, the local backend, no
provisioning delay). Every trace of `--traces` is cut at `--history-hours`: history holds the
part before (imported over the demo's copy; the other datasets are dropped), and the market
simulator replays the part after, at `--scale` simulated seconds per wall second (60: a
simulated hour a minute), so estimates know only the week before what the jobs meet, as in
`bench/estimator.py`. A warm-up job is interrupted once so the estimates use a measured
migration overhead. Then `--jobs` V100 jobs (`mlp_numpy`, `--work-minutes` of work each,
tolerances in turn) run `--parallel` at a time (one by default: jobs sharing a pool share its
trace, whose every drop preempts one instance); each stores its estimate at submission, which
with the simulator on counts interruptions on the compressed clock. When every job has finished,
its realised cost (its instances' seconds at their pools' prices) and time (submission to
`succeeded`) are compared with the estimate of the market its first placement took.

Prints min / median / max over the jobs of expected / realised cost and time, against the
baseline of the always-on-demand estimate over the same realised figures (measured in the
same run), then `calibration: cost <x> time <y>` (mean |expected/realised - 1| over jobs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.migration import Portal, _items, wait_for  # noqa: E402
from bench.table import Row, print_table  # noqa: E402

TRACES = ROOT / "data" / "spot-traces" / "availability" / "1-node" / "aws-02-15-2023"
TOLERANCES = ("aggressive", "balanced")
STEP_MS = 100
TERMINAL = {"succeeded", "failed", "cancelled"}


def _submit(portal: Portal, index: int, work_minutes: float) -> dict[str, Any]:
    steps = round(work_minutes * 60 * 1000 / STEP_MS)
    return dict(
        portal.http(
            "POST",
            "/api/jobs/",
            {
                "name": f"calibration-{index}",
                "workload": {
                    "template": "mlp_numpy",
                    "params": {"seed": index, "step_ms": STEP_MS},
                },
                "accelerator": "V100-16GB",
                "total_steps": steps,
                "expected_hours": work_minutes / 60,
                "checkpoint_every_seconds": 10,
                "tolerance": TOLERANCES[index % len(TOLERANCES)],
            },
        )
    )


def _split_traces(folder: Path, hours: float, into: Path) -> tuple[Path, Path]:
    """Copies of every trace cut at `hours`: (history folder, future folder), same names."""
    history = into / "history" / folder.name
    future = into / "future"
    history.mkdir(parents=True)
    future.mkdir()
    for path in sorted(folder.glob("*.json")):
        payload = json.loads(path.read_text())
        cut = round(hours * 3600 / payload["metadata"]["gap_seconds"])
        if cut >= len(payload["data"]):
            continue
        for target, part in ((history, slice(0, cut)), (future, slice(cut, None))):
            data = {"metadata": payload["metadata"], "data": payload["data"][part]}
            if payload.get("prices"):
                data["prices"] = payload["prices"][part]
            (target / path.name).write_text(json.dumps(data))
    return history, future


def _manage(portal: Portal, *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=portal.env,
        check=True,
        capture_output=True,
    )


def _warm_up(portal: Portal) -> float:
    """Interrupt a first job once, so migrations have a measured overhead; its seconds."""
    job = _submit(portal, 99, 60.0)
    path = f"/api/jobs/{job['id']}/"
    wait_for(lambda: portal.http("GET", path)["state"] == "running", 180, "the warm-up job")
    instance = _items(portal.http("GET", f"/api/instances/?job={job['id']}"))[-1]
    portal.http(
        "POST",
        f"/api/instances/{instance['id']}/interrupt/",
        {"advance_notice_s": 0, "final_window_s": 20},
    )

    def migrated() -> list[Any]:
        done = _items(portal.http("GET", f"{path}migrations/"))
        return [m for m in done if m["finished_at"]]

    took = wait_for(migrated, 180, "the warm-up migration")
    portal.http("POST", f"{path}cancel/", {})
    first = took[0]
    span = datetime.fromisoformat(first["finished_at"]) - datetime.fromisoformat(
        first["started_at"]
    )
    return span.total_seconds()


def _finished_at(portal: Portal, job_id: int) -> datetime:
    events = _items(portal.http("GET", f"/api/jobs/{job_id}/timeline/?since=0"))
    done = [e for e in events if e["kind"] in TERMINAL]
    return datetime.fromisoformat(done[-1]["at"])


def _first_market(portal: Portal, job_id: int) -> str:
    events = _items(portal.http("GET", f"/api/jobs/{job_id}/timeline/?since=0"))
    placed = [e for e in events if e["kind"] == "placement_decided"]
    return str(placed[0]["data"].get("market", "spot")) if placed else "spot"


def _settled_cost(portal: Portal, job_id: int) -> float:
    """The job's cost once the sweep that accrues it has run after the finish."""
    previous = None
    for _ in range(12):
        cost = float(portal.http("GET", f"/api/jobs/{job_id}/")["cost_so_far"] or 0)
        if previous is not None and cost == previous:
            return cost
        previous = cost
        time.sleep(6)
    return previous or 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--work-minutes", type=float, default=8.0)
    parser.add_argument("--scale", type=float, default=60.0)
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--history-hours", type=float, default=168.0)
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="jobs at once (they share a pool, and a trace's drop preempts one of them)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep BATON_HOME (logs, database)")
    args = parser.parse_args()
    if not args.traces.is_dir():
        parser.error(f"--traces: no such folder: {args.traces}")
    if min(args.jobs, args.parallel) < 1 or args.work_minutes <= 0 or args.scale <= 0:
        parser.error("--jobs, --parallel, --work-minutes and --scale must be positive")

    portal = Portal(provisioning_delay_s=0.0, keep=args.keep)
    history, future = _split_traces(
        args.traces, args.history_hours, Path(tempfile.mkdtemp(dir=portal.home))
    )
    portal.env.update(
        BATON_MARKET_TIME_SCALE=str(args.scale),
        BATON_MARKET_TRACES=str(future),
        BATON_MARKET_SEED=str(args.seed),
    )
    began = time.monotonic()
    with portal:
        # History is the week before what the market replays, and nothing else.
        forget = "from costs.models import AvailabilitySample as A; A.objects.all().delete()"
        _manage(portal, "shell", "-c", forget)
        _manage(portal, "import_spot_traces", str(history))
        overhead_s = _warm_up(portal)
        jobs: list[dict[str, Any]] = []
        limit = 60 * (args.work_minutes * 6 + 5)
        while len(jobs) < args.jobs:
            batch = [
                _submit(portal, i, args.work_minutes)
                for i in range(len(jobs), min(args.jobs, len(jobs) + args.parallel))
            ]

            def all_done(batch: list[dict[str, Any]] = batch) -> bool:
                states = [portal.http("GET", f"/api/jobs/{j['id']}/")["state"] for j in batch]
                return all(state in TERMINAL for state in states)

            wait_for(all_done, limit, "the jobs to finish")
            jobs += batch
        rows = []
        for job in jobs:
            final = portal.http("GET", f"/api/jobs/{job['id']}/")
            estimate = job["estimate"] or {}
            market = _first_market(portal, job["id"])
            side = estimate.get("on_demand" if market == "on_demand" else "spot") or {}
            created = datetime.fromisoformat(job["created_at"])
            hours = (_finished_at(portal, job["id"]) - created).total_seconds() / 3600
            rows.append(
                {
                    "id": job["id"],
                    "tolerance": job["tolerance"],
                    "state": final["state"],
                    "market": market,
                    "source": estimate.get("interruption_rate_source"),
                    "cost": _settled_cost(portal, job["id"]),
                    "hours": hours,
                    "expected_cost": side.get("expected_cost"),
                    "expected_hours": side.get("expected_hours"),
                    "on_demand_cost": (estimate.get("on_demand") or {}).get("expected_cost"),
                    "interruptions": len(
                        _items(portal.http("GET", f"/api/jobs/{job['id']}/migrations/"))
                    ),
                    "expected_interruptions": side.get("expected_interruptions"),
                }
            )
    elapsed = time.monotonic() - began

    print(
        f"{args.jobs} jobs of {args.work_minutes:g} min of work (V100, mlp_numpy), market "
        f"simulator at {args.scale:g}x replaying {args.traces.name} after its first "
        f"{args.history_hours:g} h (the history); warm-up migration {overhead_s:.0f} s; "
        f"{elapsed:.0f} s in all"
    )
    print(
        f"{'job':>5} {'tolerance':<12}{'state':<10}{'market':<10}{'rate from':<10}"
        f"{'cost':>9}{'exp.':>9}{'hours':>8}{'exp.':>8}{'moves':>6}{'exp.':>6}"
    )
    usable = [r for r in rows if r["state"] == "succeeded" and r["expected_cost"] and r["cost"]]
    for r in rows:
        print(
            f"{r['id']:>5} {r['tolerance']:<12}{r['state']:<10}{r['market']:<10}"
            f"{r['source'] or '-':<10}{r['cost']:>9.4f}{r['expected_cost'] or 0:>9.4f}"
            f"{r['hours']:>8.4f}{r['expected_hours'] or 0:>8.4f}{r['interruptions']:>6}"
            f"{r['expected_interruptions'] or 0:>6.1f}"
        )
    if not usable:
        print("no job finished with an estimate: nothing to calibrate")
        return 1
    cost_ratio = [r["expected_cost"] / r["cost"] for r in usable]
    hours_ratio = [r["expected_hours"] / r["hours"] for r in usable]
    baseline = [r["on_demand_cost"] / r["cost"] for r in usable]
    print_table(
        "Estimate at submission against what each job realised",
        "expected / realised",
        [
            Row("always-on-demand estimate / realised cost", baseline, [1.0] * len(usable)),
            Row(
                "expected / realised cost",
                cost_ratio,
                [c / b for c, b in zip(cost_ratio, baseline, strict=True)],
            ),
            Row(
                "expected / realised time",
                hours_ratio,
                [h / b for h, b in zip(hours_ratio, baseline, strict=True)],
            ),
        ],
        "the always-on-demand estimate",
    )
    cost_dev = statistics.fmean(abs(x - 1) for x in cost_ratio)
    hours_dev = statistics.fmean(abs(x - 1) for x in hours_ratio)
    print(f"calibration: cost {cost_dev:.3f} time {hours_dev:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

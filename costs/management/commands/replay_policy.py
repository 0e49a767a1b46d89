"""`manage.py replay_policy`: replay a tolerance policy over a spot trace (DESIGN §9).

A thin edge: it parses and checks the arguments, calls ``costs.replay`` and prints. Any trace
in the shared format is taken, whatever its name, single- or multi-node (``--nodes``: a gang
has spot while that many of the trace's nodes can be had). The policy believes the interruption
rate measured on the whole trace file (the command has no separate history to learn it from).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from costs.policies import TOLERANCES
from costs.replay import (
    DEFAULT_ON_DEMAND_PRICE,
    DEFAULT_SPOT_PRICE,
    ReplayComparison,
    ReplayJob,
    compare,
    make_tolerance_policy,
)
from costs.traces import Trace, load_trace, preemptions_per_hour


class Command(BaseCommand):
    help = (
        "Replay a job over a spot availability trace under a tolerance policy, next to always "
        "on-demand, greedy (spot until the slack runs out) and the omniscient optimum. A restart "
        "overhead is charged at every start. Prices default to the shared V100 data: spot "
        f"{DEFAULT_SPOT_PRICE} USD/h (or the trace's prices), on-demand "
        f"{DEFAULT_ON_DEMAND_PRICE} USD/h."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--trace", required=True, type=Path, help="trace JSON file")
        parser.add_argument("--task-hours", required=True, type=float, help="hours of work")
        parser.add_argument(
            "--deadline-hours", required=True, type=float, help="deadline, hours from the start"
        )
        parser.add_argument(
            "--restart-overhead-hours",
            required=True,
            type=float,
            help="billed hours without progress at every start",
        )
        parser.add_argument(
            "--policy", required=True, metavar="|".join(TOLERANCES), help="tolerance to replay"
        )
        parser.add_argument("--spot-price", type=float, help="USD per hour (default: see help)")
        parser.add_argument("--on-demand-price", type=float, help="USD per hour")
        parser.add_argument(
            "--nodes", type=int, default=1, help="nodes of the job (a multi-node trace's gang)"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["policy"] not in TOLERANCES:
            raise CommandError(
                f"--policy must be one of {', '.join(TOLERANCES)}, not {options['policy']!r}"
            )
        trace = self._load(options["trace"])
        try:
            trace = trace.for_job(options["nodes"])
        except ValueError as exc:
            raise CommandError(f"--nodes: {exc}") from None
        checks = {
            "--task-hours": (options["task_hours"], "positive"),
            "--deadline-hours": (options["deadline_hours"], "positive"),
            "--restart-overhead-hours": (options["restart_overhead_hours"], "not negative"),
            "--spot-price": (options["spot_price"], "not negative"),
            "--on-demand-price": (options["on_demand_price"], "not negative"),
        }
        for name, (value, rule) in checks.items():
            if value is None:
                continue
            if value != value or value in (float("inf"), float("-inf")):
                raise CommandError(f"{name} must be a finite number, not {value}")
            if (rule == "positive" and value <= 0) or value < 0:
                raise CommandError(f"{name} must be {rule}, not {value:g}")

        spot_prices = None
        if options["spot_price"] is None and trace.prices is not None:
            spot_prices = trace.prices
        job = ReplayJob(
            task_hours=options["task_hours"],
            deadline_hours=options["deadline_hours"],
            restart_overhead_hours=options["restart_overhead_hours"],
            spot_price=(
                options["spot_price"]
                if options["spot_price"] is not None
                else trace.mean_price(DEFAULT_SPOT_PRICE) or DEFAULT_SPOT_PRICE
            ),
            on_demand_price=(
                options["on_demand_price"]
                if options["on_demand_price"] is not None
                else DEFAULT_ON_DEMAND_PRICE
            ),
        )
        rate = preemptions_per_hour(trace)
        policy = make_tolerance_policy(job, options["policy"], rate)
        result = compare(trace.unavailable, trace.gap_seconds, job, policy, spot_prices)
        if options["json"]:
            self.stdout.write(json.dumps(result.to_dict()))
        else:
            self.stdout.write(self._table(trace, job, options["policy"], rate, result))

    def _load(self, path: Path) -> Trace:
        if not path.is_file():
            raise CommandError(f"--trace: no such file: {path}")
        try:
            return load_trace(path)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--trace: cannot read {path}: {exc}") from None

    def _table(
        self, trace: Trace, job: ReplayJob, policy: str, rate: float, result: ReplayComparison
    ) -> str:
        lines = [
            f"Trace {trace.name}: {trace.hours:.1f} h in {trace.gap_seconds:g} s ticks, spot "
            f"available {trace.availability:.0%}, {rate:.2f} preemptions per hour held.",
            f"Job: {job.task_hours:g} h of work, deadline {job.deadline_hours:g} h, restart "
            f"{job.restart_overhead_hours:g} h; spot {job.spot_price:g} USD/h, on-demand "
            f"{job.on_demand_price:g} USD/h.",
            "",
            f"{'plan':<22}{'cost USD':>10}{'finish h':>10}{'deadline':>10}{'preempt.':>10}"
            f"{'spot h':>9}{'on-dem. h':>10}{'x optimum':>11}",
        ]
        optimum = result.optimal.cost
        rows = [
            (f"policy ({policy})", result.policy),
            ("always on-demand", result.on_demand),
            ("greedy", result.greedy),
            ("omniscient optimum", result.optimal),
        ]
        for label, outcome in rows:
            finish = "never" if outcome.finish_hours is None else f"{outcome.finish_hours:.2f}"
            ratio = f"{outcome.cost / optimum:.3f}" if optimum > 0 else "-"
            spot_h = "-" if outcome.spot_hours is None else f"{outcome.spot_hours:.1f}"
            od_h = "-" if outcome.on_demand_hours is None else f"{outcome.on_demand_hours:.1f}"
            lines.append(
                f"{label:<22}{outcome.cost:>10.2f}{finish:>10}"
                f"{'met' if outcome.deadline_met else 'MISSED':>10}{outcome.preemptions:>10}"
                f"{spot_h:>9}{od_h:>10}{ratio:>11}"
            )
        return "\n".join(lines)

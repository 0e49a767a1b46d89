"""`baton-agent rehearse [OPTIONS] -- COMMAND...`: try an interruption before a real one comes.

Runs COMMAND under the agent in directory mode with a built-in metadata endpoint (the same
answers as the portal's, `metadata_server.py`), delivers the notice at a chosen time, at a
random point, or while a file of the checkpoint folder is being written, lets the agent do what
it would on a spot instance (final signal, last sync, exit), then starts the command again
under a fresh agent in a fresh folder, as a new instance would, and prints a verdict: resumed
or not, from which step, the steps lost, the time from notice to exit and the bytes stored.
Exit status 0 only when the command resumed from the checkpoint.

The agent's other settings (progress pattern, resume arguments, final signal, ...) come from
the usual BATON_* environment; the options here override the most useful ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from migration.agent.config import ConfigError, load_config
from migration.agent.dirsync import snapshot
from migration.agent.metadata_server import MetadataServer
from migration.agent.runner import EXIT_CONFIG, EXIT_FINISHED, EXIT_PREEMPTED
from migration.checkpoint import StoreError, open_store

logger = logging.getLogger(__name__)

JOB = "rehearsal"
WATCH_EVERY = 0.02
EXIT_NOT_RESUMED = 1
_AGENT_EXITS = {0: "finished", 1: "failed", 2: "bad configuration", 3: "restore failed"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baton-agent rehearse",
        description="Run COMMAND under the agent, interrupt it as a spot instance would be, "
        "start it again from what the agent saved, and say whether it resumed.",
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--at", type=float, metavar="S", help="deliver the notice S seconds after the start"
    )
    when.add_argument(
        "--random",
        nargs=2,
        type=float,
        metavar=("MIN", "MAX"),
        help="deliver it at a random time between MIN and MAX seconds (default 5 30)",
    )
    when.add_argument(
        "--during-write",
        action="store_true",
        help="deliver it while a file of the checkpoint folder is being written",
    )
    parser.add_argument("--seed", type=int, default=None, help="seed of --random")
    parser.add_argument(
        "--window",
        type=float,
        default=30.0,
        help="seconds from the final notice to the instance's end (EC2: 120; default 30)",
    )
    parser.add_argument(
        "--advance", type=float, default=0.0, help="an advance notice S seconds before it"
    )
    parser.add_argument(
        "--resume-for",
        type=float,
        default=20.0,
        help="how long to watch the resumed command before judging it (default 20 s)",
    )
    parser.add_argument(
        "--give-up", type=float, default=600.0, help="longest wait for the moment to interrupt"
    )
    parser.add_argument(
        "--progress-pattern",
        help="regex whose first group is the step (BATON_AGENT_PROGRESS_PATTERN)",
    )
    parser.add_argument(
        "--resume-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="an argument added when resuming (repeat; BATON_AGENT_RESUME_ARGS)",
    )
    parser.add_argument("--workdir", type=Path, help="where runs and the store go (default: new)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after `--`")
    return parser


@dataclass
class Run:
    """One agent run of the rehearsal."""

    name: str
    folder: Path
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    ended: float | None = None

    @property
    def output_path(self) -> Path:
        return self.folder / "agent" / "logs" / "rank-0.log"

    @property
    def checkpoint_dir(self) -> Path:
        return self.folder / "checkpoint"

    def output(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def poll(self) -> int | None:
        if self.exit_code is None and self.process.poll() is not None:
            self.exit_code = self.process.returncode
            self.ended = time.monotonic()
        return self.exit_code

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def stop(self) -> None:
        """Stop as a container stop would: SIGTERM (a final notice with the grace period),
        a second one at once if it lingers."""
        if self.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            if self.wait(60) is None:
                self.process.send_signal(signal.SIGTERM)
                self.wait()


class Rehearsal:
    """Everything one rehearsal does; `run()` returns the exit status."""

    def __init__(self, args: argparse.Namespace, command: list[str]) -> None:
        self.args = args
        self.command = command
        self.workdir = (
            args.workdir or Path(tempfile.mkdtemp(prefix="baton-rehearsal-"))
        ).absolute()
        self.store_url = os.environ.get("BATON_STORE_URL", "").strip() or (
            (self.workdir / "store").as_uri()
        )
        self.endpoint = MetadataServer()
        self.pattern: re.Pattern[str] | None = None
        self.verdict: dict[str, object] = {}
        self.runs: list[Run] = []

    # -- set-up ------------------------------------------------------------------------------

    def environment(self, folder: Path) -> dict[str, str]:
        """The agent's environment: the caller's, standalone, this run's folders."""
        env = {k: v for k, v in os.environ.items() if k not in ("BATON_PORTAL_URL", "BATON_RESUME")}
        env.update(
            {
                "BATON_JOB_ID": JOB,
                "BATON_AGENT_MODE": "directory",
                "BATON_STORE_URL": self.store_url,
                "BATON_METADATA_URL": self.endpoint.url,
                "BATON_AGENT_DIR": str(folder / "agent"),
                "BATON_CHECKPOINT_DIR": str(folder / "checkpoint"),
                "BATON_AGENT_POLL_INTERVAL": env.get("BATON_AGENT_POLL_INTERVAL", "0.2"),
            }
        )
        env.pop("BATON_AGENT_TOKEN", None)
        if self.args.progress_pattern:
            env["BATON_AGENT_PROGRESS_PATTERN"] = self.args.progress_pattern
        if self.args.resume_arg:
            env["BATON_AGENT_RESUME_ARGS"] = json.dumps(self.args.resume_arg)
        return env

    def check(self) -> None:
        """The agent's own configuration check, so a mistake is named before anything runs."""
        config = load_config(self.environment(self.workdir / "check"), argv=self.command)
        self.pattern = config.progress_pattern

    def start(self, name: str) -> Run:
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=False)
        log = (folder / "agent.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "migration.agent", "--", *self.command],
            env=self.environment(folder),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # a Ctrl-C of the rehearsal is not a notice to the agent
        )
        log.close()
        logger.info("%s: agent started (pid %d) in %s", name, process.pid, folder)
        self.runs.append(Run(name, folder, process))
        return self.runs[-1]

    def steps(self, run: Run) -> list[int]:
        """The steps the run's output showed, in order."""
        assert self.pattern is not None
        found = []
        for line in run.output().splitlines():
            match = self.pattern.search(line)
            if match:
                try:
                    found.append(int(match.group(1)))
                except (ValueError, IndexError):
                    continue
        return found

    # -- the interruption --------------------------------------------------------------------

    def wait_for_the_moment(self, run: Run) -> bool:
        """Wait until the notice is due; False when the command ended first."""
        args = self.args
        deadline = time.monotonic() + args.give_up
        if args.during_write:
            # A write cut before any checkpoint exists leaves nothing to resume from by
            # definition; the question is whether the previous version survives the cut.
            logger.info("waiting for a first checkpoint, then for the next write")
            while self.latest() is None:
                if time.monotonic() > deadline or run.poll() is not None:
                    return False
                time.sleep(0.2)
            previous = snapshot(run.checkpoint_dir)
            while time.monotonic() < deadline and run.poll() is None:
                time.sleep(WATCH_EVERY)
                current = snapshot(run.checkpoint_dir)
                written = [
                    rel for rel, st in current.items() if st[0] >= 0 and previous.get(rel) != st
                ]
                if written:
                    logger.info("%s is being written", ", ".join(sorted(written)))
                    return True
                previous = current
            return False
        if args.at is not None:
            delay = args.at
        else:
            low, high = args.random or (5.0, 30.0)
            delay = random.Random(args.seed).uniform(low, high)
        logger.info("the notice comes %.1f s after the start", delay)
        while time.monotonic() < min(run.started + delay, deadline):
            if run.poll() is not None:
                return False
            time.sleep(WATCH_EVERY)
        return run.poll() is None

    def interrupt(self, run: Run) -> float:
        """Post the notices; return when the final one was posted (monotonic)."""
        args = self.args
        now = datetime.now(UTC)
        if args.advance > 0:
            self.endpoint.notify(now, now + timedelta(days=1), now + timedelta(days=1))
            logger.info("advance notice posted; the final one in %.1f s", args.advance)
            time.sleep(args.advance)
            now = datetime.now(UTC)
        self.endpoint.notify(
            now - timedelta(seconds=args.advance) if args.advance > 0 else None,
            now,
            now + timedelta(seconds=args.window),
        )
        logger.info("final notice posted: the instance goes in %.0f s", args.window)
        return time.monotonic()

    # -- the verdict -------------------------------------------------------------------------

    def latest(self) -> int | None:
        """The step of the checkpoint a restart would get now, or None."""
        with open_store(self.store_url) as store:
            latest = store.latest_complete(JOB, 1)
        return None if latest is None else latest.step

    def stored(self) -> tuple[int, int | None, str]:
        """Bytes the syncs stored, and the step and kind of the checkpoint a restart gets."""
        with open_store(self.store_url) as store:
            refs = store.list(JOB)
            stored = sum(store.load_manifest(ref).bytes_new for ref in refs)
            latest = store.latest_complete(JOB, 1)
        if latest is None:
            return stored, None, ""
        return stored, latest.step, latest.kind

    def run(self) -> int:
        self.endpoint.start()
        first = self.start("run-1-interrupted")
        try:
            if not self.wait_for_the_moment(first):
                first.wait()
                reason = (
                    "no file of the checkpoint folder was written"
                    if self.args.during_write
                    else "the command ended before the notice"
                )
                return self.fail(first, f"{reason} (agent exit {first.exit_code})")
            notice_at = self.interrupt(first)
            steps_before = self.steps(first)
            first.wait()
            assert first.exit_code is not None and first.ended is not None
            seconds_to_exit = first.ended - notice_at
            last_step = max(self.steps(first) or [0])
            stored, step, kind = self.stored()
            when = f"{notice_at - first.started:.1f} s after the start"
            if self.args.during_write:
                when += ", while a checkpoint file was written"
            self.verdict.update(
                {
                    "notice": when,
                    "step at the notice": steps_before[-1] if steps_before else None,
                    "last step before the exit": last_step,
                    "notice -> exit": f"{seconds_to_exit:.2f} s (window {self.args.window:g} s)",
                    "first run's agent exit": _describe(first.exit_code),
                    "checkpoint kept": f"step {step} ({kind})" if step is not None else "none",
                    "bytes stored": stored,
                }
            )
            if first.exit_code != EXIT_PREEMPTED:
                return self.fail(first, "the first run was not preempted")
            if step is None:
                return self.fail(first, "nothing was saved before the instance went")
            return self.resume(step, last_step)
        finally:
            for run in self.runs:
                run.stop()
            self.endpoint.stop()

    def resume(self, step: int, last_step: int) -> int:
        self.endpoint.clear()  # the new instance has had no notice
        second = self.start("run-2-resumed")
        deadline = time.monotonic() + self.args.resume_for
        while time.monotonic() < deadline and second.poll() is None:
            time.sleep(0.1)
        code = second.poll()
        output = second.output()
        seen = self.steps(second)
        self.verdict.update(
            {
                "resumed from step": step,
                "steps lost (at most)": max(last_step - step, 0),
                "second run": f"still running after {self.args.resume_for:g} s"
                if code is None
                else f"agent exit {_describe(code)}",
                "first step it showed": seen[0] if seen else None,
            }
        )
        if code not in (None, EXIT_FINISHED, EXIT_PREEMPTED):
            return self.fail(second, "the resumed command failed")
        if "restored" not in (second.folder / "agent.log").read_text(errors="replace"):
            return self.fail(second, "the agent restored nothing")
        if seen and step > 1 and seen[0] <= 1:
            return self.fail(
                second,
                "the command started again from the beginning: it did not read the restored "
                "checkpoint (does it need resume arguments? --resume-arg)",
            )
        if code is None and not output.strip():
            return self.fail(second, "the resumed command printed nothing")
        self.report("resumed")
        return 0

    def fail(self, run: Run, why: str) -> int:
        self.verdict["why"] = why
        self.report("NOT resumed")
        tail = run.output().splitlines()[-15:]
        if tail:
            print(f"\nlast lines of {run.name}'s command:", *tail, sep="\n  ")
        print(f"agent log: {run.folder / 'agent.log'}")
        return EXIT_NOT_RESUMED

    def report(self, outcome: str) -> None:
        print(f"\nrehearsal: {outcome}")
        for key, value in self.verdict.items():
            print(f"  {key + ':':<28} {value if value is not None else '-'}")
        print(f"  {'runs and store:':<28} {self.workdir}")


def _describe(code: int) -> str:
    if code == EXIT_PREEMPTED:
        return f"{code} (preempted)"
    return f"{code} ({_AGENT_EXITS.get(code, 'unknown')})"


def main(argv: Sequence[str]) -> int:
    """Entry point of `baton-agent rehearse`; returns the exit status."""
    args = _parser().parse_args(list(argv))
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("rehearse: give the command to run after `--`", file=sys.stderr)
        return EXIT_CONFIG
    if args.window <= 0 or args.advance < 0 or args.resume_for <= 0:
        print("rehearse: --window and --resume-for must be > 0, --advance >= 0", file=sys.stderr)
        return EXIT_CONFIG
    rehearsal = Rehearsal(args, command)
    try:
        rehearsal.check()
    except ConfigError as exc:
        print(f"rehearse: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        return rehearsal.run()
    except StoreError as exc:
        print(f"rehearse: the store {rehearsal.store_url} failed: {exc}", file=sys.stderr)
        return EXIT_NOT_RESUMED

"""Directory mode: restore before start, background sync, last sync, and exact determinism.

The workload is `jobs.workloads.dir_mode_example`, a plain script that only knows
`--resume-from-checkpoint DIR`; the store is a real file store; notices and signals are real.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from jobs.workloads.catalog import TEMPLATES
from migration.agent.runner import EXIT_FINISHED, EXIT_PREEMPTED, EXIT_RESTORE_FAILED
from migration.checkpoint import open_store
from tests.migration.agent.conftest import AgentRun, FakeMetadata, FakePortal, wait_until

StartAgent = Callable[..., AgentRun]
JOB = "42"
FINAL = re.compile(r"^final step=(\d+) val_loss=(\S+) weights_sha256=([0-9a-f]{64})$", re.M)


def example(steps: int, seed: int = 7, step_ms: float = 5, *extra: str) -> list[str]:
    """The directory-mode command as a job would give it, `{checkpoint_dir}` and all."""
    return [
        sys.executable, "-m", "jobs.workloads.dir_mode_example",
        "--steps", str(steps), "--seed", str(seed), "--step-ms", str(step_ms),
        "--checkpoint-dir", "{checkpoint_dir}",
        "--resume-from-checkpoint", "{checkpoint_dir}",
        "--checkpoint-every", "25",
        *extra,
    ]  # fmt: skip


def uninterrupted_sha(tmp_path: Path, steps: int, seed: int = 7, state_mb: float = 0) -> str:
    folder = tmp_path / "uninterrupted"
    finished = subprocess.run(
        [
            sys.executable, "-m", "jobs.workloads.dir_mode_example",
            "--steps", str(steps), "--seed", str(seed), "--state-mb", str(state_mb),
            "--checkpoint-dir", str(folder),
        ],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    match = FINAL.search(finished.stdout)
    assert match, finished.stdout
    return match.group(3)


def final_sha(output: str) -> str:
    match = FINAL.search(output)
    assert match, output
    return match.group(3)


def directory_env(store_url: str, **more: str) -> dict[str, str]:
    return {
        "BATON_AGENT_MODE": "directory",
        "BATON_STORE_URL": store_url,
        "BATON_AGENT_STEP_FILE": "state.json",
        **more,
    }


def last_step_printed(run: AgentRun) -> int:
    steps = re.findall(r"^step=(\d+)", run.output(), re.M)
    return int(steps[-1]) if steps else -1


def test_a_finished_run_is_synced_and_a_new_instance_resumes_from_the_store(
    start_agent: StartAgent, portal: FakePortal, store_url: str, tmp_path: Path
) -> None:
    first = start_agent(example(150, 7, 10, "--state-mb", "2"), **directory_env(store_url))
    assert first.wait() == EXIT_FINISHED, first.stderr()
    checkpoints = portal.of_type("checkpoint")
    kinds = [c["kind"] for c in checkpoints]
    assert kinds[-1] == "final" and "periodic" in kinds
    assert checkpoints[-1]["step"] == 150
    steps = [c["step"] for c in checkpoints]
    assert steps == sorted(steps)
    # Incremental: the 2 MiB of padding never changes, so the last sync sends only what did.
    assert checkpoints[-1]["bytes_new"] < checkpoints[-1]["bytes_total"] / 4
    store = open_store(store_url)
    latest = store.latest(JOB)
    assert latest is not None and latest.key == checkpoints[-1]["manifest"]
    sha = final_sha(first.output())
    assert sha == uninterrupted_sha(tmp_path, 150, state_mb=2)

    second = start_agent(example(150, 7, 10, "--state-mb", "2"), **directory_env(store_url))
    assert second.wait() == EXIT_FINISHED
    assert "resumed from step 150" in second.output()
    assert final_sha(second.output()) == sha
    restore = portal.of_type("restore")[-1]
    assert (restore["ok"], restore["manifest"], restore["step"]) == (True, latest.key, 150)


def saved_step(store_url: str, manifest: str, folder: Path) -> int | None:
    """The step in the example's own checkpoint inside a stored directory checkpoint."""
    open_store(store_url).restore_directory(manifest, folder)
    if not (folder / "state.npz").exists():
        return None
    with np.load(folder / "state.npz") as saved:
        return int(saved["step"])


def test_it_restores_the_checkpoint_named_by_baton_resume(
    start_agent: StartAgent, portal: FakePortal, store_url: str, tmp_path: Path
) -> None:
    env = directory_env(store_url, BATON_AGENT_SYNC_INTERVAL="0")
    # Saves 0.6 s apart: a periodic sync records a file once it has settled between them.
    first = start_agent(example(100, 7, 25), **env)
    assert first.wait() == EXIT_FINISHED
    # A sync may catch the script between two of its files; the files decide where it resumes.
    candidates = [
        (c["manifest"], saved_step(store_url, c["manifest"], tmp_path / f"look-{n}"))
        for n, c in enumerate(portal.of_type("checkpoint"))
        if c["kind"] == "periodic"
    ]
    manifest, step = next((m, s) for m, s in candidates if s is not None and s < 100)
    run = start_agent(example(100, 7, 25), **directory_env(store_url, BATON_RESUME=manifest))
    assert run.wait() == EXIT_FINISHED
    assert f"resumed from step {step}" in run.output()
    assert portal.of_type("restore")[-1]["manifest"] == manifest


def test_a_checkpoint_that_cannot_be_restored_stops_the_agent_before_the_workload(
    start_agent: StartAgent, portal: FakePortal, store_url: str
) -> None:
    missing = f"jobs/{JOB}/manifests/000000000100-periodic-r0.json"
    run = start_agent(example(100), **directory_env(store_url, BATON_RESUME=missing))
    assert run.wait() == EXIT_RESTORE_FAILED
    assert portal.of_type("restore") == []
    failure = portal.of_type("restore_failed")[0]
    assert failure["manifest"] == missing and "cannot restore" in failure["error"]
    exit_event = portal.of_type("exit")[0]
    assert exit_event["reason"] == "failed" and exit_event["exit_code"] == EXIT_RESTORE_FAILED
    assert "restore failed" in exit_event["error"]
    assert run.output() == ""
    assert open_store(store_url).list(JOB) == []


def test_without_a_step_file_the_step_comes_from_the_output(
    start_agent: StartAgent, portal: FakePortal, store_url: str
) -> None:
    run = start_agent(
        example(120, 7, 10),
        BATON_AGENT_MODE="directory",
        BATON_STORE_URL=store_url,
    )
    assert run.wait() == EXIT_FINISHED
    checkpoints = portal.of_type("checkpoint")
    assert checkpoints[-1]["step"] == 120
    assert all(int(c["step"]) > 0 for c in checkpoints)
    progress = portal.of_type("progress")
    assert progress and progress[-1]["step"] == 120


def test_runs_stopped_at_random_points_and_resumed_end_with_the_uninterrupted_weights(
    start_agent: StartAgent,
    metadata: FakeMetadata,
    portal: FakePortal,
    store_url: str,
    tmp_path: Path,
) -> None:
    # Far more steps than eight stops use up, so a slow machine that overshoots a stop point
    # never finishes early; the last leg runs unpaced (the pace does not change the weights).
    steps = 3000
    expected = uninterrupted_sha(tmp_path, steps)
    rng = random.Random(20240611)
    interruptions: list[tuple[str, int, int]] = []  # (how, resumed at, stopped at)
    resumed_at = 0
    while True:
        metadata.final = None
        last_leg = len(interruptions) == 8
        run = start_agent(example(steps, 7, 0 if last_leg else 5), **directory_env(store_url))
        if not last_leg:
            target = resumed_at + rng.randint(10, 70)

            def reached(run: AgentRun = run, target: int = target) -> bool:
                return last_step_printed(run) >= target or run.process.poll() is not None

            wait_until(reached, message=f"step {target}")
            how = rng.choice(["imds", "sigterm"])
            if how == "imds":
                metadata.notice_final(in_seconds=rng.uniform(1, 4))
            else:
                run.signal(signal.SIGTERM)
            assert run.wait() == EXIT_PREEMPTED, run.stderr()
            stopped = re.search(r"^stopped step=(\d+)$", run.output(), re.M)
            assert stopped, run.output()
            interruptions.append((how, resumed_at, int(stopped.group(1))))
            resumed_at = int(stopped.group(1))
            continue
        assert run.wait() == EXIT_FINISHED, run.stderr()
        break
    output = run.output()
    assert f"resumed from step {resumed_at}" in output
    match = FINAL.search(output)
    assert match and int(match.group(1)) == steps
    assert match.group(3) == expected, interruptions
    assert len(interruptions) == 8
    assert {how for how, _, _ in interruptions} == {"imds", "sigterm"}
    # Each emergency checkpoint was synced after the workload stopped: nothing was lost.
    emergency = [c for c in portal.of_type("checkpoint") if c["kind"] == "emergency"]
    assert [c["step"] for c in emergency] == [stopped for _, _, stopped in interruptions]
    assert [n["source"] for n in portal.of_type("notice")] == [h for h, _, _ in interruptions]


def test_the_catalogue_command_resumes_through_the_environment_alone(
    start_agent: StartAgent, portal: FakePortal, store_url: str
) -> None:
    command = TEMPLATES["dir_mode_example"].argv(60, {"step_ms": 5, "seed": 7})
    assert "{checkpoint_dir}" not in command
    first = start_agent(command, **directory_env(store_url))
    assert first.wait() == EXIT_FINISHED
    second = start_agent(command, **directory_env(store_url))
    assert second.wait() == EXIT_FINISHED
    assert "resumed from step 60" in second.output()
    assert final_sha(second.output()) == final_sha(first.output())

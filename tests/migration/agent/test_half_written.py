"""A script that saves its checkpoint in place, interrupted at random points, always resumes.

Each interruption is a new instance: a fresh agent and checkpoint folder against the same store,
so what the next run finds is only what the agent synced. Half the runs have no SIGTERM
handler (the signal kills the script, often in the middle of a save); the other half save
once more on SIGTERM, slowly, and the window ends in the middle of that save. The script
crashes on a damaged checkpoint, so one half-written file restored would fail a run.
"""

from __future__ import annotations

import hashlib
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from migration.agent.runner import EXIT_FINISHED, EXIT_PREEMPTED
from migration.checkpoint import open_store
from tests.migration.agent import inplace_workload
from tests.migration.agent.conftest import FakeMetadata, agent_environment, wait_until

INTERRUPTIONS = 50
SCRIPT = Path(inplace_workload.__file__)
RESUMED = re.compile(r"^resumed from step (\d+) \(BATON_RESUMED=1\)$", re.M)


def command(steps: int, on_sigterm: str, pause_ms: float) -> list[str]:
    return [
        sys.executable, str(SCRIPT), "--steps", str(steps),
        "--checkpoint", "{checkpoint_dir}/ckpt.bin", "--every", "120", "--size-mb", "4",
        "--step-ms", "5", "--write-pause-ms", str(pause_ms), "--on-sigterm", on_sigterm,
    ]  # fmt: skip


def run_agent(
    tmp_path: Path, metadata: FakeMetadata, store_url: str, name: str, argv: list[str]
) -> tuple[subprocess.Popen[bytes], Path]:
    folder = tmp_path / name
    env = agent_environment(
        tmp_path,
        metadata,
        None,
        BATON_JOB_ID="inplace",
        BATON_AGENT_MODE="directory",
        BATON_STORE_URL=store_url,
        BATON_AGENT_DIR=str(folder),
        BATON_CHECKPOINT_DIR=str(folder / "checkpoint"),
        BATON_AGENT_PROGRESS_PATTERN=r"^iter (\d+)$",
        BATON_AGENT_SYNC_INTERVAL="0.2",
        BATON_AGENT_GRACE_PERIOD="1",
        BATON_AGENT_SAFETY_MARGIN="0",
        BATON_AGENT_LOG_LEVEL="INFO",
    )
    folder.mkdir()
    with (tmp_path / f"{name}.stderr").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "migration.agent", "--", *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return process, folder / "logs" / "rank-0.log"


def read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def cut_mid_save(output: str) -> bool:
    """True when the run's last save began and never ended."""
    saves = re.findall(r"^(saving|saved) step \d+$", output, re.M)
    return bool(saves) and saves[-1] == "saving"


def expected_sha(steps: int) -> str:
    weights, _ = inplace_workload.initial(4)
    for step in range(steps):
        weights = inplace_workload.train_step(weights, step)
    return hashlib.sha256(np.ascontiguousarray(weights).tobytes()).hexdigest()


def test_a_script_saving_in_place_resumes_after_every_random_interruption(
    tmp_path: Path, metadata: FakeMetadata, store_url: str
) -> None:
    rng = random.Random(20261204)
    resumed_from: list[int] = []
    cut = 0
    for number in range(INTERRUPTIONS):
        handles = number % 2 == 1
        argv = command(100_000, "save" if handles else "die", 25 if handles else 2)
        process, log = run_agent(tmp_path, metadata, store_url, f"run-{number}", argv)
        wait_until(
            lambda log=log: re.search(r"^(resumed|starting)", read(log), re.M),  # type: ignore[misc]
            message=f"run {number} to start",
        )
        # The agent syncs a file once two looks 0.25 s apart saw it unchanged with no writer:
        # saves 0.6 s apart leave room for that, and runs long enough to reach it are common.
        time.sleep(rng.uniform(0.2, 2.0))
        process.send_signal(signal.SIGTERM)
        status = process.wait(60)
        output = read(log)
        assert "damaged" not in output, f"run {number} read a half-written checkpoint:\n{output}"
        assert status == EXIT_PREEMPTED, (status, output, read(tmp_path / f"run-{number}.stderr"))
        match = RESUMED.search(output)
        # No checkpoint yet (every save so far was cut): a start from scratch, step 0.
        assert match or "starting from scratch" in output, output
        resumed_from.append(int(match.group(1)) if match else 0)
        cut += cut_mid_save(output)

    # Nothing restored ever went backwards, training moved on, and the interruptions did land
    # in the middle of saves (the test would prove nothing otherwise).
    assert resumed_from == sorted(resumed_from)
    assert resumed_from[-1] > 0, f"no run resumed from a checkpoint: {resumed_from}"
    assert cut >= INTERRUPTIONS // 5, f"only {cut} interruptions cut a save"

    with open_store(store_url) as store:
        latest = store.latest("inplace")
        assert latest is not None
        steps = latest.step + 40
    process, log = run_agent(tmp_path, metadata, store_url, "last", command(steps, "die", 0))
    assert process.wait(120) == EXIT_FINISHED, read(log)
    assert f"weights_sha256={expected_sha(steps)}" in read(log)

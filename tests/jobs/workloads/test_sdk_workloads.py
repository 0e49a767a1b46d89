"""The SDK workloads as real processes: interrupted by real signals at seeded random points
(also inside an asynchronous persist and inside an emergency save), resumed, possibly several
times, they must end with the same weights as an uninterrupted run with the same seed."""

from __future__ import annotations

import functools
import importlib.util
import os
import random
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest

from jobs.workloads.catalog import TEMPLATES
from migration.checkpoint import LocalStore, ManifestRef
from tests.migration.checkpoint.procs import REPO, Proc, python

FINAL_RE = re.compile(r"^final step=(\d+) val_loss=(\S+) weights_sha256=([0-9a-f]{64})$")
STOPPED_RE = re.compile(r"^stopped step=(\d+)$")
HAS_TORCH = importlib.util.find_spec("torch") is not None

MLP = (
    "mlp_numpy",
    ("--steps", "300", "--step-ms", "8", "--state-mb", "4", "--hidden", "32"),
)
BIG_MLP = (
    "mlp_numpy",
    ("--steps", "120", "--seed", "4", "--step-ms", "10", "--state-mb", "48", "--hidden", "32"),
)
LORA = (
    "lora_sim",
    ("--steps", "200", "--seed", "3", "--step-ms", "10", "--base-mb", "16"),
)
BIG_LORA = (
    "lora_sim",
    ("--steps", "80", "--seed", "5", "--step-ms", "10", "--base-mb", "16", "--state-mb", "48"),
)
TORCH = (
    "mlp_torch",
    ("--steps", "200", "--seed", "2", "--step-ms", "10", "--state-mb", "4", "--hidden", "32"),
)


def workload_env(checkpoints: Path, **extra: str) -> dict[str, str]:
    """The environment the agent would give; nothing inherited that could redirect the store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env.update(
        PYTHONPATH=str(REPO),
        BATON_JOB_ID="wl",
        BATON_CHECKPOINT_DIR=str(checkpoints),
        BATON_CHECKPOINT_EVERY_STEPS="10",
        BATON_CHECKPOINT_EVERY_SECONDS="0",
        BATON_LOG_LEVEL="INFO",
    )
    env.update(extra)
    return env


def stopped_at(proc: Proc) -> int:
    """The step a run stopped at after SIGTERM (its last line says so)."""
    stopped = STOPPED_RE.match(proc.stdout[-1])
    assert stopped, proc.describe()
    return int(stopped.group(1))


def final_line(proc: Proc) -> re.Match[str]:
    """The parsed last line of a run that finished."""
    final = FINAL_RE.match(proc.stdout[-1])
    assert final, proc.describe()
    return final


def latest(store: LocalStore) -> ManifestRef:
    """The workloads' latest checkpoint, which must exist."""
    ref = store.latest("wl")
    assert ref is not None
    return ref


def start(workload: str, args: tuple[str, ...], env: dict[str, str]) -> Proc:
    return Proc(python("-m", f"jobs.workloads.{workload}", *args), env)


def run_to_end(workload: str, args: tuple[str, ...], env: dict[str, str]) -> re.Match[str]:
    """Run until the workload finishes; its last stdout line, parsed."""
    proc = start(workload, args, env)
    assert proc.finish() == 0, proc.describe()
    final = FINAL_RE.match(proc.stdout[-1])
    assert final, proc.describe()
    return final


@functools.cache
def reference(workload: str, args: tuple[str, ...]) -> str:
    """weights_sha256 of an uninterrupted run (computed once per configuration)."""
    with tempfile.TemporaryDirectory() as folder:
        return run_to_end(workload, args, workload_env(Path(folder))).group(3)


def assert_resumed_cleanly(proc: Proc) -> None:
    """A resumed run says so, and its validation loss matches the checkpoint's reference."""
    resumed = [line for line in proc.stdout if line.startswith("resumed")]
    assert all("reference_matches=True" in line for line in resumed), proc.describe()


def interrupt_at_random_points(
    workload: str, args: tuple[str, ...], checkpoints: Path, seed: int, count: int
) -> list[int]:
    """SIGTERM `count` runs at seeded random moments, then finish; the steps they stopped at.

    Runs are long enough (steps x --step-ms, a minimum per step) that even the sum of the
    largest delays cannot reach the end: every signal lands inside training."""
    rng = random.Random(seed)
    env = workload_env(checkpoints)
    stops: list[int] = []
    for _ in range(count):
        proc = start(workload, args, env)
        proc.wait_for(r"^(started|resumed) step=")
        time.sleep(rng.uniform(0.05, 0.5))
        proc.signal(signal.SIGTERM)
        assert proc.finish() == 0, proc.describe()
        stopped = STOPPED_RE.match(proc.stdout[-1])
        assert stopped, proc.describe()
        assert "emergency save committed" in "\n".join(proc.stderr), proc.describe()
        assert_resumed_cleanly(proc)
        stops.append(int(stopped.group(1)))
    return stops


def finish_and_compare(workload: str, args: tuple[str, ...], checkpoints: Path) -> None:
    final = run_to_end(workload, args, workload_env(checkpoints))
    assert final.group(1) == args[args.index("--steps") + 1]
    assert final.group(3) == reference(workload, args)


@pytest.mark.parametrize("seed", [11, 12])
def test_mlp_numpy_stopped_at_random_points_ends_with_the_uninterrupted_weights(
    seed: int, tmp_path: Path
) -> None:
    args = (*MLP[1], "--seed", str(seed))
    stops = interrupt_at_random_points(MLP[0], args, tmp_path, seed, count=3)
    assert stops == sorted(stops) and stops[-1] < 300
    finish_and_compare(MLP[0], args, tmp_path)


def test_lora_sim_stopped_at_random_points_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    interrupt_at_random_points(*LORA, tmp_path, seed=21, count=3)
    finish_and_compare(*LORA, tmp_path)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_mlp_torch_stopped_at_random_points_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    interrupt_at_random_points(*TORCH, tmp_path, seed=31, count=2)
    finish_and_compare(*TORCH, tmp_path)


@pytest.mark.parametrize("config", [BIG_MLP, BIG_LORA], ids=["mlp_numpy", "lora_sim"])
def test_sigterm_during_an_async_persist_still_ends_with_an_emergency_checkpoint(
    config: tuple[str, tuple[str, ...]], tmp_path: Path
) -> None:
    workload, args = config
    proc = start(workload, args, workload_env(tmp_path))
    persist = int(proc.wait_for(r"persist started step=(\d+)", "err").group(1))
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 0, proc.describe()
    log = "\n".join(proc.stderr)
    assert f"persist of step={persist} cancelled" in log, proc.describe()
    stopped = stopped_at(proc)
    assert f"emergency save committed step={stopped}" in log
    store = LocalStore(tmp_path)
    ref = latest(store)
    assert (ref.step, ref.kind) == (stopped, "emergency")
    store.verify(ref)
    finish_and_compare(workload, args, tmp_path)


def test_a_second_sigterm_during_the_emergency_save_does_not_stop_it(tmp_path: Path) -> None:
    workload, args = BIG_MLP
    proc = start(workload, args, workload_env(tmp_path))
    proc.wait_for(r"started step=0")
    time.sleep(0.3)
    proc.signal(signal.SIGTERM)
    proc.wait_for(r"emergency save started", "err")
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 0, proc.describe()
    stopped = stopped_at(proc)
    assert latest(LocalStore(tmp_path)).step == stopped
    finish_and_compare(workload, args, tmp_path)


def test_sigkill_during_the_emergency_save_resumes_from_the_last_periodic(tmp_path: Path) -> None:
    workload, args = BIG_MLP
    proc = start(workload, args, workload_env(tmp_path))
    proc.wait_for(r"kind=periodic", "err")
    proc.signal(signal.SIGTERM)
    proc.wait_for(r"emergency save started", "err")
    proc.kill()  # the notice window ran out mid-save
    assert proc.finish() == -signal.SIGKILL
    store = LocalStore(tmp_path)
    store.verify(latest(store))
    finish_and_compare(workload, args, tmp_path)


def test_an_advance_notice_checkpoints_without_stopping(tmp_path: Path) -> None:
    workload, args = (MLP[0], (*MLP[1], "--seed", "13"))
    env = workload_env(tmp_path, BATON_CHECKPOINT_EVERY_STEPS="1000")
    proc = start(workload, args, env)
    proc.wait_for(r"started step=0")
    time.sleep(0.2)
    proc.signal(signal.SIGUSR1)
    step = int(proc.wait_for(r"committed \S+ step=(\d+) kind=periodic", "err").group(1))
    assert proc.process.poll() is None  # still training
    proc.signal(signal.SIGTERM)
    assert proc.finish() == 0, proc.describe()
    assert stopped_at(proc) >= step
    finish_and_compare(workload, args, tmp_path)


def test_a_run_resumes_from_the_manifest_named_in_baton_resume(tmp_path: Path) -> None:
    workload, args = (MLP[0], (*MLP[1], "--seed", "14"))
    run_to_end(workload, args, workload_env(tmp_path))
    key = "jobs/wl/manifests/000000000050-periodic-r0.json"
    proc = start(workload, args, workload_env(tmp_path, BATON_RESUME=key))
    assert proc.finish() == 0, proc.describe()
    assert proc.stdout[0].startswith("resumed step=50 ")
    assert final_line(proc).group(3) == reference(workload, args)


def test_a_workload_runs_with_the_flags_the_catalogue_generates(tmp_path: Path) -> None:
    argv = TEMPLATES["lora_sim"].argv(20, {"base_mb": 4.0, "step_ms": 1.0})
    assert argv[1:3] == ["-m", "jobs.workloads.lora_sim"]
    proc = Proc(argv, workload_env(tmp_path))
    assert proc.finish() == 0, proc.describe()
    assert FINAL_RE.match(proc.stdout[-1]), proc.describe()
    store = LocalStore(tmp_path)
    manifest = store.load_manifest(latest(store))
    assert manifest.kind == "final" and manifest.step == 20

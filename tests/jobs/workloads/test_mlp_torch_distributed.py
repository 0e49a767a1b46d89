"""mlp_torch as a gang of two real processes (torch.distributed, gloo on localhost): the ranks
hold the same weights, save at the same steps, stop together when one of them gets the final
notice, and the gang resumes from those checkpoints to the uninterrupted run's weights."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from jobs.workloads.distributed import join_gang
from jobs.workloads.training import GangError
from migration.checkpoint import LocalStore, ManifestRef
from tests.migration.checkpoint.procs import REPO, Proc, python

FINAL_RE = re.compile(r"^final step=(\d+) val_loss=(\S+) weights_sha256=([0-9a-f]{64})$")
STOPPED_RE = re.compile(r"^stopped step=(\d+)$")
STEPS = 60
ARGS = f"--steps {STEPS} --seed 7 --step-ms 25 --hidden 32 --state-mb 1".split()
RANKS = (0, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gang_env(folder: Path, rank: int, port: int, **extra: str) -> dict[str, str]:
    """What the agent of rank `rank`'s instance would give; one store shared by the gang."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    env.update(
        PYTHONPATH=str(REPO),
        BATON_JOB_ID="wl",
        BATON_RANK=str(rank),
        BATON_WORLD_SIZE=str(len(RANKS)),
        BATON_MASTER_ADDR="127.0.0.1",
        BATON_MASTER_PORT=str(port),
        BATON_STORE_URL=(folder / "store").as_uri(),
        BATON_CHECKPOINT_DIR=str(folder / f"rank{rank}"),
        BATON_CHECKPOINT_EVERY_STEPS="0",
        BATON_CHECKPOINT_EVERY_SECONDS="0.25",
        BATON_LOG_LEVEL="INFO",
    )
    env.update(extra)
    return env


def start_gang(folder: Path, per_rank: dict[int, dict[str, str]] | None = None) -> list[Proc]:
    """Both ranks of the gang, each with its own environment (plus `per_rank[rank]`)."""
    port = free_port()
    extra = per_rank or {}
    argv = python("-m", "jobs.workloads.mlp_torch", *ARGS)
    return [Proc(argv, gang_env(folder, rank, port, **extra.get(rank, {}))) for rank in RANKS]


def finish(procs: list[Proc]) -> None:
    for proc in procs:
        assert proc.finish() == 0, proc.describe()


def final_digest(procs: list[Proc]) -> str:
    """The weights every rank ended with, which must be the same on all of them."""
    finals = [FINAL_RE.match(proc.stdout[-1]) for proc in procs]
    assert all(finals), [proc.describe() for proc in procs]
    assert {int(f.group(1)) for f in finals if f} == {STEPS}
    digests = {f.group(3) for f in finals if f}
    assert len(digests) == 1, digests
    return digests.pop()


def saved_points(store: LocalStore, rank: int) -> list[tuple[int, str]]:
    return [(ref.step, ref.kind) for ref in store.list("wl", rank)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One uninterrupted gang run: its folder and the weights it ended with. The ranks' clocks
    disagree on purpose (a timed save every 0.2 s on one, 0.35 s on the other)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    procs = start_gang(
        folder,
        {
            0: {"BATON_CHECKPOINT_EVERY_SECONDS": "0.2"},
            1: {"BATON_CHECKPOINT_EVERY_SECONDS": "0.35"},
        },
    )
    finish(procs)
    return folder, final_digest(procs)


def test_two_ranks_end_with_the_same_weights_and_save_at_the_same_steps(
    uninterrupted: tuple[Path, str],
) -> None:
    folder, _ = uninterrupted
    store = LocalStore(folder / "store")
    points = saved_points(store, 0)
    assert points == saved_points(store, 1)
    assert len([p for p in points if p[1] == "periodic"]) >= 2, points
    assert points[-1] == (STEPS, "final")


def test_a_sigterm_to_one_rank_stops_the_gang_at_one_step_and_it_resumes_bit_exact(
    uninterrupted: tuple[Path, str], tmp_path: Path
) -> None:
    procs = start_gang(tmp_path)
    procs[1].wait_for(r"^started step=0$")
    time.sleep(0.5)
    procs[1].signal(signal.SIGTERM)
    finish(procs)
    stops = {STOPPED_RE.match(proc.stdout[-1]) for proc in procs}
    assert None not in stops, [proc.describe() for proc in procs]
    (stopped,) = {int(m.group(1)) for m in stops if m}
    assert 0 < stopped < STEPS
    for proc in procs:
        assert f"emergency save committed step={stopped}" in "\n".join(proc.stderr)

    store = LocalStore(tmp_path / "store")
    for rank in RANKS:
        assert saved_points(store, rank)[-1] == (stopped, "emergency")
    resume = store.latest_complete("wl", len(RANKS))
    assert resume == ManifestRef("wl", stopped, "emergency", 0)

    procs = start_gang(tmp_path, {rank: {"BATON_RESUME": resume.key} for rank in RANKS})
    finish(procs)
    for proc in procs:
        assert proc.stdout[0].startswith(f"resumed step={stopped} "), proc.describe()
        assert "reference_matches=True" in proc.stdout[0]
    assert final_digest(procs) == uninterrupted[1]


def test_an_advance_notice_to_one_rank_checkpoints_the_whole_gang_at_one_step(
    uninterrupted: tuple[Path, str], tmp_path: Path
) -> None:
    no_timer = {"BATON_CHECKPOINT_EVERY_SECONDS": "0"}
    procs = start_gang(tmp_path, {rank: no_timer for rank in RANKS})
    procs[0].wait_for(r"^started step=0$")
    time.sleep(0.3)
    procs[0].signal(signal.SIGUSR1)
    finish(procs)
    assert final_digest(procs) == uninterrupted[1]
    store = LocalStore(tmp_path / "store")
    points = saved_points(store, 0)
    assert points == saved_points(store, 1)
    assert [kind for _, kind in points] == ["periodic", "final"]


def test_a_rank_that_cannot_reach_rank_0_says_so() -> None:
    port = free_port()  # nobody listens there
    env = {"BATON_MASTER_ADDR": "127.0.0.1", "BATON_MASTER_PORT": str(port)}
    started = time.monotonic()
    with pytest.raises(GangError, match=rf"rank 1 of 2 could not reach rank 0 at 127.0.0.1:{port}"):
        join_gang(1, 2, env, timeout=timedelta(seconds=1))
    assert time.monotonic() - started < 10
    with pytest.raises(GangError, match="BATON_MASTER_ADDR and BATON_MASTER_PORT"):
        join_gang(1, 2, {})

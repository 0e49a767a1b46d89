"""Two tiers under the real agent: a workload SIGKILLed between a local commit and its upload
loses nothing, because the agent uploads what the local tier holds before it reports the exit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from migration.agent.runner import EXIT_FAILED
from migration.checkpoint import ManifestRef
from tests.migration.agent.conftest import (
    AgentRun,
    FakeMetadata,
    FakePortal,
    agent_environment,
    wait_until,
)

from .conftest import new_s3_store
from .s3server import BUCKET, FlakyProxy, S3Server

LOCAL_COMMIT = re.compile(r"committed (\S+) step=(\d+) .* in the local tier")


@pytest.fixture
def servers() -> Iterator[tuple[FakeMetadata, FakePortal]]:
    metadata, portal = FakeMetadata(), FakePortal()
    metadata.start()
    portal.start()
    yield metadata, portal
    portal.stop()
    metadata.stop()


def local_commits(run: AgentRun) -> list[tuple[str, int]]:
    return [(m[1], int(m[2])) for m in LOCAL_COMMIT.finditer(run.output())]


def test_a_workload_killed_before_its_upload_still_has_its_checkpoint_in_the_region(
    s3_env: S3Server, servers: tuple[FakeMetadata, FakePortal], tmp_path: Path
) -> None:
    metadata, portal = servers
    proxy = FlakyProxy(int(s3_env.endpoint.rsplit(":", 1)[1]))
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    agent_dir = tmp_path / "agent"
    env = agent_environment(
        tmp_path,
        metadata,
        portal,
        BATON_AGENT_DIR=str(agent_dir),
        BATON_STORE_URL=f"s3://{BUCKET}/{prefix}",
        BATON_S3_ENDPOINT=proxy.endpoint,
        BATON_LOCAL_STORE_URL=(tmp_path / "local-tier").as_uri(),
        BATON_CHECKPOINT_EVERY_STEPS="25",
    )
    workload = [sys.executable, "-m", "jobs.workloads.mlp_numpy", "--steps", "100000"]
    workload += ["--seed", "3", "--step-ms", "20"]
    agent_dir.mkdir()
    stderr_path = tmp_path / "agent.stderr"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "migration.agent", "--", *workload],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
        )
    run = AgentRun(process, agent_dir, agent_dir / "checkpoint", stderr_path)
    try:
        wait_until(lambda: "started step=0" in run.output(), message="the workload to start")
        # The region's store becomes unreachable: from now on no upload can complete.
        proxy.cut()
        seen = len(local_commits(run))
        wait_until(
            lambda: len(local_commits(run)) >= seen + 2, message="local commits after the cut"
        )
        pid = wait_until(lambda: [h["pid"] for h in portal.of_type("heartbeat") if h["pid"]])
        assert isinstance(pid, list)
        os.kill(pid[-1], signal.SIGKILL)
        proxy.heal()
        assert run.wait() == EXIT_FAILED, run.stderr()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        proxy.close()

    newest_logged = local_commits(run)[-1]
    region = new_s3_store(s3_env, prefix)
    newest = region.latest("42", 0)
    assert newest is not None and newest.step >= newest_logged[1], run.stderr()
    region.verify(newest)
    uploaded = [c for c in portal.of_type("checkpoint") if c.get("uploaded_by") == "agent"]
    assert uploaded, run.stderr()
    assert uploaded[-1]["manifest"] == newest.key
    assert uploaded[-1]["bytes_uploaded"] > 0
    assert {"step", "kind", "bytes_new", "bytes_total", "validation_reference"} <= set(uploaded[0])
    # Reported before the exit, which says how the workload ended.
    types = portal.types()
    assert types.index("exit") > max(i for i, t in enumerate(types) if t == "checkpoint")
    [exit_event] = portal.of_type("exit")
    assert exit_event["signal"] == "SIGKILL" and exit_event["reason"] == "failed"
    assert ManifestRef.parse(newest_logged[0]).step <= newest.step
    region.close()

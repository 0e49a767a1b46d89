"""The reference SDK workload (`mlp_numpy`) under the agent: notices, reports, resume."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from migration.agent.runner import EXIT_FINISHED, EXIT_PREEMPTED
from tests.migration.agent.conftest import AgentRun, FakeMetadata, FakePortal, wait_until

FINAL = re.compile(r"^final step=(\d+) val_loss=(\S+) weights_sha256=([0-9a-f]{64})$", re.M)


def mlp(steps: int, step_ms: float) -> list[str]:
    return [
        sys.executable, "-m", "jobs.workloads.mlp_numpy",
        "--steps", str(steps), "--seed", "3", "--step-ms", str(step_ms),
    ]  # fmt: skip


def test_mlp_numpy_checkpoints_on_notice_and_resumes_to_the_uninterrupted_weights(
    start_agent: Callable[..., AgentRun],
    metadata: FakeMetadata,
    portal: FakePortal,
    store_url: str,
    tmp_path: Path,
) -> None:
    alone = subprocess.run(
        mlp(1000, 0),
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("BATON_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    expected = FINAL.search(alone.stdout)
    assert expected, alone.stdout + alone.stderr

    sdk = {"BATON_STORE_URL": store_url, "BATON_CHECKPOINT_EVERY_STEPS": "40"}
    first = start_agent(mlp(1000, 10), **sdk)
    wait_until(lambda: portal.of_type("progress"), message="progress from the SDK")
    metadata.notice_advance()
    wait_until(lambda: len(portal.of_type("notice")) == 1, message="the advance notice")
    metadata.notice_final(in_seconds=20)
    assert first.wait() == EXIT_PREEMPTED, first.stderr()
    assert "stopped step=" in first.output()
    emergency = [c for c in portal.of_type("checkpoint") if c["kind"] == "emergency"]
    assert len(emergency) == 1
    assert emergency[0]["rank"] == 0 and emergency[0]["world_size"] == 1

    metadata.advance = metadata.final = None
    second = start_agent(mlp(1000, 0), BATON_RESUME=emergency[0]["manifest"], **sdk)
    assert second.wait() == EXIT_FINISHED, second.stderr()
    assert f"resumed step={emergency[0]['step']}" in second.output()

    restore = portal.of_type("restore")[0]
    assert restore["manifest"] == emergency[0]["manifest"]
    assert restore["val_loss"] is not None and restore["reference"] is not None
    result = portal.of_type("result")
    assert [r["source"] for r in result] == ["sdk"]
    assert result[0]["weights_sha256"] == expected.group(3)
    assert int(result[0]["step"]) == 1000
    assert portal.of_type("progress")[-1]["step"] > emergency[0]["step"]
    kinds = {c["kind"] for c in portal.of_type("checkpoint")}
    assert {"emergency", "final"} <= kinds
    assert [e["reason"] for e in portal.of_type("exit")] == ["preempted", "finished"]

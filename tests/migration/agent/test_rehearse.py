"""`baton-agent rehearse`: a real interruption of a real command, then a resume, judged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.migration.agent.conftest import REPO
from tests.migration.agent.test_half_written import SCRIPT

EXAMPLE = [
    sys.executable, "-m", "jobs.workloads.dir_mode_example", "--steps", "100000",
    "--step-ms", "5", "--checkpoint-dir", "{checkpoint_dir}",
    "--resume-from-checkpoint", "{checkpoint_dir}",
]  # fmt: skip


def rehearse(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    environ.update(PYTHONPATH=str(REPO), BATON_AGENT_SYNC_INTERVAL="0.5", **env)
    return subprocess.run(
        [sys.executable, "-m", "migration.agent", "rehearse", "--workdir", str(tmp_path / "r"),
         "--window", "5", "--resume-for", "3", *args],
        env=environ, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_an_atomic_script_interrupted_at_a_chosen_time_resumes(tmp_path: Path) -> None:
    result = rehearse(tmp_path, "--at", "2", "--", *EXAMPLE)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "rehearsal: resumed" in result.stdout
    assert "75 (preempted)" in result.stdout


def test_a_script_saving_in_place_interrupted_mid_write_resumes_from_the_previous_version(
    tmp_path: Path,
) -> None:
    # Saves ~0.6 s apart: between two of them the file settles (two looks 0.25 s apart with no
    # writer), so a previous version exists when the notice lands mid-write.
    command = [
        sys.executable, str(SCRIPT), "--steps", "100000", "--every", "120", "--size-mb", "8",
        "--checkpoint", "{checkpoint_dir}/ckpt.bin", "--write-pause-ms", "5",
    ]  # fmt: skip
    result = rehearse(
        tmp_path, "--during-write", "--progress-pattern", r"^iter (\d+)$", "--", *command
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "rehearsal: resumed" in result.stdout
    assert "while a checkpoint file was written" in result.stdout
    resumed = (tmp_path / "r" / "run-2-resumed" / "agent" / "logs" / "rank-0.log").read_text()
    assert "(BATON_RESUMED=1)" in resumed


def test_a_script_whose_checkpoint_is_outside_the_folder_is_not_resumed(tmp_path: Path) -> None:
    command = [
        sys.executable, str(SCRIPT), "--steps", "100000", "--size-mb", "1",
        "--checkpoint", str(tmp_path / "elsewhere.bin"),
    ]  # fmt: skip
    result = rehearse(tmp_path, "--at", "1.5", "--", *command)

    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT resumed" in result.stdout
    assert "nothing was saved" in result.stdout


def test_a_store_url_that_cannot_work_is_a_configuration_error_naming_it(tmp_path: Path) -> None:
    result = rehearse(tmp_path, "--at", "1", "--", *EXAMPLE, BATON_STORE_URL="file://./store")

    assert result.returncode == 2
    assert "BATON_STORE_URL" in result.stderr

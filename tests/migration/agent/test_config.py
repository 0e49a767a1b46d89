"""The agent's configuration: every mistake is one clear message naming the variable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from migration.agent.config import ConfigError, load_config, workload_environment
from tests.migration.agent.conftest import REPO

BASE = {
    "BATON_JOB_ID": "7",
    "BATON_METADATA_URL": "http://127.0.0.1:9",
    "BATON_AGENT_MODE": "sdk",
}
COMMAND = ["python", "train.py"]


def error_for(overrides: dict[str, str], argv: list[str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **overrides}, COMMAND if argv is None else argv)
    return caught.value


def test_defaults_give_a_working_sdk_configuration(tmp_path: Path) -> None:
    config = load_config({**BASE, "BATON_AGENT_DIR": str(tmp_path)}, COMMAND)
    assert (config.job_id, config.rank, config.world_size) == ("7", 0, 1)
    assert config.final_signal is signal.SIGTERM
    assert config.checkpoint_dir == tmp_path / "checkpoint"
    assert config.log_dir == tmp_path / "logs"
    assert config.command == ("python", "train.py")


def test_it_names_a_missing_job_id() -> None:
    error = error_for({"BATON_JOB_ID": ""})
    assert error.variable == "BATON_JOB_ID"
    assert "required" in str(error)


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("BATON_RANK", "-1", "at least 0"),
        ("BATON_RANK", "one", "whole number"),
        ("BATON_WORLD_SIZE", "0", "at least 1"),
        ("BATON_MASTER_PORT", "70000", "at most 65535"),
        ("BATON_AGENT_POLL_INTERVAL", "0", "greater than 0"),
        ("BATON_AGENT_POLL_INTERVAL", "soon", "number of seconds"),
        ("BATON_AGENT_SAFETY_MARGIN", "-5", "0 or more"),
        ("BATON_AGENT_GRACE_PERIOD", "nan", "0 or more"),
        ("BATON_CHECKPOINT_EVERY_STEPS", "1.5", "whole number"),
        ("BATON_AGENT_MODE", "magic", "sdk, directory"),
        ("BATON_AGENT_FINAL_SIGNAL", "SIGNOPE", "not a signal"),
        ("BATON_AGENT_SIGNAL_GROUP", "maybe", "true or false"),
        ("BATON_METADATA_URL", "169.254.169.254", "http://"),
        ("BATON_STORE_URL", "ftp://x/y", "file://"),
        ("BATON_AGENT_PROGRESS_PATTERN", "step=(", "regex"),
        ("BATON_AGENT_PROGRESS_PATTERN", r"step=\d+", "captures"),
        ("BATON_AGENT_LOG_LEVEL", "chatty", "DEBUG"),
    ],
)
def test_it_rejects_a_bad_value_naming_the_variable(variable: str, value: str, words: str) -> None:
    error = error_for({variable: value})
    assert error.variable == variable
    assert words in str(error)


def test_it_rejects_a_rank_outside_the_world() -> None:
    error = error_for({"BATON_RANK": "2", "BATON_WORLD_SIZE": "2"})
    assert error.variable == "BATON_RANK"
    assert "below BATON_WORLD_SIZE" in str(error)


def test_directory_mode_needs_a_store() -> None:
    error = error_for({"BATON_AGENT_MODE": "directory"})
    assert error.variable == "BATON_STORE_URL"


def test_a_portal_url_needs_a_token() -> None:
    error = error_for({"BATON_PORTAL_URL": "http://127.0.0.1:8000"})
    assert error.variable == "BATON_AGENT_TOKEN"


def test_it_needs_a_command() -> None:
    error = error_for({}, argv=[])
    assert error.variable == "BATON_AGENT_COMMAND"
    assert "`--`" in str(error)


@pytest.mark.parametrize("raw", ["python train.py", "[]", '["python", 3]', "{}"])
def test_it_rejects_a_command_that_is_not_a_json_list_of_strings(raw: str) -> None:
    assert error_for({"BATON_AGENT_COMMAND": raw}, argv=[]).variable == "BATON_AGENT_COMMAND"


def test_the_command_comes_from_json_or_from_the_command_line() -> None:
    env = {**BASE, "BATON_AGENT_COMMAND": json.dumps(["python", "a.py"])}
    assert load_config(env, []).command == ("python", "a.py")
    assert load_config(env, ["python", "b.py"]).command == ("python", "b.py")


@pytest.mark.parametrize(("raw", "expected"), [("TERM", 15), ("SIGINT", 2), ("10", 10)])
def test_the_final_signal_is_a_name_or_a_number(raw: str, expected: int) -> None:
    config = load_config({**BASE, "BATON_AGENT_FINAL_SIGNAL": raw}, COMMAND)
    assert config.final_signal == expected


def test_the_checkpoint_dir_is_substituted_into_the_command(tmp_path: Path) -> None:
    config = load_config(
        {**BASE, "BATON_CHECKPOINT_DIR": str(tmp_path / "ckpt")},
        ["train", "--resume-from-checkpoint", "{checkpoint_dir}", "--out={checkpoint_dir}/x"],
    )
    assert config.workload_command() == [
        "train",
        "--resume-from-checkpoint",
        str(tmp_path / "ckpt"),
        f"--out={tmp_path / 'ckpt'}/x",
    ]


def test_the_workload_gets_the_design_environment_but_never_the_token(tmp_path: Path) -> None:
    environ = {
        **BASE,
        "BATON_RANK": "1",
        "BATON_WORLD_SIZE": "2",
        "BATON_MASTER_ADDR": "10.0.0.5",
        "BATON_STORE_URL": "s3://bucket/project",
        "BATON_S3_ENDPOINT": "http://127.0.0.1:8333",
        "BATON_RESUME": "jobs/7/manifests/000000000100-periodic-r1.json",
        "BATON_CHECKPOINT_EVERY_STEPS": "50",
        "BATON_CHECKPOINT_EVERY_SECONDS": "300",
        "BATON_CHECKPOINT_DIR": str(tmp_path),
        "BATON_PORTAL_URL": "http://portal.example",
        "BATON_AGENT_TOKEN": "secret",
        "HOME": "/home/user",
    }
    config = load_config(environ, COMMAND)
    env = workload_environment(config, "http://127.0.0.1:5000", environ)
    assert "BATON_AGENT_TOKEN" not in env
    assert env["HOME"] == "/home/user"
    assert env["BATON_AGENT_URL"] == "http://127.0.0.1:5000"
    assert {k: env[k] for k in environ if k.startswith("BATON_") and k in env} == {
        k: v for k, v in environ.items() if k.startswith("BATON_") and k != "BATON_AGENT_TOKEN"
    } | {"BATON_CHECKPOINT_DIR": str(tmp_path)}
    assert env["BATON_MASTER_PORT"] == "29500"


def test_the_agent_exits_with_status_2_and_names_the_variable(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "migration.agent", "--", "true"],
        env={"PATH": "", "PYTHONPATH": str(REPO), "BATON_JOB_ID": "7", "BATON_RANK": "x"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "BATON_RANK" in finished.stderr
    assert "whole number" in finished.stderr
    assert "Traceback" not in finished.stderr

"""Directory mode for scripts that know nothing of Baton: resume arguments, progress from the
output, and an exit status that says what happened."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from migration.agent.config import ConfigError, load_config, workload_environment
from migration.agent.runner import EXIT_FINISHED, EXIT_PREEMPTED
from migration.checkpoint import open_store
from tests.migration.agent.conftest import AgentRun, FakeMetadata, FakePortal, wait_until

StartAgent = Callable[..., AgentRun]
BASE = {"BATON_JOB_ID": "7", "BATON_STORE_URL": "file:///tmp/store"}

# A plain shell script: shows its arguments and BATON_RESUMED, writes a file, counts to 20.
SCRIPT = """
echo "args: $* resumed=$BATON_RESUMED"
echo data > "$BATON_CHECKPOINT_DIR/state.txt"
i=0
while [ $i -lt 20 ]; do i=$((i+1)); echo "iter $i"; sleep 0.05; done
"""
# The same, deaf to SIGTERM: it finishes its 20 steps whatever it is told.
DEAF = "trap '' TERM\n" + SCRIPT


def test_resume_args_are_a_json_list_used_only_when_resuming(tmp_path: Path) -> None:
    env = {**BASE, "BATON_AGENT_RESUME_ARGS": '["--init_from=resume", "--ckpt={checkpoint_dir}"]'}
    config = load_config({**env, "BATON_CHECKPOINT_DIR": str(tmp_path)}, ["train"])

    assert config.workload_command() == ["train"]
    assert config.workload_command(resumed=True) == [
        "train", "--init_from=resume", f"--ckpt={tmp_path}",
    ]  # fmt: skip
    assert workload_environment(config, "http://x", {}, resumed=True)["BATON_RESUMED"] == "1"
    assert workload_environment(config, "http://x", {})["BATON_RESUMED"] == "0"


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("BATON_AGENT_RESUME_ARGS", "--init_from=resume", "not valid JSON"),
        ("BATON_AGENT_RESUME_ARGS", '["ok", 3]', "JSON list of strings"),
        ("BATON_AGENT_TOTAL_STEPS", "0", "at least 1"),
        ("BATON_STORE_URL", "file://./store", "absolute folder"),
        ("BATON_STORE_URL", "file:store", "absolute folder"),
    ],
)
def test_a_bad_directory_option_names_its_variable(variable: str, value: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, variable: value}, ["train"])
    assert caught.value.variable == variable
    assert words in str(caught.value)


def shell(script: str) -> list[str]:
    return ["sh", "-c", script, "script"]


def test_a_standalone_resume_gets_its_arguments_and_baton_resumed(
    start_agent: StartAgent, metadata: FakeMetadata, store_url: str, tmp_path: Path
) -> None:
    options = {
        "BATON_AGENT_MODE": "directory",
        "BATON_STORE_URL": store_url,
        "BATON_AGENT_RESUME_ARGS": json.dumps(["--init_from=resume"]),
        "BATON_PORTAL_URL": "",
        "BATON_AGENT_LOG_LEVEL": "INFO",
    }
    first = start_agent(shell(SCRIPT), **options)
    assert first.wait() == EXIT_FINISHED
    second = start_agent(shell(SCRIPT), **options)
    assert second.wait() == EXIT_FINISHED

    assert "args:  resumed=0" in first.output()
    assert "args: --init_from=resume resumed=1" in second.output()
    # Standalone, the restore is a line at INFO.
    assert "INFO migration.agent.dirsync: restored" in second.stderr()


@pytest.mark.parametrize(("total", "expected"), [("20", EXIT_FINISHED), ("", EXIT_PREEMPTED)])
def test_status_0_after_the_final_signal_is_finished_only_when_the_work_is_done(
    start_agent: StartAgent,
    metadata: FakeMetadata,
    portal: FakePortal,
    store_url: str,
    total: str,
    expected: int,
) -> None:
    run = start_agent(
        shell(DEAF),
        BATON_AGENT_MODE="directory",
        BATON_STORE_URL=store_url,
        BATON_AGENT_PROGRESS_PATTERN=r"^iter (\d+)$",
        BATON_AGENT_TOTAL_STEPS=total,
    )
    wait_until(lambda: "iter 3" in run.output(), message="the script to count")
    metadata.notice_final(in_seconds=30)

    assert run.wait() == expected
    exit_event = portal.of_type("exit")[0]
    last = portal.of_type("checkpoint")[-1]
    if expected == EXIT_FINISHED:
        assert (exit_event["reason"], last["kind"]) == ("finished", "final")
    else:
        # No result line and short of the total: it may have stopped early, so it resumes.
        assert (exit_event["reason"], last["kind"]) == ("preempted", "emergency")
    with open_store(store_url) as store:
        assert store.latest("42") is not None


def test_a_sync_is_labelled_with_the_step_shown_when_its_file_was_written(
    start_agent: StartAgent, portal: FakePortal, store_url: str
) -> None:
    # The file is written once, at step 5; the script counts on to 20 and finishes.
    script = """
i=0
while [ $i -lt 20 ]; do
  i=$((i+1)); echo "iter $i"
  if [ $i -eq 5 ]; then echo five > "$BATON_CHECKPOINT_DIR/state.txt"; fi
  sleep 0.05
done
"""
    run = start_agent(
        shell(script),
        BATON_AGENT_MODE="directory",
        BATON_STORE_URL=store_url,
        BATON_AGENT_PROGRESS_PATTERN=r"^iter (\d+)$",
    )
    assert run.wait() == EXIT_FINISHED
    assert {c["step"] for c in portal.of_type("checkpoint")} == {5}
    progress = portal.of_type("progress")
    assert progress and progress[-1]["step"] == 20

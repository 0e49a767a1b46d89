"""A directory-mode command job's own options: resume arguments and the progress pattern."""

from __future__ import annotations

from typing import Any

import pytest

from migration.orchestration import workload_command
from tests.conftest import job_body

pytestmark = pytest.mark.django_db

COMMAND = ["python", "train.py", "--out", "{checkpoint_dir}"]


def test_it_keeps_resume_args_and_a_progress_pattern(
    catalogue: Any, make_user: Any, client_for: Any
) -> None:
    carol = make_user("carol", perms=("jobs.run_command",))
    workload = {
        "command": COMMAND,
        "resume_args": ["--init_from=resume"],
        "progress_pattern": r"iter (\d+)",
    }
    response = client_for(carol).post("/api/jobs/", job_body(workload=workload), format="json")

    assert response.status_code == 201, response.json()
    saved = response.json()["workload"]
    assert saved["resume_args"] == ["--init_from=resume"]
    assert saved["progress_pattern"] == r"iter (\d+)"


def test_resume_args_are_added_only_when_the_job_resumes(
    catalogue: Any, make_user: Any, client_for: Any
) -> None:
    from jobs.models import Job

    carol = make_user("carol", perms=("jobs.run_command",))
    workload = {"command": COMMAND, "resume_args": ["--init_from=resume"]}
    response = client_for(carol).post("/api/jobs/", job_body(workload=workload), format="json")
    job = Job.objects.get(pk=response.json()["id"])

    assert workload_command(job, resuming=False) == (COMMAND, "directory")
    assert workload_command(job, resuming=True) == ([*COMMAND, "--init_from=resume"], "directory")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"progress_pattern": r"iter \d+"}, "progress_pattern needs a group"),
        ({"progress_pattern": "iter ("}, "progress_pattern is not a valid regex"),
        ({"resume_args": "--init_from=resume"}, "resume_args must be a list"),
        ({"resume_args": [""]}, "resume_args must be a list"),
    ],
)
def test_it_names_a_bad_directory_option(
    catalogue: Any, make_user: Any, client_for: Any, extra: dict[str, Any], message: str
) -> None:
    carol = make_user("carol", perms=("jobs.run_command",))
    body = job_body(workload={"command": COMMAND, **extra})
    response = client_for(carol).post("/api/jobs/", body, format="json")

    assert response.status_code == 400
    assert message in str(response.json()["workload"])

"""The job state machine (DESIGN §4). Pure: states are the plain strings of JobState."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol


class StatefulJob(Protocol):
    """What `set_state` needs of a job row (jobs.models.Job, without importing Django)."""

    state: str
    finished_at: datetime | None

    def save(self, *, update_fields: list[str]) -> None: ...


TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"placing", "cancelled", "failed"}),
    "placing": frozenset({"starting", "waiting", "failed", "cancelled"}),
    "waiting": frozenset({"placing", "failed", "cancelled"}),
    "starting": frozenset({"running", "migrating", "failed", "cancelled"}),
    "running": frozenset({"migrating", "succeeded", "failed", "cancelled"}),
    "migrating": frozenset({"placing", "succeeded", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

FINISHED = frozenset({"succeeded", "failed", "cancelled"})


class InvalidTransition(Exception):
    """A job was asked to move to a state its current state cannot reach."""

    def __init__(self, current: str, target: str) -> None:
        super().__init__(f"a {current} job cannot become {target}")
        self.current = current
        self.target = target


def check_transition(current: str, target: str) -> None:
    """Raise InvalidTransition unless `current -> target` is an edge of the lifecycle."""
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(current, target)


def is_finished(state: str) -> bool:
    return state in FINISHED


def set_state(job: StatefulJob, state: str, **fields: Any) -> None:
    """Move a locked job along its lifecycle and save the changed fields: the one place a
    job's state changes."""
    check_transition(job.state, state)
    job.state = state
    if is_finished(state):
        job.finished_at = datetime.now(UTC)
        fields.setdefault("finished_at", job.finished_at)
    for name, value in fields.items():
        setattr(job, name, value)
    job.save(update_fields=["state", "updated_at", *fields])

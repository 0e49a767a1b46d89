"""Job actions: submit, cancel, and the personal project every user gets on first use."""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from jobs.choices import JobState
from jobs.lifecycle import is_finished, set_state
from jobs.models import Job, Project
from jobs.workloads.catalog import TEMPLATES
from migration.choices import TimelineKind
from migration.events import record_event
from portal.enqueue import enqueue_on_commit
from portal.files import private_text
from portal.locks import lock_rows

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)


def ensure_personal_project(user: User) -> Project:
    """The user's own project, created the first time it is needed."""
    existing = Project.objects.filter(personal_owner=user).first()
    if existing:
        return existing
    base = slugify(user.get_username()) or f"user-{user.pk}"
    slug = base
    n = 1
    while Project.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    with transaction.atomic():
        project, _ = Project.objects.get_or_create(
            personal_owner=user, defaults={"name": f"{user.get_username()}'s project", "slug": slug}
        )
        project.members.add(user)
    return project


def derived_inputs(workload: dict[str, Any], total_steps: int) -> tuple[float, float]:
    """Expected hours and checkpoint size from a template's parameters (commands: defaults)."""
    template = TEMPLATES.get(workload.get("template", ""))
    if template is None:
        return total_steps * 0.01 / 3600, 1.0
    params = workload.get("params", {})
    return template.expected_hours(total_steps, params), template.checkpoint_gb(params)


def build_job(owner: User, **fields: Any) -> Job:
    """An unsaved job from validated fields, with the estimator's inputs filled in."""
    hours, gb = derived_inputs(fields["workload"], fields["total_steps"])
    fields["expected_hours"] = fields.get("expected_hours") or hours
    fields["checkpoint_gb"] = fields.get("checkpoint_gb") or gb
    return Job(owner=owner, **fields)


def submit_job(owner: User, **fields: Any) -> Job:
    """Create a job from validated fields with its cost estimate, and queue its placement
    after commit. The estimate (a Monte Carlo) runs before the write transaction opens."""
    from costs.services import estimate_job

    if fields.get("project") is None:
        fields["project"] = ensure_personal_project(owner)
    job = build_job(owner, **fields)
    estimate = estimate_job(job)
    job.estimate = estimate.to_dict() if estimate else None
    with transaction.atomic():
        job.save()
        record_event(job, TimelineKind.JOB_SUBMITTED, {"by": owner.get_username()})
        enqueue_on_commit("migration.tasks.place_job_task", job.pk)
    return job


class JobAlreadyFinished(Exception):
    """The job has finished; there is nothing to cancel."""


@dataclass(frozen=True)
class CancelOutcome:
    job: Job
    released_instances: int


@transaction.atomic
def cancel_job(job_id: int, by: User) -> CancelOutcome:
    """Cancel a job: release its instances and record why. Idempotent for finished jobs."""
    from migration.services import release_job_instances

    job = lock_rows(Job.objects).get(pk=job_id)
    if is_finished(job.state):
        raise JobAlreadyFinished(f"job {job.pk} is already {job.state}")
    released = release_job_instances(job, reason="cancelled")
    set_state(job, JobState.CANCELLED)
    record_event(job, TimelineKind.CANCELLED, {"by": by.get_username(), "released": released})
    return CancelOutcome(job, released)


DEMO_USERNAME = "demo"


def demo_password() -> str:
    """BATON_DEMO_PASSWORD, else the password generated on first start into BATON_HOME."""
    given = os.environ.get("BATON_DEMO_PASSWORD")
    if given:
        return given
    return private_text(settings.BATON_DEMO_PASSWORD_FILE, lambda: secrets.token_urlsafe(12))


@transaction.atomic
def ensure_demo_user() -> tuple[str, str]:
    """The `demo` user with its personal project; returns (username, password)."""
    from django.contrib.auth import get_user_model

    password = demo_password()
    user, _ = get_user_model().objects.get_or_create(
        username=DEMO_USERNAME, defaults={"email": "demo@example.com"}
    )
    if not user.check_password(password):
        user.set_password(password)
        user.save(update_fields=["password"])
    ensure_personal_project(user)  # the project "demo"
    return DEMO_USERNAME, password

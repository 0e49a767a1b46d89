"""Read-only queries shared by the API, the pages and the consumers."""

from __future__ import annotations

from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F

from jobs.models import Job
from migration.events import serialize_event
from migration.models import Migration, TimelineEvent

REPLAY_LIMIT = 5000


def can_watch_job(user: Any, job_id: int) -> bool:
    """Members of the job's project and staff may watch it; unknown jobs are refused."""
    return Job.objects.visible_to(user).filter(pk=job_id).exists()


def job_events_after(job_id: int, since: int) -> tuple[list[dict[str, Any]], str | None]:
    """The job's events after `since`, and its state as of the same read (one query when
    there are events, so the state is never older than the events)."""
    events = list(
        TimelineEvent.objects.filter(job_id=job_id, id__gt=since)
        .select_related("job")
        .order_by("id")[:REPLAY_LIMIT]
    )
    state: str | None
    if events:
        state = events[-1].job.state
    else:
        state = Job.objects.filter(pk=job_id).values_list("state", flat=True).first()
    return [serialize_event(e) for e in events], state


def fleet_events_after(since: int) -> tuple[list[dict[str, Any]], str | None]:
    events = TimelineEvent.objects.filter(id__gt=since).order_by("id")
    return [serialize_event(e) for e in events[:REPLAY_LIMIT]], None


def migration_overhead_hours(default: float, last: int = 50) -> float:
    """Mean duration of the last finished migrations (notice to running again), or `default`
    before there is any: the restart overhead the estimator and the policies charge."""
    took = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    durations = list(
        Migration.objects.filter(finished_at__isnull=False)
        .order_by("-finished_at")
        .annotate(took=took)
        .values_list("took", flat=True)[:last]
    )
    if not durations:
        return default
    return sum(d.total_seconds() for d in durations) / len(durations) / 3600

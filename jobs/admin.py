"""Admin for projects and jobs.

A job changes only through the services the API uses: submission checks the workload (a
command needs `jobs.run_command`), and the lifecycle moves its state. So the admin adds no
job, shows every field but the name read-only, cancels through `cancel_job`, and deletes
only finished jobs (an unfinished one still holds instances), their checkpoints with them.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs import services
from jobs.lifecycle import is_finished
from jobs.models import Job, Project
from migration import replication


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "personal_owner", "created_at"]
    search_fields = ["slug", "name"]
    filter_horizontal = ["members"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "project",
        "owner",
        "state",
        "accelerator",
        "nodes",
        "step",
        "total_steps",
        "market",
        "cost_so_far",
        "created_at",
    ]
    list_filter = ["state", "tolerance", "market", "accelerator"]
    search_fields = ["name", "owner__username", "project__slug"]
    list_select_related = ["project", "owner", "accelerator"]
    readonly_fields = [field.name for field in Job._meta.fields if field.name not in ("id", "name")]
    actions = ["cancel"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        if obj is not None and not is_finished(obj.state):
            return False
        return super().has_delete_permission(request, obj)

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        self.delete_queryset(request, Job.objects.filter(pk=obj.pk))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        # The bulk action bypasses has_delete_permission(obj): the service refuses unfinished
        # jobs there too.
        deleted, refused = replication.delete_finished_jobs(queryset.select_related("project"))
        if deleted:
            self.message_user(
                request,
                f"Removing the checkpoints of job(s) {', '.join(map(str, deleted))} from their "
                "region stores.",
            )
        if refused:
            self.message_user(
                request,
                f"Not deleted: job(s) {', '.join(map(str, refused))} are not finished.",
                level=messages.WARNING,
            )

    @admin.action(description="Cancel (release the job's instances)", permissions=["change"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        cancelled, refused = [], []
        for job in queryset:
            try:
                services.cancel_job(job.pk, request.user)  # type: ignore[arg-type]
                cancelled.append(str(job.pk))
            except services.JobAlreadyFinished as exc:
                refused.append(str(exc))
        if cancelled:
            self.message_user(request, f"Cancelled job(s) {', '.join(cancelled)}.")
        for reason in refused:
            self.message_user(request, reason, level=messages.WARNING)

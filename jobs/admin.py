"""Admin for projects and jobs."""

from __future__ import annotations

from django.contrib import admin

from jobs.models import Job, Project


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
    raw_id_fields = ["owner", "project", "pool"]
    readonly_fields = ["created_at", "updated_at", "finished_at", "estimate", "result"]

"""Admin for capacity: regions, accelerators with their compatibility rules inline, pools,
and read-only views of instances, migrations, checkpoints, notices and the timeline."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from migration.interruptions import InstanceNotRunning, interrupt_instance
from migration.models import (
    Accelerator,
    CapacityPool,
    Checkpoint,
    CheckpointReplica,
    CompatibilityRule,
    Instance,
    InterruptionEvent,
    LogLine,
    Migration,
    Region,
    RegionLatency,
    TimelineEvent,
)


class RegionLatencyInline(admin.TabularInline):
    model = RegionLatency
    fk_name = "source"
    extra = 0


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin):
    list_display = ["code", "name"]
    search_fields = ["code", "name"]
    inlines = [RegionLatencyInline]


class CompatibilityRuleInline(admin.TabularInline):
    """The matrix row of one card: what may stand in for it."""

    model = CompatibilityRule
    fk_name = "source"
    extra = 1
    fields = [
        "target",
        "kind",
        "target_count",
        "enabled",
        "operator_compatibility",
        "memory_mapping",
        "communication_adaptation",
    ]
    verbose_name = "substitute"
    verbose_name_plural = "substitutes (compatibility rules from this card)"


@admin.register(Accelerator)
class AcceleratorAdmin(admin.ModelAdmin):
    list_display = ["name", "generation", "memory_gib", "compute_capability", "interconnect"]
    list_filter = ["generation", "interconnect"]
    search_fields = ["name"]
    inlines = [CompatibilityRuleInline]


@admin.register(CompatibilityRule)
class CompatibilityRuleAdmin(admin.ModelAdmin):
    """The matrix as a list (filters, enable or disable in place) and as a read-only grid of
    which card may stand in for which (`matrix/`)."""

    list_display = ["source", "target", "kind", "target_count", "enabled"]
    list_filter = ["kind", "enabled", "source", "target"]
    list_editable = ["enabled"]
    list_select_related = ["source", "target"]
    search_fields = ["source__name", "target__name"]
    change_list_template = "admin/migration/compatibilityrule/change_list.html"

    def get_urls(self) -> list[URLPattern]:
        grid = path(
            "matrix/",
            self.admin_site.admin_view(self.matrix_view),
            name="migration_compatibilityrule_matrix",
        )
        return [grid, *super().get_urls()]

    def matrix_view(self, request: HttpRequest) -> HttpResponse:
        """Rows: the card a job asks for; columns: the card that may run it instead."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        cards = list(Accelerator.objects.order_by("generation", "memory_gib", "name"))
        cells: dict[tuple[int, int], list[CompatibilityRule]] = {}
        for rule in CompatibilityRule.objects.all():
            cells.setdefault((rule.source_id, rule.target_id), []).append(rule)

        def cell(card: Accelerator, target: Accelerator) -> tuple[str, list[CompatibilityRule]]:
            rules = cells.get((card.pk, target.pk), [])
            if card == target:
                return "self", rules
            if any(rule.enabled for rule in rules):
                return "allowed", rules
            return ("disabled" if rules else ""), rules

        rows = [(card, [cell(card, target) for target in cards]) for card in cards]
        context = {
            **self.admin_site.each_context(request),
            "title": "Compatibility matrix",
            "opts": self.model._meta,
            "cards": cards,
            "rows": rows,
        }
        return TemplateResponse(request, "admin/migration/compatibility_matrix.html", context)


@admin.register(CapacityPool)
class CapacityPoolAdmin(admin.ModelAdmin):
    list_display = [
        "instance_type",
        "region",
        "zone",
        "accelerator",
        "gpus_per_instance",
        "market",
        "price_per_hour",
        "capacity",
        "interruption_rate_per_hour",
        "backend",
        "enabled",
    ]
    list_filter = ["market", "backend", "enabled", "region", "accelerator"]
    list_editable = ["price_per_hour", "capacity", "enabled"]
    readonly_fields = ["last_preempted_at"]
    search_fields = ["instance_type", "zone"]
    list_select_related = ["region", "accelerator"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records the orchestrator writes (a checkpoint's status, a migration's phase, a notice):
    shown, never edited by hand, since an edit would bypass the services that keep them
    consistent with the job."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    """Instances change through their agents and the orchestrator, not by hand; staff can
    interrupt running ones (the same two-level notice as POST /api/instances/{id}/interrupt/)."""

    list_display = ["id", "job", "rank", "pool", "state", "awareness_abnormal", "last_heartbeat"]
    list_filter = ["state", "awareness_abnormal", "pool__market"]
    list_select_related = ["job", "pool", "pool__region"]
    readonly_fields = [field.name for field in Instance._meta.fields if field.name not in ("id",)]
    actions = ["interrupt"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Interrupt (the pool's advance notice and final window)")
    def interrupt(self, request: HttpRequest, queryset: QuerySet[Instance]) -> None:
        done, refused = [], []
        for instance in queryset.select_related("pool"):
            try:
                interrupt_instance(
                    instance.pk,
                    advance_notice_s=instance.pool.advance_notice_s,
                    final_window_s=instance.pool.final_window_s,
                    source="manual",
                )
                done.append(str(instance.pk))
            except InstanceNotRunning as exc:
                refused.append(str(exc))
        if done:
            self.message_user(request, f"Interrupted instance(s) {', '.join(done)}.")
        for reason in refused:
            self.message_user(request, reason, level=messages.WARNING)


@admin.register(InterruptionEvent)
class InterruptionEventAdmin(ReadOnlyAdmin):
    list_display = ["instance", "level", "received_at", "deadline_at", "source"]
    list_filter = ["level", "source"]


@admin.register(Migration)
class MigrationAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "job",
        "trigger",
        "from_pool",
        "to_pool",
        "phase",
        "lost_steps",
        "started_at",
    ]
    list_filter = ["trigger", "phase"]
    raw_id_fields = ["job", "from_pool", "to_pool", "checkpoint"]


@admin.register(TimelineEvent)
class TimelineEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "kind", "at"]
    list_filter = ["kind"]
    search_fields = ["job__name"]


class CheckpointReplicaInline(admin.TabularInline):
    model = CheckpointReplica
    extra = 0

    def has_add_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "step", "kind", "status", "bytes_total", "bytes_new", "created_at"]
    list_filter = ["kind", "status"]
    inlines = [CheckpointReplicaInline]
    raw_id_fields = ["job"]


@admin.register(LogLine)
class LogLineAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "rank", "at", "line"]
    list_filter = ["rank"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[LogLine]:
        return super().get_queryset(request).select_related("job")

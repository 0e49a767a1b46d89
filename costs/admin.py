"""Admin for price and availability history."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from costs.models import AvailabilitySample, PriceSample, SpotPoolHistory


@admin.register(PriceSample)
class PriceSampleAdmin(admin.ModelAdmin):
    list_display = ["pool", "at", "price", "source"]
    list_filter = ["source", "pool__region", "pool__accelerator"]
    list_select_related = ["pool", "pool__region"]
    date_hierarchy = "at"


@admin.register(AvailabilitySample)
class AvailabilitySampleAdmin(admin.ModelAdmin):
    list_display = ["trace", "region", "accelerator", "at", "available"]
    list_filter = ["trace", "region", "accelerator", "available"]
    date_hierarchy = "at"


@admin.register(SpotPoolHistory)
class SpotPoolHistoryAdmin(admin.ModelAdmin):
    """Derived by every import: shown, not edited (the next refresh would overwrite it)."""

    list_display = ["pool", "source", "interruption_rate_per_hour", "mean_outage_hours"]
    list_filter = ["source"]
    list_select_related = ["pool", "pool__region"]
    readonly_fields = [
        "pool",
        "source",
        "borrowed_from",
        "interruption_rate_per_hour",
        "mean_outage_hours",
        "uptime_cv",
        "outage_cv",
        "history_hours",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

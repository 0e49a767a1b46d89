"""Admin for price and availability history."""

from __future__ import annotations

from django.contrib import admin

from costs.models import AvailabilitySample, PriceSample


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

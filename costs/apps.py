from __future__ import annotations

from django.apps import AppConfig


class CostsConfig(AppConfig):
    name = "costs"
    verbose_name = "Costs"

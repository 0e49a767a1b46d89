from __future__ import annotations

from django.apps import AppConfig


class MigrationConfig(AppConfig):
    name = "migration"
    verbose_name = "Capacity and migration"

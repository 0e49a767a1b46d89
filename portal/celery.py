"""The Celery app: configured from Django settings (CELERY_*), tasks autodiscovered."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("baton")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

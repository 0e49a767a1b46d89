"""Baton's portal: settings, URLs, ASGI routing, the Celery app and the dashboard."""

from __future__ import annotations

from portal.celery import app as celery_app

__all__ = ["celery_app"]

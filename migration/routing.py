"""Websocket routes (DESIGN §9)."""

from __future__ import annotations

from django.urls import path

from migration.consumers import FleetConsumer, JobTimelineConsumer

websocket_urlpatterns = [
    path("ws/jobs/<int:job_id>/", JobTimelineConsumer.as_asgi()),
    path("ws/fleet/", FleetConsumer.as_asgi()),
]

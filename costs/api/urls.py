"""The cost engine's endpoints under /api/ besides estimates."""

from __future__ import annotations

from django.urls import path

from costs.api.replays import ReplayView

urlpatterns = [
    path("replays/", ReplayView.as_view(), name="replays"),
]

"""Pages of the cost engine under /costs/ besides the costs page itself."""

from __future__ import annotations

from django.urls import path

from costs.views import replay_page

urlpatterns = [
    path("replay/", replay_page, name="costs-replay"),
]

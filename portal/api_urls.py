"""The REST API under /api/ (DESIGN §9), its URL names in the `api` namespace (`api:job-detail`)."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from costs.api.views import EstimateView
from jobs.api.views import JobViewSet
from migration.api.agent import AgentEventsView, AgentLogsView
from migration.api.views import InstanceViewSet, PoolViewSet
from portal.api.views import TokenView, WsTicketView

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("pools", PoolViewSet, basename="pool")
router.register("instances", InstanceViewSet, basename="instance")

urlpatterns = [
    path("auth/token/", TokenView.as_view(), name="api-token"),
    path("auth/ws-ticket/", WsTicketView.as_view(), name="api-ws-ticket"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:api-schema"), name="api-docs"),
    path("estimates/", EstimateView.as_view(), name="estimates"),
    path("", include("costs.api.urls")),
    path("agent/events/", AgentEventsView.as_view(), name="agent-events"),
    path("agent/logs/", AgentLogsView.as_view(), name="agent-logs"),
    path("", include(router.urls)),
]

"""URL routes: the dashboard, auth, the admin, and the REST API under /api/."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from costs.views import costs_page
from portal import views
from portal.login import throttled_login

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("jobs/new/", views.job_new, name="job-new"),
    path("costs/", costs_page, name="costs"),
    path("costs/", include("costs.urls")),
    path("jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<int:job_id>/parts/", views.job_parts, name="job-parts"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("fleet/", views.fleet, name="fleet"),
    path("fleet/parts/", views.fleet_parts, name="fleet-parts"),
    path("fleet/interrupt/", views.fleet_interrupt, name="fleet-interrupt"),
    path("fleet/market/", views.fleet_market, name="fleet-market"),
    path("tokens/", views.api_tokens, name="api-tokens"),
    path("login/", throttled_login(auth_views.LoginView.as_view()), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The admin's login counts wrong passwords with the same limits as /login/.
    path("admin/login/", throttled_login(admin.site.login), name="admin-login"),
    path("admin/", admin.site.urls),
    # Namespaced: the router's names (`job-detail`, ...) would otherwise shadow the pages'.
    path("api/", include(("portal.api_urls", "api"))),
    # The metadata endpoint of local instances (IMDS paths; see migration/imds.py).
    path("imds/", include("migration.imds")),
]

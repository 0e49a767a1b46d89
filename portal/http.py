"""Typing help for views."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest


class AuthenticatedHttpRequest(HttpRequest):
    """A request that `login_required` has let through: its user is a real user."""

    user: User

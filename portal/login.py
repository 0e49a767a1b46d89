"""Login pages with the wrong-password limit of portal/throttling.py: Django's own login view
and the admin's, wrapped alike."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.shortcuts import render

from portal.throttling import login_blocked_for, record_login_failure

View = Callable[..., HttpResponseBase]


def throttled_login(view: View) -> View:
    """Answer 429 with Retry-After while the user name or address is blocked; count a POST
    that leaves the user logged out (the form shown again) as a wrong password."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        username = request.POST.get("username", "")
        wait = login_blocked_for(request, username)
        if wait:
            # An unbound form: a bound one would check the password when rendered.
            context = {"form": AuthenticationForm(request), "retry_after": wait}
            refused = render(request, "registration/login.html", context, status=429)
            refused["Retry-After"] = str(wait)
            return refused
        response = view(request, *args, **kwargs)
        if not request.user.is_authenticated:
            record_login_failure(request, username)
        return response

    return wrapper

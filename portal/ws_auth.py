"""Websocket authentication without a long-lived secret in the URL (decision 066).

Three ways in, tried in this order:
- `Authorization: Token <key>`: scripts, whose websocket clients can set headers;
- `?ticket=<ticket>`: a signed ticket from POST /api/auth/ws-ticket/, single use and valid for
  a few seconds, for clients that cannot set headers; a URL that lands in a log is useless;
- the session cookie (browsers), only from a page of this site: the Origin header must be
  this host (or one of CSRF_TRUSTED_ORIGINS), so a page on another port or site cannot open a
  websocket with the user's cookie (cross-site websocket hijacking).
A token or ticket that does not check out leaves the user anonymous (no fallback to the
session); the consumers refuse anonymous users before accepting.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth.models import AnonymousUser

from portal import tokens


def _header(scope: dict[str, Any], wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return bytes(value).decode("latin-1")
    return None


def _token_from_headers(scope: dict[str, Any]) -> str | None:
    kind, _, key = (_header(scope, b"authorization") or "").partition(" ")
    return key.strip() if kind.lower() == "token" and key.strip() else None


def _ticket_from_query(scope: dict[str, Any]) -> str | None:
    query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
    return query.get("ticket", [None])[0]


def same_origin(scope: dict[str, Any]) -> bool:
    """Whether the connection comes from a page of this site (the CSRF rule for cookies)."""
    origin = _header(scope, b"origin")
    host = _header(scope, b"host")
    if not origin:
        return False
    if host is None:
        # No Host header (an in-process test client; HTTP/1.1 servers always pass one): the
        # outer AllowedHostsOriginValidator has already matched the origin to ALLOWED_HOSTS.
        return True
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    return parts.scheme in {"http", "https"} and parts.netloc == host


@database_sync_to_async
def _user(key: str | None, ticket: str | None) -> Any:
    user = tokens.user_for_api_token(key) if key else tokens.user_for_ws_ticket(ticket or "")
    return user or AnonymousUser()


class TokenOrSessionAuthMiddleware:
    """Sets scope["user"] from a token header or a ticket when given, else from the session
    of a same-origin page, else anonymous."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_stack = AuthMiddlewareStack(inner)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        key, ticket = _token_from_headers(scope), _ticket_from_query(scope)
        if key or ticket:
            return await self.inner(dict(scope, user=await _user(key, ticket)), receive, send)
        if same_origin(scope):
            return await self.session_stack(scope, receive, send)
        return await self.inner(dict(scope, user=AnonymousUser()), receive, send)

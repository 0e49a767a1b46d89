"""Websocket authentication: the session cookie (browser) or an API token (scripts).

A token may come as `Authorization: Token <key>` or as `?token=<key>` (browsers cannot set
headers on a websocket). Anything else leaves the session user, possibly anonymous; the
consumers refuse anonymous users before accepting.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser


@database_sync_to_async
def _user_for_token(key: str) -> Any:
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return AnonymousUser()
    return token.user


def _token_from_scope(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            kind, _, key = value.decode("latin-1").partition(" ")
            if kind.lower() == "token" and key:
                return key.strip()
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return query.get("token", [None])[0]


class TokenOrSessionAuthMiddleware:
    """Sets scope["user"] from a token when one is given, else from the session."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_stack = AuthMiddlewareStack(inner)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        key = _token_from_scope(scope)
        if key:
            return await self.inner(dict(scope, user=await _user_for_token(key)), receive, send)
        return await self.session_stack(scope, receive, send)

"""API tokens and websocket tickets: issue, check, revoke (decisions 065 and 066).

A token's key is returned once and stored only as a hash; it expires after
BATON_TOKEN_DAYS unless its owner picks a shorter or longer life (at most a year) and can be
revoked from the token page or the admin. A websocket ticket is a signed, single-use pass valid
for BATON_WS_TICKET_SECONDS: a script or page puts it in the websocket URL instead of a
long-lived token, so access logs never hold anything worth stealing.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from portal.models import ApiToken

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# A user with more live tokens than this loses the oldest when a new one is made: a script
# that asks for a token on every run cannot grow the table without end.
MAX_LIVE_TOKENS_PER_USER = 50
# How stale last_used_at may get before a request writes it again (one write per minute, not
# one per request).
LAST_USED_RESOLUTION = timedelta(minutes=1)
WS_TICKET_SALT = "baton.ws-ticket"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # shown once; never stored


@transaction.atomic
def issue_api_token(user: User, name: str = "", days: int | None = None) -> IssuedToken:
    """A new token for `user`, valid `days` (BATON_TOKEN_DAYS by default)."""
    days = settings.BATON_TOKEN_DAYS if days is None else days
    if not 1 <= days <= settings.BATON_TOKEN_MAX_DAYS:
        raise ValueError(f"a token lives 1 to {settings.BATON_TOKEN_MAX_DAYS} days")
    key = secrets.token_urlsafe(32)
    now = timezone.now()
    token = ApiToken.objects.create(
        user=user,
        name=name[:100],
        key_hash=hash_key(key),
        prefix=key[:8],
        created_at=now,
        expires_at=now + timedelta(days=days),
    )
    surplus = (
        ApiToken.objects.live().filter(user=user).order_by("-created_at")[MAX_LIVE_TOKENS_PER_USER:]
    )
    ApiToken.objects.filter(pk__in=[t.pk for t in surplus]).update(revoked_at=now)
    return IssuedToken(token, key)


def user_for_api_token(key: str) -> Any | None:
    """The active user a live token belongs to, else None. Notes when it was last used."""
    token = ApiToken.objects.live().select_related("user").filter(key_hash=hash_key(key)).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


def revoke_api_token(user: User, token_id: int) -> bool:
    """Revoke one of `user`'s own tokens; False when there is no such live token."""
    updated = (
        ApiToken.objects.live().filter(pk=token_id, user=user).update(revoked_at=timezone.now())
    )
    return updated == 1


def issue_ws_ticket(user: User) -> str:
    """A signed ticket naming `user`, for one websocket connection in the next few seconds."""
    return signing.dumps({"u": user.pk, "n": secrets.token_urlsafe(12)}, salt=WS_TICKET_SALT)


def user_for_ws_ticket(ticket: str) -> Any | None:
    """The active user of a fresh, unused ticket, else None. A ticket works once."""
    try:
        data = signing.loads(ticket, salt=WS_TICKET_SALT, max_age=settings.BATON_WS_TICKET_SECONDS)
    except signing.BadSignature:  # also SignatureExpired
        return None
    if not (isinstance(data, dict) and isinstance(data.get("n"), str)):
        return None
    if not isinstance(data.get("u"), int):
        return None
    # cache.add is atomic: of two connections with one ticket, only the first gets in.
    if not cache.add(f"ws-ticket:{data['n']}", 1, timeout=settings.BATON_WS_TICKET_SECONDS * 2):
        return None
    return get_user_model().objects.filter(pk=data["u"], is_active=True).first()

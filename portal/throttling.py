"""Rate limits on guessing passwords: the login page and POST /api/auth/token/.

Wrong passwords are counted per user name and per client address in fixed windows of
BATON_LOGIN_WINDOW_SECONDS (in the cache, so every web process of the install shares them).
Past the limit, every attempt, right or wrong, is refused with 429 and `Retry-After` until
the window ends: a guesser learns nothing more, and the account's owner waits a few minutes.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest


@dataclass(frozen=True)
class _Counter:
    key: str
    limit: int


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded-for header is whatever the client says it is.
    return str(request.META.get("REMOTE_ADDR") or "unknown")


def _counters(username: str, address: str) -> list[_Counter]:
    window = int(time.time() // settings.BATON_LOGIN_WINDOW_SECONDS)
    # Hashed: user names and addresses do not show in the cache's keys.
    user = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    addr = hashlib.sha256(address.encode()).hexdigest()[:32]
    return [
        _Counter(f"login-failures:user:{user}:{window}", settings.BATON_LOGIN_FAILURES_PER_USER),
        _Counter(f"login-failures:addr:{addr}:{window}", settings.BATON_LOGIN_FAILURES_PER_ADDRESS),
    ]


def _seconds_left_in_window() -> int:
    window = settings.BATON_LOGIN_WINDOW_SECONDS
    return max(1, math.ceil(window - time.time() % window))


def login_blocked_for(request: HttpRequest, username: str) -> int:
    """Seconds until `username` may try again from this client; 0 when it may now."""
    counters = _counters(username, client_address(request))
    counts = cache.get_many([c.key for c in counters])
    if any(counts.get(c.key, 0) >= c.limit for c in counters):
        return _seconds_left_in_window()
    return 0


def record_login_failure(request: HttpRequest, username: str) -> None:
    for counter in _counters(username, client_address(request)):
        cache.add(counter.key, 0, timeout=settings.BATON_LOGIN_WINDOW_SECONDS)
        try:
            cache.incr(counter.key)
        except ValueError:  # expired between add and incr: start the new window at one
            cache.add(counter.key, 1, timeout=settings.BATON_LOGIN_WINDOW_SECONDS)

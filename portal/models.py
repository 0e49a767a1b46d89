"""API tokens: only a hash is stored; every token expires and can be revoked (decision 065)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def live(self) -> ApiTokenQuerySet:
        """Tokens that still authenticate: not revoked, not expired."""
        return self.filter(revoked_at__isnull=True, expires_at__gt=timezone.now())


class ApiToken(models.Model):
    """A token for `Authorization: Token <key>`. The key is shown once, when it is made; the
    database keeps its SHA-256 (the key is 256 random bits, so a fast hash is enough)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    # The key's first characters, so its owner can tell tokens apart; not enough to use it.
    prefix = models.CharField(max_length=8, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user}, {self.name or 'unnamed'})"

    @property
    def is_live(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()

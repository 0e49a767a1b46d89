"""Agent tokens: issued when an instance is launched, only their hash stored, revoked when the
instance is released (a stale agent cannot change a job it no longer runs)."""

from __future__ import annotations

import hashlib
import secrets

from migration.models import Instance


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_agent_token(instance: Instance) -> str:
    """A new secret for the instance's agent; only its hash is stored."""
    token = secrets.token_urlsafe(32)
    instance.agent_token_hash = token_hash(token)
    instance.save(update_fields=["agent_token_hash"])
    return token


def instance_for_token(token: str) -> Instance | None:
    return Instance.objects.filter(agent_token_hash=token_hash(token)).first()

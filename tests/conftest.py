"""Shared fixtures. Django-free tests (instance side, pure domain) need none of these."""

from __future__ import annotations

"""Errors raised by the checkpoint store and the SDK."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every checkpoint-store error."""


class StoreConfigError(StoreError, ValueError):
    """A store URL or setting that cannot work (bad scheme, missing bucket, ...)."""


class StoreUnavailable(StoreError):
    """The store could not be reached within the retry budget; nothing was committed."""


class ManifestNotFound(StoreError, LookupError):
    """The named manifest does not exist (never committed, or removed by gc)."""


class CorruptManifest(StoreError):
    """A manifest whose checksum or structure does not match its content."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"manifest {key} is corrupt: {reason}")
        self.key = key
        self.reason = reason


class CorruptChunk(StoreError):
    """A chunk that is missing, has the wrong size, or whose content does not hash to its name."""

    def __init__(self, chunk: str, reason: str, where: str = "") -> None:
        place = f" ({where})" if where else ""
        super().__init__(f"chunk {chunk}{place} is corrupt: {reason}")
        self.chunk = chunk
        self.reason = reason
        self.where = where


class SaveCancelled(StoreError):
    """A save was cancelled before its manifest was written; it is not visible in the store."""

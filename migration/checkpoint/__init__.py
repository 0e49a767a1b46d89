"""Checkpoint storage library and SDK (runs on the instance; never imports Django).

    from migration.checkpoint import open_store
    store = open_store("file:///var/stores/us-east-1/my-project")
    result = store.save("job-1", 100, {"model": {...}}, kind="periodic")
    restored = store.load(store.latest("job-1"))

See docs/instance-side.md for the contract and `sdk.Checkpointer` for training loops.
"""

from __future__ import annotations

from .directory import RestoreStats
from .errors import (
    CorruptChunk,
    CorruptManifest,
    ManifestNotFound,
    SaveCancelled,
    StoreConfigError,
    StoreError,
    StoreUnavailable,
)
from .local import LocalStore
from .manifest import EMERGENCY, FINAL, KINDS, PERIODIC, Manifest, ManifestRef
from .store import Checkpoint, CopyStats, GcStats, SaveResult, Store, VerifyStats
from .urls import open_store

__all__ = [
    "EMERGENCY",
    "FINAL",
    "KINDS",
    "PERIODIC",
    "Checkpoint",
    "CopyStats",
    "CorruptChunk",
    "CorruptManifest",
    "GcStats",
    "LocalStore",
    "Manifest",
    "ManifestNotFound",
    "ManifestRef",
    "RestoreStats",
    "SaveCancelled",
    "SaveResult",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreUnavailable",
    "VerifyStats",
    "open_store",
]

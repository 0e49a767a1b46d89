"""Chunk hashing: the content address and the checksum of every chunk are the same digest.

BLAKE3 was chosen by measurement (docs/decisions/001-chunk-hash.md): several times faster than
SHA-256 on the same core, so hashing never becomes the bottleneck of a save or a restore.
"""

from __future__ import annotations

import blake3

HASH_NAME = "blake3"
Hasher = blake3.blake3
DIGEST_HEX_LEN = 64


def digest(data: bytes | bytearray | memoryview) -> str:
    """The hex BLAKE3 digest of `data` (releases the GIL, so threads hash in parallel)."""
    return blake3.blake3(data).hexdigest()


def new_hasher() -> blake3.blake3:
    """An incremental hasher (`update`, then `hexdigest`) giving the same digest as `digest`."""
    return blake3.blake3()


def is_digest(text: str) -> bool:
    """True if `text` looks like a chunk name (64 lower-case hex characters)."""
    return len(text) == DIGEST_HEX_LEN and all(c in "0123456789abcdef" for c in text)

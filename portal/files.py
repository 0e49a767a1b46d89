"""Files in BATON_HOME that hold a secret: created readable by their owner only, from the start.

`os.open` with mode 0o600 and O_EXCL, so the file never exists with looser permissions, not
even for a moment (writing first and chmod-ing afterwards leaves a window where any local user
can read it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

PRIVATE_FILE_MODE = 0o600


def create_private_file(path: Path, content: str = "") -> bool:
    """Create `path` owner-only with `content`; False (and nothing written) if it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:
        file.write(content)
    return True


def private_text(path: Path, generate: Callable[[], str]) -> str:
    """The text kept in `path`, generated on first use into an owner-only file."""
    create_private_file(path, generate() + "\n")
    return path.read_text().strip()

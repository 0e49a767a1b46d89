"""Files holding a secret are their owner's only from the moment they exist, even when
`manage.py` runs on its own under a permissive umask; an older install's are tightened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from portal.files import create_private_file, private_text
from portal.launcher import make_private

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_settings_create_the_home_secret_key_and_database_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "DJANGO_"))}
    env.update(BATON_HOME=str(home), DJANGO_SETTINGS_MODULE="portal.settings")
    env.pop("DATABASE_URL", None)

    out = subprocess.run(
        [sys.executable, "-c", "import os; os.umask(0o022); import django; django.setup()"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert out.returncode == 0, out.stderr
    assert mode(home) == 0o700
    assert mode(home / "secret-key") == 0o600
    assert mode(home / "baton.sqlite3") == 0o600


def test_a_private_file_is_written_once_and_kept(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        first = private_text(tmp_path / "secret", lambda: "one")
        second = private_text(tmp_path / "secret", lambda: "two")
    finally:
        os.umask(old)

    assert first == second == "one"
    assert mode(tmp_path / "secret") == 0o600
    assert not create_private_file(tmp_path / "secret", "three")


def test_an_older_install_has_its_secret_files_tightened(tmp_path: Path) -> None:
    for name in ("secret-key", "demo-password", "baton.sqlite3"):
        (tmp_path / name).write_text("x")
        (tmp_path / name).chmod(0o644)
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "notes.txt").chmod(0o644)
    tmp_path.chmod(0o755)

    changed = make_private(tmp_path)

    assert sorted(changed) == sorted(
        ["secret-key", "demo-password", "baton.sqlite3", tmp_path.name]
    )
    assert {mode(tmp_path / n) for n in ("secret-key", "demo-password", "baton.sqlite3")} == {0o600}
    assert mode(tmp_path) == 0o700
    assert mode(tmp_path / "notes.txt") == 0o644  # not a secret: left as it was

"""The production settings the README documents pass `manage.py check --deploy` cleanly."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documented_production_environment() -> dict[str, str]:
    """The variables of the README's "Production settings" block, placeholders filled in."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Production settings", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None, "the README lost its production settings block"
    found = {}
    for line in block.group(1).splitlines():
        name, _, value = line.partition("=")
        found[name] = re.sub(r"<[^>]*>", lambda _: secrets.token_urlsafe(50), value)
    return found


def test_the_documented_production_settings_pass_the_deploy_check(tmp_path: Path) -> None:
    production = documented_production_environment()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("BATON_", "DJANGO_", "DATABASE_", "REDIS_"))
    }
    env.update(production, BATON_HOME=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings")

    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert {"DEBUG", "BATON_HTTPS", "DATABASE_URL", "REDIS_URL"} <= set(production)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues (0 silenced)." in out.stdout
    assert "WARNING" not in out.stdout + out.stderr

"""Settings from the environment fail loudly on bad values; Redis is found or embedded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from portal import embedded_redis
from portal.env import ConfigError, env_bool, env_float, env_int, env_list, env_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("yes", True), ("off", False), ("", False)]
)
def test_env_bool_reads_the_usual_spellings(monkeypatch: Any, raw: str, value: bool) -> None:
    monkeypatch.setenv("X", raw)
    assert env_bool("X") is value


@pytest.mark.parametrize(
    ("reader", "raw", "message"),
    [
        (lambda: env_bool("X"), "maybe", "not a boolean"),
        (lambda: env_int("X", 1), "ten", "not an integer"),
        (lambda: env_int("X", 1, minimum=1), "0", "at least 1"),
        (lambda: env_float("X", 1.0), "fast", "not a number"),
        (lambda: env_url("X", "redis://", ("redis",)), "http://x", "must start with"),
    ],
)
def test_a_bad_value_fails_loudly_naming_the_variable(
    monkeypatch: Any, reader: Any, raw: str, message: str
) -> None:
    monkeypatch.setenv("X", raw)
    with pytest.raises(ConfigError, match=message) as error:
        reader()
    assert "X=" in str(error.value)


def test_env_list_splits_on_commas(monkeypatch: Any) -> None:
    monkeypatch.setenv("X", "a.example, b.example,")
    assert env_list("X", []) == ["a.example", "b.example"]


def test_settings_refuse_a_bad_debug_value(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        DEBUG="perhaps",
        BATON_HOME=str(tmp_path),
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True
    )

    assert out.returncode != 0
    assert "DEBUG='perhaps' is not a boolean" in out.stderr


def test_sqlite_is_configured_for_concurrent_writers(tmp_path: Path) -> None:
    code = (
        "from django.db import connection; c = connection.cursor(); "
        "print(c.execute('PRAGMA journal_mode').fetchone()[0], "
        "connection.settings_dict['OPTIONS']['transaction_mode'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(BATON_HOME=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings")
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )

    assert out.stdout.split()[-2:] == ["wal", "IMMEDIATE"], out.stderr
    assert (tmp_path / "secret-key").stat().st_mode & 0o077 == 0


def test_an_embedded_redis_starts_when_none_answers(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setattr(
        embedded_redis, "DEFAULT_URL", f"redis://127.0.0.1:{embedded_redis.free_port()}/0"
    )

    url, proc = embedded_redis.resolve_redis(tmp_path)
    try:
        assert proc is not None
        client = redis.Redis.from_url(url)
        client.set("baton", "ok")
        assert client.get("baton") == b"ok"
    finally:
        assert proc is not None
        proc.terminate()
        proc.wait(10)


def test_an_explicit_redis_url_wins(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://example.invalid:6379/3")

    assert embedded_redis.resolve_redis(tmp_path) == ("redis://example.invalid:6379/3", None)

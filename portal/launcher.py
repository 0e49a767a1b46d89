"""`make run`: migrate, seed, and run the whole system until Ctrl-C or SIGTERM.

Starts an embedded Redis when REDIS_URL is unset and nothing answers on 127.0.0.1:6379, then
daphne (HTTP + websockets), a placement worker, a worker for replication and validation, and
Celery beat. Each child logs to BATON_HOME/logs/<name>.log. Stopping the launcher stops every
child; if one child dies, the launcher stops the rest and exits non-zero.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from migration.backends import localproc
from portal.embedded_redis import resolve_redis
from portal.env import ConfigError, env_int, env_path, env_str

logger = logging.getLogger("baton")

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
# What a local instance gets to checkpoint and exit when `make run` stops (its agent's grace
# period is 20 s), before its process group is killed.
INSTANCE_STOP_GRACE_S = 25.0
# Every file the install writes (database, secret key, demo password, logs, instance folders,
# checkpoints) is its owner's only, from the moment it is created; children inherit the mask.
PRIVATE_UMASK = 0o077
# Files of installs made before that, tightened at start: they hold secrets or sessions.
SECRET_FILES = (
    "secret-key",
    "demo-password",
    "baton.sqlite3",
    "baton.sqlite3-wal",
    "baton.sqlite3-shm",
)


def make_private(home: Path) -> list[str]:
    """Take group and other permissions off BATON_HOME and the secret files an older install
    left readable; returns what was changed."""
    changed = []
    for path in (home, *(home / name for name in SECRET_FILES)):
        with contextlib.suppress(FileNotFoundError):
            mode = path.stat().st_mode & 0o777
            if mode & 0o077:
                path.chmod(mode & 0o700)
                changed.append(path.name)
    return changed


def _die_with_parent() -> None:
    """Runs in each child before exec: receive SIGTERM if the launcher itself is killed."""
    # Not on Linux: children are still stopped on a normal shutdown.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setsid()


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None


class Launcher:
    def __init__(self) -> None:
        self.home = env_path("BATON_HOME", ROOT / "var")
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.port = env_int("PORT", 8000, minimum=1)
        self.bind = env_str("BATON_BIND", "127.0.0.1")
        self.logs = self.home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, BATON_HOME=str(self.home), PORT=str(self.port))
        self.env.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        self.children: list[Child] = []
        self.redis: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit(f"manage.py {' '.join(args)} failed (exit {out.returncode})")
        return out.stdout.strip()

    def start(self, name: str, argv: list[str]) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv,
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        self.children.append(Child(name, argv, proc))
        logger.info("started %s (pid %d), log in %s", name, proc.pid, self.logs / f"{name}.log")

    def wait_http(self, timeout: float = 60) -> bool:
        url = f"http://127.0.0.1:{self.port}/login/"
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.stopping:
            try:
                urllib.request.urlopen(url, timeout=2)
                return True
            except urllib.error.HTTPError:
                return True
            except OSError:
                time.sleep(0.3)
        return False

    def stop(self, *_: object) -> None:
        """Beat and the workers first, then every local instance, then the web server and
        Redis.

        The workers go before the instances: an instance that stops is a job that migrates,
        and a worker still up would place it and launch its next instances while we end them.
        The web server stays up: the agents report their emergency checkpoints to it (what a
        worker would do with those reports is queued for the next start)."""
        if self.stopping:
            return
        self.stopping = True
        logger.info("stopping...")
        web = [c for c in self.children if c.name == "web"]
        self._stop_children([c for c in self.children if c.name != "web"])
        instances = self.home / "instances"
        if localproc.members(instances):
            logger.info("stopping local instances (up to %.0f s)...", INSTANCE_STOP_GRACE_S)
        ended = localproc.end_all(instances, grace_s=INSTANCE_STOP_GRACE_S)
        if ended:
            logger.info("ended %d local instance(s): %s", len(ended), ", ".join(ended))
        self._stop_children(web)
        if self.redis and self.redis.poll() is None:
            self.redis.terminate()
            self.redis.wait(10)
        logger.info("stopped")

    def _stop_children(self, children: list[Child]) -> None:
        for child in reversed(children):
            if child.proc and child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGTERM)
        end = time.monotonic() + 15
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", child.name)
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()

    def run(self) -> int:
        tightened = make_private(self.home)
        if tightened:
            logger.info("made owner-only: %s", ", ".join(tightened))
        redis_url, self.redis = resolve_redis(self.home / "redis")
        self.env["REDIS_URL"] = redis_url
        logger.info("Redis: %s%s", redis_url, " (embedded)" if self.redis else "")
        self.manage("migrate", "--noinput", "-v0")
        seeded = self.manage("seed_demo").splitlines()
        logger.info(seeded[0])
        self.login = seeded[-1]
        self.manage("recover_instances")

        python = sys.executable
        celery = [python, "-m", "celery", "-A", "portal"]
        self.start(
            "web",
            [
                python,
                "-m",
                "daphne",
                "-b",
                self.bind,
                "-p",
                str(self.port),
                "portal.asgi:application",
            ],
        )
        self.start(
            "worker-placement",
            [
                *celery,
                "worker",
                "-n",
                "placement@%h",
                "-Q",
                "placement,default",
                "-c",
                "2",
                "-l",
                "INFO",
            ],
        )
        self.start(
            "worker-data",
            [
                *celery,
                "worker",
                "-n",
                "data@%h",
                "-Q",
                "replication,validation",
                "-c",
                "2",
                "-l",
                "INFO",
            ],
        )
        self.start(
            "beat", [*celery, "beat", "-l", "INFO", "-s", str(self.home / "celerybeat-schedule")]
        )

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        if not self.wait_http():
            if not self.stopping:
                logger.error("the web server did not answer; see %s", self.logs / "web.log")
                self.stop()
            return 1
        print(
            f"\n  Baton is running at http://{self.bind}:{self.port}/\n"
            f"  {self.login}\n"
            f"  API docs: http://{self.bind}:{self.port}/api/docs/   Admin: /admin/ "
            f"(manage.py createsuperuser)\n"
            f"  Logs: {self.logs}   Stop with Ctrl-C\n",
            flush=True,
        )
        while not self.stopping:
            for child in self.children:
                if child.proc and child.proc.poll() is not None and not self.stopping:
                    logger.error(
                        "%s exited with %s; see %s",
                        child.name,
                        child.proc.returncode,
                        self.logs / f"{child.name}.log",
                    )
                    self.stop()
                    return 1
            time.sleep(0.5)
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop()


def main() -> int:
    os.umask(PRIVATE_UMASK)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s baton: %(message)s")
    try:
        launcher = Launcher()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        return launcher.run()
    except BaseException:
        launcher.stop()
        raise


if __name__ == "__main__":
    sys.exit(main())

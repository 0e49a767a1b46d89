"""Shared fixtures: users and API clients, a small capacity catalogue, real Redis, a real
Celery worker. Django-free tests (instance side, pure domain) use none of these."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient

ROOT = Path(__file__).resolve().parent.parent

# CI explores the same examples on every run, so a landing never hangs on a new random draw;
# local runs keep exploring (and keep what they find in .hypothesis/).
hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    hypothesis_settings.load_profile("ci")


@pytest.fixture(autouse=True)
def own_stores(settings: Any, tmp_path: Path) -> None:
    """Checkpoint stores of the test's own (a worker it starts gets them too): job ids start
    again in every test, and a job must never find another test's checkpoints under its id."""
    settings.BATON_STORE_ROOT = tmp_path / "stores"


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    def make(username: str, staff: bool = False, perms: tuple[str, ...] = ()) -> Any:
        user = django_user_model.objects.create_user(username, f"{username}@example.com", "pw")
        user.is_staff = user.is_superuser = staff
        user.save()
        if perms:
            from django.contrib.auth.models import Permission

            for perm in perms:
                app, codename = perm.split(".")
                user.user_permissions.add(
                    Permission.objects.get(content_type__app_label=app, codename=codename)
                )
        return user

    return make


@pytest.fixture
def alice(make_user: Callable[..., Any]) -> Any:
    return make_user("alice")


@pytest.fixture
def bob(make_user: Callable[..., Any]) -> Any:
    return make_user("bob")


@pytest.fixture
def client_for() -> Callable[[Any], APIClient]:
    """An API client authenticated the way scripts do it: with a token."""

    def make(user: Any) -> APIClient:
        from portal.tokens import issue_api_token

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {issue_api_token(user).key}")
        return client

    return make


@pytest.fixture
def catalogue(db: None) -> dict[str, Any]:
    """A small catalogue: one region, T4/A10G/V100s, a few spot and on-demand pools."""
    from migration.models import Accelerator, CapacityPool, CompatibilityRule, Region

    region = Region.objects.create(code="us-east-1", name="US East")
    west = Region.objects.create(code="us-west-2", name="US West")
    acc = {
        name: Accelerator.objects.create(
            name=name, generation=gen, memory_gib=mem, compute_capability=cc, interconnect="pcie"
        )
        for name, gen, mem, cc in [
            ("T4", "Turing", 16, Decimal("7.5")),
            ("A10G", "Ampere", 24, Decimal("8.6")),
            ("V100-16GB", "Volta", 16, Decimal("7.0")),
            ("V100-32GB", "Volta", 32, Decimal("7.0")),
        ]
    }
    CompatibilityRule.objects.create(source=acc["T4"], target=acc["A10G"], kind="cross_generation")

    def pool(name: str, acc_name: str, market: str, price: str, **kw: Any) -> CapacityPool:
        defaults = {
            "region": region,
            "zone": "use1-az1" if market == "spot" else "",
            "gpus_per_instance": 1,
            "capacity": 3,
        }
        defaults.update(kw)
        return CapacityPool.objects.create(
            instance_type=name,
            accelerator=acc[acc_name],
            market=market,
            price_per_hour=Decimal(price),
            **defaults,
        )

    pools = {
        "t4_spot": pool("g4dn.xlarge", "T4", "spot", "0.16"),
        "t4_spot_west": pool("g4dn.xlarge", "T4", "spot", "0.20", region=west, zone="usw2-az1"),
        "t4_od": pool("g4dn.xlarge", "T4", "on_demand", "0.526"),
        "a10g_spot": pool("g5.xlarge", "A10G", "spot", "0.12", capacity=2),
        "v100_spot": pool("p3.2xlarge", "V100-16GB", "spot", "0.918", capacity=1),
        "v100_od": pool("p3.2xlarge", "V100-16GB", "on_demand", "3.06", capacity=1),
    }
    return {"region": region, "accelerators": acc, "pools": pools}


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `bench/<script>` as a user would, from the project root; its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def submit(owner: Any, catalogue: dict[str, Any], accelerator: str = "T4", **fields: Any) -> Any:
    """Submit an mlp_numpy job through the service, as the API would."""
    from jobs.services import submit_job

    fields.setdefault("total_steps", 100)
    return submit_job(
        owner,
        workload={"template": "mlp_numpy", "params": {}},
        accelerator=catalogue["accelerators"][accelerator],
        **fields,
    )


def placed_instance(owner: Any, catalogue: dict[str, Any], **fields: Any) -> Any:
    """The one instance of a job submitted and placed (not launched) for `owner`."""
    from migration.models import Instance
    from migration.services import place_job

    job = submit(owner, catalogue, **fields)
    place_job(job.pk)
    return Instance.objects.get(job=job)


def job_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "mnist",
        "workload": {"template": "mlp_numpy", "params": {"seed": 1}},
        "accelerator": "T4",
        "gpus_per_node": 1,
        "nodes": 1,
        "total_steps": 200,
        "checkpoint_every_steps": 20,
        "tolerance": "balanced",
    }
    body.update(overrides)
    return body


def remote_assets(html: str) -> list[str]:
    """Scripts, styles and images a page loads from another host (a CDN, say)."""
    found = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html, flags=re.IGNORECASE)
    return [url for url in found if re.match(r"(?:[a-z]+:)?//", url, flags=re.IGNORECASE)]


def wait_until(predicate: Callable[[], Any], timeout: float = 30, every: float = 0.2) -> Any:
    """Poll until `predicate` returns something truthy; fail with a clear message."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout} s")


@contextmanager
def running_worker(**extra_env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process on the test database and the test Redis."""
    name = settings.DATABASES["default"]["NAME"]
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="tests.settings",
        BATON_TEST_DATABASE_NAME=str(name),
        BATON_STORE_ROOT=str(settings.BATON_STORE_ROOT),
        **extra_env,
    )
    log = open(Path(settings.BATON_HOME) / "test-worker.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "worker",
            "-Q",
            "placement,default,replication,validation",
            "-c",
            "1",
            "-P",
            "solo",
            "-l",
            "INFO",
            "-n",
            f"test-{os.getpid()}-{time.monotonic_ns()}@%h",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def celery_worker(transactional_db: None) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process on the test database and the test Redis."""
    with running_worker() as proc:
        yield proc

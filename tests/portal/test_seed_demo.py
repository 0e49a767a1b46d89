"""`manage.py seed_demo` builds the demo catalogue from the shipped data, idempotently."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command

from migration.models import Accelerator, CapacityPool, CompatibilityRule, Region, RegionLatency

pytestmark = pytest.mark.django_db


@pytest.fixture
def seeded(monkeypatch: Any, settings: Any, tmp_path: Any) -> None:
    monkeypatch.setenv("BATON_DEMO_PASSWORD", "demo-pw-for-tests")
    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115


def test_it_is_idempotent(seeded: None) -> None:
    counts = (
        CapacityPool.objects.count(),
        CompatibilityRule.objects.count(),
        Region.objects.count(),
    )

    call_command("seed_demo", stdout=open("/dev/null", "w"))  # noqa: SIM115

    assert (
        CapacityPool.objects.count(),
        CompatibilityRule.objects.count(),
        Region.objects.count(),
    ) == counts


def test_it_seeds_three_regions_with_latencies_and_five_generations(seeded: None) -> None:
    assert list(Region.objects.values_list("code", flat=True)) == [
        "eu-west-1",
        "us-east-1",
        "us-west-2",
    ]
    assert RegionLatency.objects.count() == 6
    names = set(Accelerator.objects.values_list("name", flat=True))
    assert {"K80", "M60", "T4", "A10G", "V100-16GB", "V100-32GB", "A100-40GB"} <= names
    assert Accelerator.objects.values("generation").distinct().count() >= 5
    v100 = Accelerator.objects.get(name="V100-16GB")
    assert (v100.memory_gib, v100.compute_capability) == (16, Decimal("7.0"))


def test_it_seeds_the_rules_the_design_names(seeded: None) -> None:
    rules = {
        (r.source.name, r.target.name, r.kind, r.target_count)
        for r in CompatibilityRule.objects.select_related("source", "target")
    }
    assert {
        ("V100-16GB", "V100-32GB", "larger_memory", 1),
        ("T4", "A10G", "cross_generation", 1),
        ("V100-32GB", "V100-16GB", "model_parallel", 2),
        ("A10G", "T4", "model_parallel", 2),
    } <= rules
    for rule in CompatibilityRule.objects.all():
        rule.full_clean()


def test_the_first_spot_pool_listed_takes_three_one_gpu_jobs(
    seeded: None, alice: Any, client_for: Any
) -> None:
    pools = client_for(alice).get("/api/pools/").json()
    first_spot = next(p for p in pools if p["market"] == "spot")

    assert first_spot["gpus_per_instance"] == 1 and first_spot["free"] >= 3
    assert all(2 <= p["capacity"] <= 4 for p in pools)


def test_prices_come_from_the_snapshot_and_the_list(seeded: None) -> None:
    spot = CapacityPool.objects.get(zone="use1-az2", instance_type="p3.2xlarge", market="spot")
    us = CapacityPool.objects.get(
        region__code="us-east-1", instance_type="p3.2xlarge", market="on_demand"
    )
    on_demand = CapacityPool.objects.filter(market="on_demand")
    eu_over_us = [
        float(
            eu.price_per_hour
            / on_demand.get(region__code="us-east-1", instance_type=eu.instance_type).price_per_hour
        )
        for eu in on_demand.filter(region__code="eu-west-1")
        if on_demand.filter(region__code="us-east-1", instance_type=eu.instance_type).exists()
    ]

    assert spot.price_per_hour == Decimal("0.9180")
    assert us.price_per_hour == Decimal("3.0600")
    assert eu_over_us and all(1.08 <= ratio <= 1.12 for ratio in eu_over_us)


def test_interruption_rates_come_from_the_traces_with_a_default_elsewhere(
    seeded: None, settings: Any
) -> None:
    def rate(region: str, acc: str) -> float:
        pool = CapacityPool.objects.filter(
            region__code=region, accelerator__name=acc, market="spot"
        ).first()
        assert pool is not None, f"no spot pool of {acc} in {region}"
        return pool.interruption_rate_per_hour

    from tests.costs.test_history_import import DATA, independent_rate

    for region in ("us-east-1", "us-west-2"):
        files = sorted((DATA / "spot-traces").rglob(f"{region}*.json"))
        assert rate(region, "V100-16GB") == pytest.approx(independent_rate(files), abs=1e-4)
    assert rate("eu-west-1", "T4") == settings.BATON_DEFAULT_INTERRUPTION_RATE
    assert not CapacityPool.objects.filter(
        market="on_demand", interruption_rate_per_hour__gt=0
    ).exists()


def test_local_pools_have_short_windows_and_a_provisioning_delay(seeded: None) -> None:
    pool = CapacityPool.objects.filter(backend="local").first()

    assert pool is not None
    assert 0 < pool.advance_notice_s < pool.final_window_s < 120
    assert pool.provisioning_delay_s > 0


def test_the_demo_user_has_a_project_and_the_given_password(seeded: None) -> None:
    from django.contrib.auth import authenticate

    user = authenticate(username="demo", password="demo-pw-for-tests")

    assert user is not None
    assert user.projects.filter(slug="demo").exists()


def test_the_demo_password_is_generated_once_and_kept(
    monkeypatch: Any, settings: Any, tmp_path: Any
) -> None:
    from jobs.services import demo_password

    monkeypatch.delenv("BATON_DEMO_PASSWORD", raising=False)
    settings.BATON_DEMO_PASSWORD_FILE = tmp_path / "demo-password"

    first, second = demo_password(), demo_password()

    assert first == second and len(first) >= 12
    assert (tmp_path / "demo-password").stat().st_mode & 0o077 == 0

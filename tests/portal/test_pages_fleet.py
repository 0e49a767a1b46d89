"""The fleet page (staff): pools by accelerator and region with where their interruption rate
comes from, instances with their health and an Interrupt button, and the market simulator's
switch, which the beat tick obeys."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from costs.models import SpotPoolHistory
from migration import market_tick
from migration.models import Instance
from tests.conftest import placed_instance

pytestmark = pytest.mark.django_db


@pytest.fixture
def switch() -> Iterator[None]:
    """The simulator's switch and state cleared before and after (they live in Redis)."""
    store = market_tick.redis_client(settings.REDIS_URL)
    store.delete(market_tick.switch_key(), market_tick.state_key())
    yield
    store.delete(market_tick.switch_key(), market_tick.state_key())


def test_the_fleet_is_for_staff_only(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)

    assert client.get("/fleet/").status_code == 403
    assert client.get("/fleet/parts/").status_code == 403
    assert client.post("/fleet/market/", {"scale": "60.0"}).status_code == 403
    assert client.post("/fleet/interrupt/", {"instance": "1"}).status_code == 403
    assert "/fleet/" not in client.get("/").content.decode()


def test_the_fleet_groups_pools_and_says_where_rates_come_from(
    client: Any, catalogue: Any, make_user: Any, switch: None
) -> None:
    pools = catalogue["pools"]
    SpotPoolHistory.objects.create(
        pool=pools["t4_spot"], source="history", interruption_rate_per_hour=0.25
    )
    SpotPoolHistory.objects.create(
        pool=pools["v100_spot"],
        source="borrowed",
        interruption_rate_per_hour=0.5,
        borrowed_from=["V100-16GB in us-west-2"],
    )
    pools["t4_spot"].last_preempted_at = timezone.now() - timedelta(minutes=5)
    pools["t4_spot"].save()
    pools["a10g_spot"].last_preempted_at = timezone.now() - timedelta(seconds=20)
    pools["a10g_spot"].save()
    client.force_login(make_user("ops", staff=True))

    page = client.get("/fleet/").content.decode()

    assert "<strong>T4</strong>" in page and "<strong>V100-16GB</strong>" in page
    assert '<tr class="group"><th colspan="6">us-east-1</th></tr>' in page
    assert "0.250" in page and ">history</span>" in page
    assert ">borrowed</span>" in page and "V100-16GB in us-west-2" in page
    assert ">5\xa0minutes ago</time>" in page  # when the T4 spot pool last took one back
    assert re.search(r">2\d\xa0seconds ago</time>", page)  # the A10G's, 20 s ago: not "0 minutes"


def test_the_fleet_page_costs_a_fixed_number_of_queries(
    client: Any,
    catalogue: Any,
    alice: Any,
    make_user: Any,
    switch: None,
    django_assert_max_num_queries: Any,
) -> None:
    for _ in range(3):
        placed_instance(alice, catalogue)
    client.force_login(make_user("ops", staff=True))

    with django_assert_max_num_queries(8):
        client.get("/fleet/")


def test_the_interrupt_button_interrupts_a_running_instance(
    client: Any, catalogue: Any, alice: Any, make_user: Any, switch: None
) -> None:
    instance = placed_instance(alice, catalogue)
    Instance.objects.filter(pk=instance.pk).update(state="running")
    client.force_login(make_user("ops", staff=True))

    assert f'name="instance" value="{instance.pk}"' in client.get("/fleet/").content.decode()
    body = {"instance": str(instance.pk), "advance_notice_s": "5", "final_window_s": "20"}
    page = client.post("/fleet/interrupt/", body, follow=True).content.decode()

    instance.refresh_from_db()
    assert instance.advance_notice_at and instance.final_notice_at and instance.reclaim_at
    assert (instance.final_notice_at - instance.advance_notice_at).total_seconds() == 5
    assert (instance.reclaim_at - instance.final_notice_at).total_seconds() == 20
    assert f"Instance {instance.pk} of job {instance.job_id} interrupted" in page
    assert f'name="instance" value="{instance.pk}"' not in page  # under notice: no button
    again = client.post("/fleet/interrupt/", body, follow=True).content.decode()
    assert "not running" in again or "already" in again


def test_the_interrupt_button_refuses_a_bad_window(
    client: Any, catalogue: Any, alice: Any, make_user: Any, switch: None
) -> None:
    instance = placed_instance(alice, catalogue)
    Instance.objects.filter(pk=instance.pk).update(state="running")
    client.force_login(make_user("ops", staff=True))

    body = {"instance": str(instance.pk), "final_window_s": "-1"}
    page = client.post("/fleet/interrupt/", body, follow=True).content.decode()

    assert "Not interrupted: final_window_s" in page
    instance.refresh_from_db()
    assert instance.final_notice_at is None


def test_the_switch_turns_the_simulator_on_and_off_and_back_to_the_setting(
    client: Any, catalogue: Any, make_user: Any, switch: None, settings: Any
) -> None:
    settings.BATON_MARKET_TIME_SCALE = 0.0
    client.force_login(make_user("ops", staff=True))
    store = market_tick.redis_client(settings.REDIS_URL)

    assert market_tick.run_market_tick() == [] and store.get(market_tick.state_key()) is None
    client.post("/fleet/market/", {"scale": "600.0"})
    assert market_tick.time_scale() == 600.0
    assert "on · 600 simulated s per s" in client.get("/fleet/").content.decode()
    market_tick.run_market_tick()
    assert store.get(market_tick.state_key()) is not None  # the tick ran: its clock started

    store.delete(market_tick.state_key())
    client.post("/fleet/market/", {"scale": "off"})
    settings.BATON_MARKET_TIME_SCALE = 3600.0  # switched off here beats the setting
    assert market_tick.run_market_tick() == [] and store.get(market_tick.state_key()) is None
    client.post("/fleet/market/", {"scale": "setting"})
    assert market_tick.time_scale() == 3600.0
    client.post("/fleet/market/", {"scale": "1e308"})
    assert market_tick.time_scale() == 3600.0  # only the offered scales


def test_a_time_scale_must_be_a_sane_number(switch: None) -> None:
    for bad in (-1.0, float("nan"), float("inf"), 1e9):
        with pytest.raises(ValueError):
            market_tick.set_time_scale(bad)

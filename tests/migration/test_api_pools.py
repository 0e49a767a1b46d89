"""Pools are readable by every signed-in user, with their free capacity."""

from __future__ import annotations

from typing import Any

import pytest

from migration.models import Instance
from tests.conftest import remote_assets, submit

pytestmark = pytest.mark.django_db


def test_every_signed_in_user_reads_pools_with_free_capacity(
    catalogue: Any, alice: Any, client_for: Any
) -> None:

    pool = catalogue["pools"]["t4_spot"]
    job = submit(alice, catalogue)
    Instance.objects.create(job=job, pool=pool, state="running")
    Instance.objects.create(job=job, pool=pool, state="released")

    pools = client_for(alice).get("/api/pools/").json()

    listed = {p["id"]: p for p in pools}
    assert listed[pool.pk]["free"] == pool.capacity - 1
    assert {
        "id",
        "region",
        "zone",
        "instance_type",
        "accelerator",
        "gpus_per_instance",
        "market",
        "price_per_hour",
        "capacity",
        "free",
        "interruption_rate_per_hour",
    } <= set(listed[pool.pk])
    assert listed[pool.pk]["accelerator"] == "T4" and listed[pool.pk]["region"] == "us-east-1"


def test_pools_are_listed_cheapest_first_within_a_market(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    pools = client_for(alice).get("/api/pools/?market=spot").json()

    prices = [p["price_per_hour"] for p in pools]
    assert prices == sorted(prices) and len(prices) == 4


def test_anonymous_users_cannot_read_pools(catalogue: Any, client: Any) -> None:
    assert client.get("/api/pools/").status_code in (401, 403)


def test_instances_are_listed_only_for_visible_jobs(
    catalogue: Any, alice: Any, bob: Any, client_for: Any
) -> None:

    job = submit(alice, catalogue)
    instance = Instance.objects.create(job=job, pool=catalogue["pools"]["t4_spot"])

    mine = client_for(alice).get(f"/api/instances/?job={job.pk}").json()["results"]
    theirs = client_for(bob).get(f"/api/instances/?job={job.pk}").json()["results"]

    assert [i["id"] for i in mine] == [instance.pk]
    assert set(mine[0]) >= {
        "id",
        "job",
        "rank",
        "pool",
        "state",
        "awareness_abnormal",
        "last_heartbeat",
    }
    assert theirs == []


def test_the_openapi_schema_and_docs_are_served(alice: Any, client_for: Any) -> None:
    client = client_for(alice)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    docs = client.get("/api/docs/")

    assert schema.status_code == 200
    assert "/api/jobs/{id}/timeline/" in schema.json()["paths"]
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    assert remote_assets(docs.content.decode()) == []


def test_pools_show_figures_derived_from_history(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    from costs.models import PriceSample

    pool = catalogue["pools"]["v100_spot"]
    pool.interruption_rate_per_hour = 0.5
    pool.last_preempted_at = "2022-05-31T02:30:00Z"
    pool.save()
    for hour, price in ((1, "0.90"), (2, "1.00")):
        PriceSample.objects.create(pool=pool, at=f"2022-05-31T{hour:02}:00:00Z", price=price)

    listed = {p["id"]: p for p in client_for(alice).get("/api/pools/").json()}

    assert listed[pool.pk]["mean_price_per_hour"] == pytest.approx(0.95)
    assert listed[pool.pk]["mean_time_between_interruptions_hours"] == 2.0
    assert listed[catalogue["pools"]["t4_od"].pk]["mean_time_between_interruptions_hours"] is None
    assert listed[pool.pk]["last_preempted_at"] == "2022-05-31T02:30:00Z"
    assert listed[catalogue["pools"]["t4_od"].pk]["last_preempted_at"] is None


def test_a_pool_says_where_its_interruption_rate_comes_from(
    catalogue: Any, alice: Any, client_for: Any
) -> None:
    from costs.models import SpotPoolHistory

    pools = catalogue["pools"]
    borrowed = pools["t4_spot"]
    borrowed.interruption_rate_per_hour = 0.47
    borrowed.save()
    SpotPoolHistory.objects.create(
        pool=borrowed,
        source="borrowed",
        borrowed_from=["V100-16GB in us-east-1"],
        interruption_rate_per_hour=0.47,
    )
    by_hand = pools["a10g_spot"]
    SpotPoolHistory.objects.create(pool=by_hand, source="default", interruption_rate_per_hour=0.9)

    listed = {p["id"]: p for p in client_for(alice).get("/api/pools/").json()}

    assert listed[borrowed.pk]["interruption_rate_source"] == "borrowed"
    assert listed[borrowed.pk]["interruption_rate_borrowed_from"] == ["V100-16GB in us-east-1"]
    assert (
        listed[by_hand.pk]["interruption_rate_source"] == "pool"
    )  # its rate is not the derived one
    assert listed[pools["t4_od"].pk]["interruption_rate_source"] is None

"""The metadata endpoint of local instances speaks IMDSv2 and serves the notices on time; the
agent's own client reads them over HTTP."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core import signing
from django.test import Client
from django.utils import timezone

from migration.agent.metadata import MetadataClient
from migration.imds import metadata_key, metadata_url
from migration.models import Instance
from tests.conftest import placed_instance

TOKEN_TTL = {"HTTP_X_AWS_EC2_METADATA_TOKEN_TTL_SECONDS": "600"}


@pytest.fixture
def instance(catalogue: Any, alice: Any) -> Instance:
    return placed_instance(alice, catalogue)


def base(instance: Instance) -> str:
    return f"/imds/{instance.pk}/{metadata_key(instance.pk)}/latest"


def token(client: Client, instance: Instance) -> str:
    answer = client.put(f"{base(instance)}/api/token", **TOKEN_TTL)  # type: ignore[arg-type]
    assert answer.status_code == 200
    return answer.content.decode()


@pytest.mark.django_db
def test_a_get_without_a_token_is_refused(instance: Instance) -> None:
    answer = Client().get(f"{base(instance)}/meta-data/spot/instance-action")

    assert answer.status_code == 401


@pytest.mark.django_db
def test_a_wrong_key_or_another_instances_token_finds_nothing(
    instance: Instance, catalogue: Any, alice: Any
) -> None:
    client = Client()
    wrong = client.put(f"/imds/{instance.pk}/{'0' * 32}/latest/api/token", **TOKEN_TTL)  # type: ignore[arg-type]
    stranger = placed_instance(alice, catalogue)
    stolen = token(client, stranger)

    answer = client.get(
        f"{base(instance)}/meta-data/spot/instance-action",
        HTTP_X_AWS_EC2_METADATA_TOKEN=stolen,
    )

    assert wrong.status_code == 404
    assert answer.status_code == 401


@pytest.mark.django_db
def test_a_token_needs_a_valid_lifetime(instance: Instance) -> None:
    client = Client()
    for ttl in ("", "0", "21601", "soon", "\u00b2", "-5"):
        answer = client.put(
            f"{base(instance)}/api/token",
            HTTP_X_AWS_EC2_METADATA_TOKEN_TTL_SECONDS=ttl,
        )
        assert answer.status_code == 400, ttl


@pytest.mark.django_db
def test_notices_appear_at_their_times(instance: Instance) -> None:
    client = Client()
    headers = {"HTTP_X_AWS_EC2_METADATA_TOKEN": token(client, instance)}
    advance = f"{base(instance)}/meta-data/events/recommendations/rebalance"
    final = f"{base(instance)}/meta-data/spot/instance-action"
    assert client.get(advance, **headers).status_code == 404  # type: ignore[arg-type]
    assert client.get(final, **headers).status_code == 404  # type: ignore[arg-type]

    now = timezone.now()
    instance.advance_notice_at = now - timedelta(seconds=1)
    instance.final_notice_at = now + timedelta(seconds=60)
    instance.reclaim_at = now + timedelta(seconds=180)
    instance.save()
    assert client.get(advance, **headers).json()["noticeTime"].endswith("Z")  # type: ignore[arg-type]
    assert client.get(final, **headers).status_code == 404  # type: ignore[arg-type]

    Instance.objects.filter(pk=instance.pk).update(final_notice_at=now - timedelta(seconds=1))
    document = client.get(final, **headers).json()  # type: ignore[arg-type]
    assert document["action"] == "terminate"
    assert document["time"] == instance.reclaim_at.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.django_db
def test_a_token_stops_working_when_its_lifetime_is_over(instance: Instance) -> None:
    client = Client()
    answer = client.put(
        f"{base(instance)}/api/token", HTTP_X_AWS_EC2_METADATA_TOKEN_TTL_SECONDS="1"
    )
    headers = {"HTTP_X_AWS_EC2_METADATA_TOKEN": answer.content.decode()}
    final = f"{base(instance)}/meta-data/spot/instance-action"
    assert answer["X-aws-ec2-metadata-token-ttl-seconds"] == "1"
    assert client.get(final, **headers).status_code == 404  # type: ignore[arg-type]

    time.sleep(1.1)

    assert client.get(final, **headers).status_code == 401  # type: ignore[arg-type]


@pytest.mark.django_db
def test_an_unknown_instance_or_a_forged_token_finds_nothing(instance: Instance) -> None:
    client = Client()
    unknown = 10**9
    put = client.put(f"/imds/{unknown}/{metadata_key(unknown)}/latest/api/token", **TOKEN_TTL)  # type: ignore[arg-type]
    answer = client.get(
        f"/imds/{unknown}/{metadata_key(unknown)}/latest/meta-data/spot/instance-action",
        HTTP_X_AWS_EC2_METADATA_TOKEN=put.content.decode(),
    )
    forged = client.get(
        f"{base(instance)}/meta-data/spot/instance-action",
        HTTP_X_AWS_EC2_METADATA_TOKEN=signing.dumps(
            {"i": instance.pk, "exp": 2e9}, key="not-the-secret", salt="baton.imds.token"
        ),
    )

    assert answer.status_code == 404
    assert forged.status_code == 401


@pytest.mark.django_db
def test_an_instance_baton_has_ended_answers_the_final_notice(instance: Instance) -> None:
    client = Client()
    headers = {"HTTP_X_AWS_EC2_METADATA_TOKEN": token(client, instance)}
    ended = timezone.now()
    Instance.objects.filter(pk=instance.pk).update(state="released", ended_at=ended)

    document = client.get(f"{base(instance)}/meta-data/spot/instance-action", **headers).json()  # type: ignore[arg-type]

    assert document == {"action": "terminate", "time": ended.strftime("%Y-%m-%dT%H:%M:%SZ")}


@pytest.mark.django_db
def test_a_poll_costs_one_query(instance: Instance, django_assert_num_queries: Any) -> None:
    client = Client()
    headers = {"HTTP_X_AWS_EC2_METADATA_TOKEN": token(client, instance)}

    with django_assert_num_queries(1):
        client.get(f"{base(instance)}/meta-data/spot/instance-action", **headers)  # type: ignore[arg-type]
    with django_assert_num_queries(0):
        client.put(f"{base(instance)}/api/token", **TOKEN_TTL)  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_the_agents_own_client_reads_both_notices_over_http(
    live_server: Any, catalogue: Any, alice: Any, settings: Any
) -> None:
    settings.BATON_PUBLIC_URL = live_server.url
    instance = placed_instance(alice, catalogue)
    client = MetadataClient(metadata_url(instance.pk))
    assert client.advance_notice() is None
    assert client.final_notice(120) is None
    assert client.version == 2

    now = timezone.now()
    Instance.objects.filter(pk=instance.pk).update(
        advance_notice_at=now, final_notice_at=now, reclaim_at=now + timedelta(seconds=30)
    )

    advance = client.advance_notice()
    final = client.final_notice(120)
    assert advance is not None and final is not None
    assert final.deadline is not None
    assert abs((final.deadline - (now + timedelta(seconds=30))).total_seconds()) < 1

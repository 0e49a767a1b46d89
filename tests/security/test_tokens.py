"""API tokens: stored as hashes, expiring, revocable by their owner (page) and staff (admin)."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import ApiToken
from portal.tokens import issue_api_token

pytestmark = pytest.mark.django_db


# A refused token: DRF answers 403 when session auth comes first in the list (it has no
# WWW-Authenticate challenge to send), 401 otherwise.
REFUSED = (401, 403)


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_the_token_endpoint_keeps_its_shape_and_stores_only_a_hash(alice: Any) -> None:
    response = APIClient().post(
        "/api/auth/token/", {"username": "alice", "password": "pw"}, format="json"
    )

    assert response.status_code == 200
    key = response.json()["token"]
    assert bearer(key).get("/api/jobs/").status_code == 200
    stored = ApiToken.objects.get(user=alice)
    assert stored.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in {stored.key_hash, stored.prefix, stored.name}
    assert stored.expires_at > timezone.now() + timedelta(days=29)


def test_the_token_endpoint_answers_bad_bodies_with_field_errors(alice: Any) -> None:
    missing = APIClient().post("/api/auth/token/", {"username": "alice"}, format="json")
    wrong = APIClient().post(
        "/api/auth/token/", {"username": "alice", "password": "nope"}, format="json"
    )

    assert missing.status_code == 400 and "password" in missing.json()
    assert wrong.status_code == 400 and "non_field_errors" in wrong.json()


def test_an_expired_or_revoked_token_is_refused(alice: Any) -> None:
    expired, revoked = issue_api_token(alice), issue_api_token(alice)
    ApiToken.objects.filter(pk=expired.token.pk).update(expires_at=timezone.now())
    ApiToken.objects.filter(pk=revoked.token.pk).update(revoked_at=timezone.now())

    assert bearer(expired.key).get("/api/jobs/").status_code in REFUSED
    assert bearer(revoked.key).get("/api/jobs/").status_code in REFUSED


def test_a_token_of_an_inactive_user_is_refused(alice: Any) -> None:
    issued = issue_api_token(alice)
    alice.is_active = False
    alice.save()

    assert bearer(issued.key).get("/api/jobs/").status_code in REFUSED


def test_a_user_makes_a_token_on_the_page_sees_it_once_and_revokes_it(alice: Any) -> None:
    client = Client()
    client.force_login(alice)

    made = client.post("/tokens/", {"name": "laptop", "days": "7"})
    shown = re.search(r'<pre id="new-token">([^<]+)</pre>', made.content.decode())
    assert shown is not None
    key = shown.group(1)
    token = ApiToken.objects.get(user=alice)
    listed = client.get("/tokens/").content.decode()

    assert bearer(key).get("/api/jobs/").status_code == 200
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    assert "laptop" in listed and key not in listed
    client.post("/tokens/", {"revoke": str(token.pk)})
    assert bearer(key).get("/api/jobs/").status_code in REFUSED


def test_the_token_page_refuses_a_lifetime_out_of_bounds(alice: Any) -> None:
    client = Client()
    client.force_login(alice)

    response = client.post("/tokens/", {"name": "forever", "days": "100000"})

    assert response.status_code == 200 and "less than or equal to 365" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_nobody_revokes_another_users_token(alice: Any, bob: Any) -> None:
    issued = issue_api_token(alice)
    client = Client()
    client.force_login(bob)

    client.post("/tokens/", {"revoke": str(issued.token.pk)})

    assert bearer(issued.key).get("/api/jobs/").status_code == 200


def test_staff_revoke_tokens_in_the_admin_and_never_see_a_key(alice: Any, make_user: Any) -> None:
    issued = issue_api_token(alice)
    client = Client()
    client.force_login(make_user("root", staff=True))

    page = client.get(f"/admin/portal/apitoken/{issued.token.pk}/change/").content.decode()
    client.post(
        "/admin/portal/apitoken/",
        {"action": "revoke", "_selected_action": [str(issued.token.pk)]},
    )

    assert issued.key not in page and issued.token.key_hash not in page
    assert client.get("/admin/portal/apitoken/add/").status_code == 403
    assert bearer(issued.key).get("/api/jobs/").status_code in REFUSED


def test_a_user_with_too_many_tokens_loses_the_oldest(alice: Any) -> None:
    from portal.tokens import MAX_LIVE_TOKENS_PER_USER

    first = issue_api_token(alice)
    for _ in range(MAX_LIVE_TOKENS_PER_USER):
        issue_api_token(alice)

    assert ApiToken.objects.live().filter(user=alice).count() == MAX_LIVE_TOKENS_PER_USER
    assert bearer(first.key).get("/api/jobs/").status_code in REFUSED


@pytest.mark.django_db(transaction=True)
def test_plain_text_tokens_of_an_older_install_become_hashes(alice: Any) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("portal", "0001_api_tokens")])
    with connection.cursor() as cursor:  # the table DRF's authtoken app left behind
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created timestamp with time zone NOT NULL, user_id integer NOT NULL)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token VALUES (%s, %s, %s)",
            ["a" * 40, timezone.now(), alice.pk],
        )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert "authtoken_token" not in connection.introspection.table_names()
    assert bearer("a" * 40).get("/api/jobs/").status_code == 200

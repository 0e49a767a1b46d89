"""Guessing passwords: the login page and the token endpoint answer 429 with Retry-After."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_forty_wrong_passwords_on_the_login_page_get_a_429(alice: Any) -> None:
    client = Client()

    statuses = [
        client.post("/login/", {"username": "alice", "password": f"guess-{i}"}).status_code
        for i in range(40)
    ]
    blocked = client.post("/login/", {"username": "alice", "password": "pw"})

    assert statuses[:10] == [200] * 10  # the form again, with its error
    assert set(statuses[10:]) == {429}
    # Even the right password waits: the guesser learns nothing from the answer.
    assert blocked.status_code == 429 and "_auth_user_id" not in client.session
    assert 0 < int(blocked["Retry-After"]) <= 900
    assert "Too many wrong passwords" in blocked.content.decode()


def test_forty_wrong_passwords_on_the_token_endpoint_get_a_429(alice: Any) -> None:
    client = APIClient()

    responses = [
        client.post(
            "/api/auth/token/", {"username": "alice", "password": f"guess-{i}"}, format="json"
        )
        for i in range(40)
    ]

    assert [r.status_code for r in responses[:10]] == [400] * 10
    assert {r.status_code for r in responses[10:]} == {429}
    assert 0 < int(responses[-1]["Retry-After"]) <= 900


def test_wrong_passwords_for_many_names_from_one_address_get_a_429(db: None) -> None:
    client = Client()

    statuses = [
        client.post("/login/", {"username": f"user{i}", "password": "x"}).status_code
        for i in range(31)
    ]

    assert statuses[:30] == [200] * 30 and statuses[30] == 429


def test_other_users_log_in_while_one_name_is_blocked(alice: Any, bob: Any) -> None:
    guesser, owner = Client(), Client(REMOTE_ADDR="10.0.0.2")
    for i in range(11):
        guesser.post("/login/", {"username": "alice", "password": f"guess-{i}"})

    response = owner.post("/login/", {"username": "bob", "password": "pw"})

    assert response.status_code == 302 and "_auth_user_id" in owner.session


def test_the_token_endpoint_limits_requests_per_address(alice: Any) -> None:
    client = APIClient()

    statuses = [
        client.post(
            "/api/auth/token/", {"username": "alice", "password": "pw"}, format="json"
        ).status_code
        for _ in range(31)
    ]

    assert statuses[:30] == [200] * 30 and statuses[30] == 429


def test_the_admin_login_counts_wrong_passwords_too(make_user: Any) -> None:
    make_user("root", staff=True)
    client = Client()

    statuses = [
        client.post("/admin/login/", {"username": "root", "password": f"guess-{i}"}).status_code
        for i in range(12)
    ]
    blocked = client.post("/admin/login/", {"username": "root", "password": "pw"})

    assert statuses[:10] == [200] * 10 and set(statuses[10:]) == {429}
    assert blocked.status_code == 429 and "Retry-After" in blocked


def test_the_admin_login_still_logs_staff_in(make_user: Any) -> None:
    make_user("root", staff=True)
    client = Client()

    response = client.post("/admin/login/?next=/admin/", {"username": "root", "password": "pw"})

    assert response.status_code == 302 and client.get("/admin/").status_code == 200

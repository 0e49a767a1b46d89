"""Websocket authentication: a token header, a single-use ticket, or a same-origin session;
never a long-lived token in the URL, never a cookie sent by another site's page."""

from __future__ import annotations

import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client, override_settings
from rest_framework.test import APIClient

from portal.asgi import application
from portal.tokens import issue_api_token
from tests.conftest import submit
from tests.migration.test_consumers import end_refused

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SITE = "http://127.0.0.1:8000"


async def connects(path: str, *headers: tuple[bytes, bytes]) -> bool:
    communicator = WebsocketCommunicator(application, path, headers=list(headers))
    connected, _ = await communicator.connect(timeout=5)
    if connected:
        await communicator.disconnect()
    else:
        await end_refused(communicator)
    return bool(connected)


def origin(value: str = SITE) -> tuple[bytes, bytes]:
    return (b"origin", value.encode())


def host(value: str = "127.0.0.1:8000") -> tuple[bytes, bytes]:
    return (b"host", value.encode())


@database_sync_to_async
def session_cookie(user: Any) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())


@database_sync_to_async
def ticket_for(user: Any) -> str:
    client = APIClient()
    client.force_authenticate(user)
    response = client.post("/api/auth/ws-ticket/")
    assert response.status_code == 201 and response.json()["expires_in"] == 30
    return str(response.json()["ticket"])


@database_sync_to_async
def token_for(user: Any) -> str:
    return issue_api_token(user).key


@database_sync_to_async
def job_of(user: Any, catalogue: Any) -> int:
    return int(submit(user, catalogue).pk)


async def test_a_token_header_authenticates(catalogue: Any, alice: Any) -> None:
    job, key = await job_of(alice, catalogue), await token_for(alice)

    ok = await connects(f"/ws/jobs/{job}/", origin(), (b"authorization", f"Token {key}".encode()))
    bad = await connects(f"/ws/jobs/{job}/", origin(), (b"authorization", b"Token nope"))

    assert ok and not bad


async def test_a_token_in_the_url_is_refused(catalogue: Any, alice: Any) -> None:
    job, key = await job_of(alice, catalogue), await token_for(alice)

    assert not await connects(f"/ws/jobs/{job}/?token={key}", origin())


async def test_a_ticket_works_once(catalogue: Any, alice: Any) -> None:
    job, ticket = await job_of(alice, catalogue), await ticket_for(alice)

    first = await connects(f"/ws/jobs/{job}/?ticket={ticket}", origin())
    again = await connects(f"/ws/jobs/{job}/?ticket={ticket}", origin())

    assert first and not again


async def test_a_ticket_expires(catalogue: Any, alice: Any) -> None:
    job, ticket = await job_of(alice, catalogue), await ticket_for(alice)

    with override_settings(BATON_WS_TICKET_SECONDS=1):
        time.sleep(2)
        assert not await connects(f"/ws/jobs/{job}/?ticket={ticket}", origin())


async def test_a_forged_ticket_is_refused(catalogue: Any, alice: Any) -> None:
    job = await job_of(alice, catalogue)
    ticket = await ticket_for(alice)
    forged = ticket[:-4] + ("AAAA" if not ticket.endswith("AAAA") else "BBBB")

    assert not await connects(f"/ws/jobs/{job}/?ticket={forged}", origin())


async def test_a_ticket_does_not_open_another_users_job(
    catalogue: Any, alice: Any, bob: Any
) -> None:
    job, ticket = await job_of(alice, catalogue), await ticket_for(bob)

    assert not await connects(f"/ws/jobs/{job}/?ticket={ticket}", origin())


async def test_a_ticket_needs_a_login(db: None) -> None:
    response = await database_sync_to_async(APIClient().post)("/api/auth/ws-ticket/")

    assert response.status_code in (401, 403)


async def test_the_session_works_only_from_a_page_of_this_site(catalogue: Any, alice: Any) -> None:
    job, cookie = await job_of(alice, catalogue), await session_cookie(alice)

    same_site = await connects(f"/ws/jobs/{job}/", origin(), host(), cookie)
    other_port = await connects(f"/ws/jobs/{job}/", origin("http://127.0.0.1:9999"), host(), cookie)
    no_origin = await connects(f"/ws/jobs/{job}/", host(), cookie)

    assert same_site and not other_port and not no_origin

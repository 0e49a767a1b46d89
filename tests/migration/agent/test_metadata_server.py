"""The rehearsal's metadata endpoint answers as the portal's does, read by the agent's client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from migration.agent import httpjson
from migration.agent.metadata import FINAL_PATH, TOKEN_PATH, MetadataClient
from migration.agent.metadata_server import MetadataServer


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    endpoint = MetadataServer().start()
    yield endpoint
    endpoint.stop()


def test_no_notice_until_one_is_posted_then_both_levels_read_over_imdsv2(
    server: MetadataServer,
) -> None:
    client = MetadataClient(server.url)
    assert client.advance_notice() is None
    assert client.final_notice() is None
    assert client.version == 2

    now = datetime.now(UTC)
    server.notify(now, now, now + timedelta(seconds=30))
    advance, final = client.advance_notice(), client.final_notice()

    assert advance is not None and final is not None
    assert final.deadline is not None
    assert abs((final.deadline - now).total_seconds() - 30) < 1.5


def test_a_read_without_a_token_or_with_a_bad_ttl_is_refused(server: MetadataServer) -> None:
    bare = httpjson.request(server.url + FINAL_PATH, method="GET", headers={}, timeout=2)
    bad_ttl = httpjson.request(
        server.url + TOKEN_PATH,
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": "0"},
        timeout=2,
    )

    assert bare.status == 401
    assert bad_ttl.status == 400

"""The metadata client: IMDSv2 tokens when offered, IMDSv1 otherwise, both notice levels."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from migration.agent.metadata import (
    FINAL_PATH,
    TOKEN_HEADER,
    TOKEN_TTL_HEADER,
    MetadataClient,
    MetadataError,
)
from tests.migration.agent.conftest import FakeMetadata, iso_in


@pytest.fixture
def imdsv2_only() -> Iterator[FakeMetadata]:
    server = FakeMetadata(require_token=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def imdsv1_only() -> Iterator[FakeMetadata]:
    server = FakeMetadata(token_support=False)
    server.start()
    yield server
    server.stop()


def test_no_notice_is_a_404(metadata: FakeMetadata) -> None:
    client = MetadataClient(metadata.url)
    assert client.advance_notice() is None
    assert client.final_notice() is None


def test_it_reads_both_notice_levels(metadata: FakeMetadata) -> None:
    client = MetadataClient(metadata.url)
    metadata.notice_advance()
    metadata.final = {"action": "terminate", "time": "2030-01-02T03:04:05Z"}
    advance = client.advance_notice()
    final = client.final_notice()
    assert advance is not None and advance.level == "advance"
    assert metadata.advance is not None
    assert advance.notice_time == metadata.advance["noticeTime"]
    assert final is not None and final.level == "final" and final.source == "imds"
    assert final.deadline == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert final.event()["deadline"] == "2030-01-02T03:04:05+00:00"


def test_a_final_notice_without_a_readable_time_gets_the_default_window(
    metadata: FakeMetadata,
) -> None:
    metadata.final = {"action": "stop"}
    notice = MetadataClient(metadata.url).final_notice(default_window=120)
    assert notice is not None and notice.deadline is not None
    seconds = (notice.deadline - datetime.now(UTC)).total_seconds()
    assert 100 < seconds <= 120


def test_it_uses_an_imdsv2_token_on_every_read(imdsv2_only: FakeMetadata) -> None:
    client = MetadataClient(imdsv2_only.url)
    imdsv2_only.final = {"action": "terminate", "time": iso_in(60)}
    assert client.final_notice() is not None
    assert client.advance_notice() is None
    assert client.version == 2
    puts = [r for r in imdsv2_only.requests if r[0] == "PUT"]
    gets = [r for r in imdsv2_only.requests if r[0] == "GET"]
    assert len(puts) == 1
    assert puts[0][1] == "/latest/api/token"
    assert int(puts[0][2][TOKEN_TTL_HEADER.lower()]) > 0
    assert [g[2].get(TOKEN_HEADER.lower()) for g in gets] == ["token-1", "token-1"]


def test_it_gets_a_new_token_when_the_old_one_is_refused(imdsv2_only: FakeMetadata) -> None:
    client = MetadataClient(imdsv2_only.url)
    assert client.final_notice() is None
    imdsv2_only.tokens.clear()  # the endpoint forgets every token, as after an expiry
    assert client.final_notice() is None
    gets = [r[2].get(TOKEN_HEADER.lower()) for r in imdsv2_only.requests if r[0] == "GET"]
    assert gets == ["token-1", "token-1", "token-1"]
    assert imdsv2_only.tokens == ["token-1"]  # the fresh token (numbered again from 1)


def test_it_falls_back_to_imdsv1_when_tokens_are_not_supported(imdsv1_only: FakeMetadata) -> None:
    client = MetadataClient(imdsv1_only.url)
    imdsv1_only.final = {"action": "terminate", "time": iso_in(60)}
    assert client.final_notice() is not None
    assert client.final_notice() is not None
    assert client.version == 1
    puts = [r for r in imdsv1_only.requests if r[0] == "PUT"]
    gets = [r for r in imdsv1_only.requests if r[0] == "GET" and r[1] == FINAL_PATH]
    assert len(puts) == 1  # asked once, then remembered
    assert all(TOKEN_HEADER.lower() not in g[2] for g in gets)


def test_an_unreachable_endpoint_is_an_error() -> None:
    client = MetadataClient("http://127.0.0.1:9", timeout=1)
    with pytest.raises(MetadataError):
        client.final_notice()


def test_a_server_error_is_an_error(metadata: FakeMetadata) -> None:
    metadata.always_fail = True
    with pytest.raises(MetadataError, match="500"):
        MetadataClient(metadata.url).advance_notice()

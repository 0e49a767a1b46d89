"""Lists answer any `limit` and `offset` a client sends with a page, never a server error."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import job_body

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("query", ["limit=9223372036854775808", "offset=9223372036854775808"])
def test_a_huge_limit_or_offset_is_a_page(
    query: str, alice: Any, client_for: Any, catalogue: Any
) -> None:
    client = client_for(alice)
    assert client.post("/api/jobs/", job_body(), format="json").status_code == 201

    answer = client.get(f"/api/jobs/?{query}")

    assert answer.status_code == 200
    body = answer.json()
    assert body["count"] == 1
    assert len(body["results"]) == (0 if query.startswith("offset") else 1)

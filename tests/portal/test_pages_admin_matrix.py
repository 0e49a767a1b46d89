"""The compatibility matrix in the admin as a read-only grid: which card may run a job written
for which, linked to each rule; the list links to it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from migration.models import CompatibilityRule

pytestmark = pytest.mark.django_db


def test_the_grid_shows_which_card_may_replace_which(
    client: Any, catalogue: Any, make_user: Any, django_assert_max_num_queries: Any
) -> None:
    acc = catalogue["accelerators"]
    off = CompatibilityRule.objects.create(
        source=acc["V100-32GB"],
        target=acc["V100-16GB"],
        kind="model_parallel",
        target_count=2,
        enabled=False,
    )
    client.force_login(make_user("root", staff=True))

    assert (
        "/admin/migration/compatibilityrule/matrix/"
        in client.get("/admin/migration/compatibilityrule/").content.decode()
    )
    with django_assert_max_num_queries(8):
        page = client.get("/admin/migration/compatibilityrule/matrix/").content.decode()

    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r'class="row"><a [^>]*>([^<]+)</a></th>(.*?)</tr>', page, re.S)
    }
    assert set(rows) == set(acc)
    assert re.search(r'<td class="allowed"><a [^>]*>X</a></td>', rows["T4"])  # T4 -> A10G
    disabled = r'<td class="disabled"><a [^>]*class="off"[^>]*>P\u00d72</a>'
    assert re.search(disabled, rows["V100-32GB"])
    assert f"/admin/migration/compatibilityrule/{off.pk}/change/" in rows["V100-32GB"]
    assert rows["T4"].count('class="self"') == 1


def test_the_grid_is_for_staff(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)

    response = client.get("/admin/migration/compatibilityrule/matrix/")

    assert response.status_code == 302 and "/admin/login/" in response["Location"]

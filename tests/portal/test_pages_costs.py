"""The costs page's price history: a real series per pool (every recorded sample, the last
price held to the newest sample of any pool, dotted) and, while the history is a snapshot,
how to record more; and no field labelled like a variable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from costs.charts import PriceSeries, price_history

T0 = datetime(2026, 1, 10, tzinfo=UTC)


def series(label: str, *prices: float, start_day: int = 0) -> PriceSeries:
    days = [T0 + timedelta(days=start_day + n) for n in range(len(prices))]
    return PriceSeries(label, days, prices)


def test_each_pool_is_a_series_through_its_samples_held_to_the_newest() -> None:
    figure = price_history([series("a", 0.3, 0.4, 0.35), series("b", 1.0, 1.1, 0.9, 1.2)])

    drawn = [t for t in figure["data"] if t.get("showlegend") is not False]
    held = [t for t in figure["data"] if t.get("showlegend") is False]
    assert [t["name"] for t in drawn] == ["a", "b"]
    assert [len(t["x"]) for t in drawn] == [3, 4]  # every sample, not one dot per pool
    (carried,) = held  # only "a" ends before the newest sample
    assert list(carried["y"]) == [0.35, 0.35] and carried["line"]["dash"] == "dot"
    assert carried["x"][-1] == T0 + timedelta(days=3)
    assert carried["line"]["color"] == drawn[0]["line"]["color"]
    assert "snapshot" not in figure["layout"]["title"]["text"]


def test_a_snapshot_says_it_is_one_and_how_to_record_more() -> None:
    figure = price_history([series("a", 0.3), series("b", 1.0, 1.2, start_day=1)])

    title = figure["layout"]["title"]["text"]
    assert "snapshot" in title and "import_spot_prices" in title


@pytest.mark.django_db
def test_the_costs_page_labels_its_fields_in_words(client: Any, catalogue: Any, alice: Any) -> None:
    client.force_login(alice)

    page = client.get("/costs/").content.decode()

    assert "Checkpoint size (GB)" in page and "Checkpoint gb" not in page

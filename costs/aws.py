"""Spot prices from AWS (`describe_spot_price_history` through boto3). No Django here.

AWS names zones per account (us-east-1a); pools are keyed by the zone *id* (use1-az6), which
is the same for everyone, so each answer is mapped through `describe_availability_zones`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import boto3

from costs.history import PriceRow

PRODUCT = "Linux/UNIX"


def credentials_configured() -> bool:
    """True when boto3 finds AWS credentials (environment, profile or instance role)."""
    return boto3.Session().get_credentials() is not None


def fetch_spot_prices(
    region: str,
    instance_types: list[str],
    since: datetime | None = None,
    endpoint_url: str | None = None,
) -> list[PriceRow]:
    """Spot price observations of `instance_types` in `region` since `since` (default: a day)."""
    client: Any = boto3.client("ec2", region_name=region, endpoint_url=endpoint_url or None)
    zone_ids = {
        zone["ZoneName"]: zone["ZoneId"]
        for zone in client.describe_availability_zones()["AvailabilityZones"]
    }
    start = since or datetime.now(UTC) - timedelta(days=1)
    rows: list[PriceRow] = []
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types, ProductDescriptions=[PRODUCT], StartTime=start
    )
    for page in pages:
        for item in page["SpotPriceHistory"]:
            zone = zone_ids.get(item["AvailabilityZone"])
            if zone is None:
                continue
            at = item["Timestamp"]
            rows.append(
                PriceRow(
                    zone,
                    item["InstanceType"],
                    Decimal(item["SpotPrice"]),
                    at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC),
                )
            )
    return rows

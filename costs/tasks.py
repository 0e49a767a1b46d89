"""Celery edges of the cost history."""

from __future__ import annotations

import logging

from celery import shared_task

from costs import services

logger = logging.getLogger(__name__)


@shared_task(acks_late=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=3)
def refresh_spot_prices_task() -> str:
    """Pull recent spot prices from AWS when credentials are configured (beat, hourly)."""
    outcome = services.refresh_spot_prices_from_aws()
    logger.info("spot price refresh: %s", outcome)
    return outcome

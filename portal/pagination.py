"""List endpoints' pages: `?limit=&offset=` as DRF's, with bounds, so no number a client sends
reaches the database as an integer it cannot hold."""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

MAX_LIMIT = 500
# Far beyond any list here, and within a signed 64-bit integer on every database.
MAX_OFFSET = 2**31 - 1


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_offset(self, request: Request) -> int:
        return min(super().get_offset(request), MAX_OFFSET)

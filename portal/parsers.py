"""The API's JSON parser: a body nested deeper than any Baton request needs is a 400.

json.loads raises RecursionError (a 500) near 1,000 levels, and a body just under that still
makes later steps (validation, copying, rendering) recurse as deep; no request of the API
nests more than a few levels. (DRF already refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE.)
"""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError

MAX_JSON_DEPTH = 32


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether lists and objects in `value` nest deeper than `limit` (iterative: no
    recursion of our own)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in children)
    return False


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
        else:
            if not json_depth_exceeds(data, MAX_JSON_DEPTH):
                return data
        raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels")

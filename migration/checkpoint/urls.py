"""Opening a store from a URL: `file:///path` or `s3://bucket/prefix`."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import StoreConfigError
from .store import Store

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_FORMS = "file:///absolute/path or s3://bucket/prefix"


def open_store(url: str | None = None, *, endpoint: str | None = None, **options: Any) -> Store:
    """Open the store at `url` (default: $BATON_STORE_URL).

    For S3 the endpoint defaults to $BATON_S3_ENDPOINT (unset: AWS itself) and credentials
    come from the usual AWS environment. `options` go to the store (chunk_size, workers, ...).
    Raises StoreConfigError with the accepted forms when the URL cannot work.
    """
    if url is None:
        url = os.environ.get("BATON_STORE_URL", "").strip()
        if not url:
            raise StoreConfigError(f"no store configured: set BATON_STORE_URL to {_FORMS}")
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise StoreConfigError(f"store URL {url!r} must not have a query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StoreConfigError(
                f"store URL {url!r} names host {parts.netloc!r}; a file store URL has three "
                "slashes: file:///absolute/path"
            )
        path = unquote(parts.path)
        if not path.startswith("/") or path == "/":
            raise StoreConfigError(f"store URL {url!r} needs an absolute folder: file:///path")
        from .local import LocalStore

        return LocalStore(path, **options)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not _BUCKET_RE.match(bucket) or ".." in bucket:
            raise StoreConfigError(
                f"store URL {url!r}: {bucket!r} is not a valid bucket name "
                "(3-63 lower-case letters, digits, '.' or '-')"
            )
        endpoint = endpoint or os.environ.get("BATON_S3_ENDPOINT") or None
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise StoreConfigError(f"S3 endpoint {endpoint!r} must start with http:// or https://")
        from .s3 import S3Store

        return S3Store(bucket, unquote(parts.path).strip("/"), endpoint=endpoint, **options)
    raise StoreConfigError(f"store URL {url!r} is not supported; use {_FORMS}")

"""Where each region's checkpoints live.

A folder per region under BATON_STORE_ROOT by default; the URL BATON_REGION_STORES names for a
region otherwise (an S3 bucket and prefix with its endpoint, or another folder). Every job's
checkpoints sit inside its project's namespace of that store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings

from migration.checkpoint import Store, open_store

# What an instance needs to reach an S3 store besides its URL (an EC2 instance would have a
# role instead; a local instance gets the portal's own credentials, and only for S3).
_S3_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass(frozen=True)
class RegionStore:
    """One region's checkpoint store, inside one project's namespace."""

    region: str
    url: str
    endpoint: str | None

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    @property
    def never_made(self) -> bool:
        """True for a store in a local folder that does not exist (opening one creates it)."""
        parts = urlsplit(self.url)
        return parts.scheme == "file" and not Path(unquote(parts.path)).exists()

    def open(self, **options: Any) -> Store:
        return open_store(self.url, endpoint=self.endpoint, **options)

    def environ(self) -> dict[str, str]:
        """The variables an instance reads this store with (DESIGN §5)."""
        environ = {"BATON_STORE_URL": self.url}
        if self.is_s3:
            if self.endpoint:
                environ["BATON_S3_ENDPOINT"] = self.endpoint
            environ.update({k: os.environ[k] for k in _S3_CREDENTIALS if os.environ.get(k)})
            environ["AWS_DEFAULT_REGION"] = os.environ.get("AWS_DEFAULT_REGION", self.region)
        return environ


def region_store(region: str, project: str) -> RegionStore:
    """The store of `region`, inside the namespace of `project` (a slug)."""
    base = settings.BATON_REGION_STORES.get(region)
    if base is None:
        url = (settings.BATON_STORE_ROOT / region / project).as_uri()
    else:
        url = f"{base}/{project}"
    endpoint = (
        settings.BATON_REGION_S3_ENDPOINTS.get(region) or settings.BATON_S3_ENDPOINT or None
        if url.startswith("s3://")
        else None
    )
    return RegionStore(region=region, url=url, endpoint=endpoint)

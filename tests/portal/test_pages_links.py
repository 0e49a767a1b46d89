"""Every link on every page opens a page: the portal's pages are crawled as a user and as
staff, and each link must answer 200 with HTML (a job's link once opened the JSON API, its
page's URL name shadowed by the router's)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from tests.conftest import submit

pytestmark = pytest.mark.django_db


class LinkParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links.append(href)


def links_of(html: str) -> list[str]:
    parser = LinkParser()
    parser.feed(html)
    return parser.links


def crawl(client: Any, start: str = "/") -> dict[str, list[str]]:
    """Pages reached from `start` through links, with the links of each. The admin and the API
    docs are opened but not crawled further (they are Django's and drf-spectacular's)."""
    seen: dict[str, list[str]] = {}
    queue = [start]
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        response = client.get(url)
        assert response.status_code == 200, f"{url} answered {response.status_code}"
        assert response["Content-Type"].startswith("text/html"), f"{url} is not a page"
        found = []
        for href in links_of(response.content.decode()):
            parts = urlsplit(urljoin(url, href))
            if parts.scheme or parts.netloc or not parts.path:
                assert not parts.netloc or parts.netloc == "testserver", f"{href} leaves the site"
                if parts.netloc != "testserver":
                    continue
            found.append(parts.path + (f"?{parts.query}" if parts.query else ""))
        seen[url] = found
        if url.startswith(("/admin/", "/api/")):
            seen[url] = []
            continue
        queue.extend(link for link in found if link not in seen)
    return seen


def test_every_link_on_every_page_opens_a_page_for_a_user(
    client: Any, catalogue: Any, alice: Any
) -> None:
    job = submit(alice, catalogue, name="linked")
    client.force_login(alice)

    pages = crawl(client)

    assert f"/jobs/{job.pk}/" in pages["/"]  # the page, not /api/jobs/<id>/
    assert {"/jobs/new/", "/costs/", f"/jobs/{job.pk}/"} <= set(pages)
    assert not any(url.startswith("/admin/") for url in pages)


def test_every_link_on_every_page_opens_a_page_for_staff(
    client: Any, catalogue: Any, alice: Any, make_user: Any
) -> None:
    submit(alice, catalogue, name="someone-elses")
    client.force_login(make_user("ops", staff=True))

    pages = crawl(client)

    assert "/fleet/" in pages and "/admin/" in pages

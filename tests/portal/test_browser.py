"""A real browser (the distribution's Chromium, driven by Playwright) against the running
system: log in, submit a job from the form, and watch its timeline fill in live."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.portal.conftest import DEMO_PASSWORD

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        page = browser.new_page()
        page.set_default_timeout(30_000)
        yield page
        browser.close()


def log_in(page: Any, base: str) -> None:
    page.goto(base + "/")
    page.fill("input[name=username]", "demo")
    page.fill("input[name=password]", DEMO_PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("form.filters")


def test_a_user_submits_a_job_and_watches_its_placement_live(stack: Any, page: Any) -> None:
    from playwright.sync_api import expect

    log_in(page, stack.base)
    page.click("text=New job")
    page.fill("input[name=name]", "browser-run")
    page.select_option("select[name=accelerator]", "T4")
    page.fill("input[name=total_steps]", "100")
    page.click("button:has-text('Submit job')")

    expect(page.locator("#live-status")).to_have_text("live")
    expect(page.locator("#timeline li.kind-job_submitted")).to_have_count(1)
    expect(page.locator("#timeline li.kind-placement_decided")).to_have_count(1, timeout=60_000)
    expect(page.locator("#job-state")).to_have_text("Starting")
    assert "g4dn" in page.locator("#timeline li.kind-placement_decided").inner_text()


def test_the_form_shows_a_field_error_in_the_browser(stack: Any, page: Any) -> None:
    from playwright.sync_api import expect

    log_in(page, stack.base)
    page.goto(stack.base + "/jobs/new/")
    page.fill("input[name=param-mlp_numpy-seed]", "-1")

    # Live, next to the field, before any button is pressed.
    expect(page.locator("#error-param-mlp_numpy-seed")).to_have_text("seed must be at least 0")
    page.fill("input[name=param-mlp_numpy-seed]", "2")
    expect(page.locator("#error-param-mlp_numpy-seed")).to_be_hidden()


def test_a_user_sees_the_estimate_before_launching_and_the_cost_charts(
    stack: Any, page: Any
) -> None:
    from playwright.sync_api import expect

    log_in(page, stack.base)
    page.goto(stack.base + "/jobs/new/")
    page.select_option("select[name=accelerator]", "V100-16GB")
    page.fill("input[name=total_steps]", "500000")

    expect(page.locator("#estimate")).to_be_visible()
    expect(page.locator("#recommendation")).to_contain_text("Checkpoint every")

    page.click("nav >> text=Costs")
    expect(page.locator("#chart-completion .main-svg").first).to_be_visible()
    expect(page.locator("#chart-interval .main-svg").first).to_be_visible()
    expect(page.locator("#chart-prices .main-svg").first).to_be_visible()

"""A real browser (the distribution's Chromium, driven by Playwright) against the running
system, as a new user would try it: sign in, fill the form and watch the estimate appear,
submit, open the job page, have staff interrupt its instance from the fleet page, watch the
migration's phases appear live and the job finish; a stranger cannot see the job. Each page
is saved as a screenshot in the run's own folder, or in BATON_SCREENSHOTS when set
(`BATON_SCREENSHOTS=docs/screenshots make test` refreshes the ones the README shows)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.portal.conftest import DEMO_PASSWORD, ROOT, Stack

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = ROOT / os.environ.get(
    "BATON_SCREENSHOTS", str(Path(os.environ.get("BATON_TEST_HOME", "var")) / "screenshots")
)
# A laptop's screen.
VIEWPORT = {"width": 1366, "height": 860}

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)"
)


@pytest.fixture
def browser() -> Iterator[Any]:
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
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Any:
    return new_page(browser)


def new_page(browser: Any) -> Any:
    """A page in a context of its own (its own cookies: one user per page) that records its
    script errors and every host it asks something of (the pages must work offline)."""
    page = browser.new_context(viewport=VIEWPORT).new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    hosts: set[str] = set()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
    page.script_errors = errors
    page.hosts = hosts
    return page


def add_user(stack: Stack, username: str, password: str, staff: bool = False) -> None:
    """A user of the running system, made as an admin would (idempotent)."""
    code = (
        "from django.contrib.auth.models import User\n"
        f"u, _ = User.objects.get_or_create(username={username!r})\n"
        f"u.is_staff = u.is_superuser = {staff!r}\n"
        f"u.set_password({password!r})\n"
        "u.save()\n"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def log_in(page: Any, base: str, username: str = "demo", password: str = DEMO_PASSWORD) -> None:
    page.goto(base + "/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("form.filters")


def screenshot(page: Any, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.evaluate("window.scrollTo(0, 0)")  # sticky panels where a reader first sees them
    page.screenshot(path=str(path), full_page=full_page)
    return path


def test_a_user_submits_watches_a_live_migration_and_a_stranger_sees_nothing(
    stack: Stack, browser: Any
) -> None:
    from playwright.sync_api import expect

    add_user(stack, "ops", "ops-password-for-tests", staff=True)
    add_user(stack, "mallory", "mallory-password-for-tests")
    user = new_page(browser)
    log_in(user, stack.base)

    # The form: a field per parameter; the estimate appears beside it without a button.
    user.click("nav >> text=New job")
    user.fill("#f-name", "browser-migration")
    user.select_option("#f-accelerator", "T4")
    user.fill("#f-param-mlp_numpy-seed", "7")
    user.fill("#f-param-mlp_numpy-step_ms", "25")
    user.fill("#f-total_steps", "1200")
    user.fill("#f-checkpoint_every_steps", "100")
    user.check("input[name=tolerance][value=aggressive]")
    expect(user.locator("#estimate")).to_be_visible()
    expect(user.locator("#recommendation")).to_contain_text("Checkpoint every")
    expect(user.locator("#estimate-chart rect")).to_have_count(4)
    expect(user.locator("#estimate-status")).to_have_text("")
    screenshot(user, "submit")
    user.click("button:has-text('Submit job')")

    # The job page: live, placed, then running.
    expect(user.locator("h1")).to_have_text("browser-migration")
    job_url = user.url
    job_id = int(re.search(r"/jobs/(\d+)/", job_url).group(1))  # type: ignore[union-attr]
    expect(user.locator("#live-status")).to_have_text("live")
    expect(user.locator("#timeline li.kind-running")).to_have_count(1, timeout=90_000)
    expect(user.locator("#phase-rows .phase-row")).to_have_count(0)

    # Every state the badge shows, however briefly (a migration can take under a second).
    user.evaluate(
        """() => {
            window.seenStates = [];
            const record = () => {
                const text = document.getElementById("job-state").textContent;
                if (window.seenStates.at(-1) !== text) window.seenStates.push(text);
            };
            new MutationObserver(record).observe(
                document.getElementById("job-parts"),
                { subtree: true, childList: true, characterData: true },
            );
            record();
        }"""
    )

    # The connection drops just before the interruption: the page says so, reconnects and
    # resumes from its last event (checked at the end: every event once, none missed).
    user.evaluate("window.BatonLive.socket.close()")
    expect(user.locator("#live-status")).to_contain_text("reconnecting")

    # Staff interrupt its instance from the fleet page (the chaos action).
    ops = new_page(browser)
    log_in(ops, stack.base, "ops", "ops-password-for-tests")
    ops.click("nav >> text=Fleet")
    expect(ops.locator("#live-status")).to_have_text("live")
    ops.fill("#f-advance", "2")
    ops.fill("#f-final", "8")
    button = ops.locator(f"tr:has(a[href='/jobs/{job_id}/']) button:has-text('Interrupt')")
    expect(button).to_have_count(1)
    screenshot(ops, "fleet")
    button.click()
    expect(ops.locator("p.notice")).to_contain_text(f"of job {job_id} interrupted")
    expect(ops.locator("#feed li.kind-notice_advance").first).to_contain_text(f"job {job_id}")

    # Back on the job page, without a reload: the migration's phases appear as they happen.
    row = user.locator("#phase-rows .phase-row").first
    expect(row.locator(".phase-notice")).to_be_visible()
    expect(row.locator(".phase-checkpoint")).to_be_visible(timeout=30_000)
    expect(row.locator(".phase-release")).to_be_visible(timeout=30_000)
    expect(row.locator(".phase-start")).to_be_visible(timeout=60_000)
    expect(row.locator(".phase-validation")).to_be_visible(timeout=60_000)
    expect(row.locator(".phase-running")).to_be_visible(timeout=30_000)
    expect(row).to_have_class(re.compile(r"\bdone\b"))
    for kind in ("notice_final", "checkpoint_committed", "released", "restore_done"):
        expect(user.locator(f"#timeline li.kind-{kind}")).to_have_count(1)
    expect(user.locator("#live-status")).to_have_text("live")
    expect(user.locator("#migrations tbody tr")).to_have_count(1)
    expect(user.locator("#job-state")).to_have_text("Succeeded", timeout=120_000)
    expect(user.locator("#job-result")).to_contain_text("step 1200")
    assert "Migrating" in user.evaluate("window.seenStates")
    expect(user.locator("#cancel-form")).to_be_hidden()
    expect(user.locator("#checkpoints .chip.replica-ready").first).to_be_visible()
    expect(user.locator("#log .log-migration").first).to_be_visible()  # rank 0 moved
    expect(user.locator("#log")).to_contain_text("final step=1200")
    screenshot(user, "job", full_page=False)  # the parts and the timeline, as on a laptop
    shown = user.eval_on_selector_all("#timeline li", "items => items.map(i => +i.dataset.id)")
    recorded = user.evaluate(
        "(url) => fetch(url).then(r => r.json()).then(events => events.map(e => e.id))",
        f"/api/jobs/{job_id}/timeline/",
    )
    assert shown == recorded
    user.goto(stack.base + "/")
    expect(user.locator(f"#jobs a[href='/jobs/{job_id}/']")).to_be_visible()
    screenshot(user, "dashboard")

    # A stranger: no job page, not on their dashboard, and the websocket refused.
    stranger = new_page(browser)
    log_in(stranger, stack.base, "mallory", "mallory-password-for-tests")
    expect(stranger.locator(f"a[href='/jobs/{job_id}/']")).to_have_count(0)
    assert stranger.goto(job_url).status == 404
    assert stranger.goto(f"{stack.base}/jobs/{job_id}/parts/").status == 404
    assert stranger.goto(f"{stack.base}/fleet/").status == 403
    stranger.goto(stack.base + "/")
    outcome = stranger.evaluate(
        """(id) => new Promise((resolve) => {
            const socket = new WebSocket(`ws://${location.host}/ws/jobs/${id}/`);
            socket.onopen = () => resolve("open");
            socket.onclose = () => resolve("refused");
        })""",
        job_id,
    )
    assert outcome == "refused"
    for watched in (user, ops, stranger):
        assert watched.script_errors == []
        assert watched.hosts == {urlsplit(stack.base).netloc}


def test_the_form_shows_a_field_error_beside_the_field_as_you_type(stack: Stack, page: Any) -> None:
    from playwright.sync_api import expect

    log_in(page, stack.base)
    page.goto(stack.base + "/jobs/new/")
    page.fill("#f-param-mlp_numpy-seed", "-1")

    expect(page.locator("#error-param-mlp_numpy-seed")).to_have_text("seed must be at least 0")
    expect(page.locator("#f-param-mlp_numpy-seed")).to_have_attribute("aria-invalid", "true")
    page.fill("#f-param-mlp_numpy-seed", "2")
    expect(page.locator("#error-param-mlp_numpy-seed")).to_be_hidden()
    expect(page.locator("#estimate")).to_be_visible()


def test_the_form_is_usable_from_the_keyboard(stack: Stack, page: Any) -> None:
    from playwright.sync_api import expect

    log_in(page, stack.base)
    page.goto(stack.base + "/jobs/new/")
    page.focus("#f-name")
    page.keyboard.type("typed-only")
    for _ in range(40):  # Tab through the form to the submit button
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Submit job":
            break
    page.keyboard.press("Enter")

    expect(page.locator("h1")).to_have_text("typed-only")


def test_the_cost_charts_draw_from_local_assets(stack: Stack, page: Any) -> None:
    from playwright.sync_api import expect

    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    log_in(page, stack.base)
    page.click("nav >> text=Costs")

    expect(page.locator("#chart-completion .main-svg").first).to_be_visible()
    expect(page.locator("#chart-interval .main-svg").first).to_be_visible()
    expect(page.locator("#chart-prices .main-svg").first).to_be_visible()
    assert requested and all(url.startswith(stack.base) for url in requested)

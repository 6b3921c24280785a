"""The admin dashboard in a real browser: headless Chromium driven by Playwright.

Uses the system's Chromium (``/usr/bin/chromium``); Playwright never downloads one here.
Screenshots go to ``test-artifacts/``; with SQLQUEUE_UPDATE_DOCS_SCREENSHOT=1 the dashboard's
also goes to ``docs/dashboard.png`` for the README.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import query

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.sqlite_only,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} is not installed"),
]


@pytest.fixture
def app(make_app: Callable[..., Flask]) -> Flask:
    """The sample app with the admin at /queue: pytest-flask's ``live_server`` serves it
    from a process of its own, on a free port of 127.0.0.1."""
    app = make_app()
    app.secret_key = "browser test"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    return app


@pytest.mark.slow
def test_dashboard_filter_open_and_retry_a_dead_job(
    app: Flask, live_server: Any, database_uri: str
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    base = live_server.url("/queue")
    with app.app_context():
        for i in range(12):
            sample_app.add.enqueue(i, i)
        sample_app.report.enqueue(7)
        dead = sample_app.always_fails.using(max_attempts=1).enqueue("SMTP server said 421")
        sample_app.echo.using(queue="mail", delay=600).enqueue("later")
    sample_app.queue.worker(app=app).run(burst=True)
    with app.app_context():
        sample_app.add.enqueue(40, 2)  # one eligible pending job, so a queue shows its wait
    assert query(database_uri, "SELECT status FROM sqlqueue_jobs WHERE id = :i", i=dead.id) == [
        ("dead",)
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    problems: list[str] = []

    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on(
                "requestfailed",
                lambda r: problems.append(f"{r.url}: {r.failure}"),
            )

            page.goto(base + "/")
            page.wait_for_load_state("networkidle")
            assert page.locator('[data-status="dead"]').inner_text() == "1"
            assert page.locator('[data-status="completed"]').inner_text() == "13"
            # Styles and script load under the CSP (the pause button is shown by the script).
            toggle = page.locator("#sqlqueue-refresh")
            assert toggle.is_visible()
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background != "rgba(0, 0, 0, 0)"
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            if os.environ.get("SQLQUEUE_UPDATE_DOCS_SCREENSHOT"):
                # Only on request: a test run must not change tracked files.
                shutil.copyfile(ARTIFACTS / "dashboard.png", ROOT / "docs" / "dashboard.png")

            # Auto-refresh reloads the page; paused, it does not (and stays paused).
            page.evaluate("window.__marker = 1")
            page.wait_for_event("load", timeout=8000)
            assert page.evaluate("window.__marker") is None
            page.locator("#sqlqueue-refresh").click()
            assert "Resume" in page.locator("#sqlqueue-refresh").inner_text()
            page.evaluate("window.__marker = 2")
            page.wait_for_timeout(6500)
            assert page.evaluate("window.__marker") == 2
            page.reload()
            assert "Resume" in page.locator("#sqlqueue-refresh").inner_text()

            page.get_by_role("link", name="Dead letters").click()
            page.wait_for_url("**/queue/jobs?status=dead")
            rows = page.locator("table.jobs tbody tr")
            assert rows.count() == 1
            assert "SMTP server said 421" in rows.first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "dead-letters.png"), full_page=True)

            rows.first.get_by_role("link", name=str(dead.id)).click()
            page.wait_for_url(f"**/queue/jobs/{dead.id}")
            assert page.locator("h1 .badge").inner_text() == "dead"
            assert "Traceback" in page.locator(".traceback").first.inner_text()
            page.screenshot(path=str(ARTIFACTS / "dead-job.png"), full_page=True)

            page.get_by_role("button", name="Retry").click()
            page.wait_for_url(f"**/queue/jobs/{dead.id}")
            assert page.locator("h1 .badge").inner_text() == "pending"
            assert "pending again" in page.locator(".notice.success").inner_text()
            page.screenshot(path=str(ARTIFACTS / "retried-job.png"), full_page=True)
        finally:
            browser.close()

    assert query(database_uri, "SELECT status FROM sqlqueue_jobs WHERE id = :i", i=dead.id) == [
        ("pending",)
    ]
    assert problems == []

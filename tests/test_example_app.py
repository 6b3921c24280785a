"""The example app: its endpoints and tasks on every backend, and the demo script.

On SQLite the app keeps its default database, a file in its instance folder; on the
servers ``SQLQUEUE_DATABASE_URI`` points it at the test's fresh database.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from example_app import create_app
from example_app.tasks import handle_payment_event
from example_app.tasks import queue
from flask_sqlqueue import WorkerOptions
from tests.conftest import query

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ENV = ("EXAMPLE_DATABASE_URI", "EXAMPLE_INSTANCE_PATH", "EXAMPLE_FLAKY_FAILURE_RATE")

MakeShop = Callable[..., Flask]


@pytest.fixture
def make_shop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_uri: str, backend: str
) -> Iterator[MakeShop]:
    """Build the example app with the queue's tables created. On SQLite it uses its default
    database, a file in its instance folder (here a temporary one)."""
    for name in EXAMPLE_ENV:
        monkeypatch.delenv(name, raising=False)
    made: list[Flask] = []
    database = {} if backend == "sqlite" else {"SQLQUEUE_DATABASE_URI": database_uri}

    def make(**config: Any) -> Flask:
        app = create_app(
            {"TESTING": True, "EXAMPLE_REPORT_SECONDS": 0, **database, **config},
            instance_path=str(tmp_path / "instance"),
        )
        queue.upgrade_database(app=app)
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["sqlqueue"].store.engine.dispose()


@pytest.fixture
def shop(make_shop: MakeShop) -> Flask:
    return make_shop(EXAMPLE_FLAKY_FAILURE_RATE=0.0)


def database_file(app: Flask) -> Path:
    return Path(app.extensions["sqlqueue"].store.engine.url.database)


def job_rows(app: Flask) -> list[tuple[Any, ...]]:
    """The jobs table read on a connection of its own, bypassing the queue's code."""
    url = app.extensions["sqlqueue"].store.engine.url.render_as_string(hide_password=False)
    return query(url, "SELECT id, task, status, idempotency_key FROM sqlqueue_jobs ORDER BY id")


def work_burst(app: Flask) -> None:
    """Run every job that is eligible now, in this process, then return."""
    queue.worker(WorkerOptions(concurrency=2, poll_interval=0.05), app).run(burst=True)


def get_job(app: Flask, job_id: int) -> dict[str, Any]:
    response = app.test_client().get(f"/jobs/{job_id}")
    assert response.status_code == 200
    body: dict[str, Any] = response.get_json()
    return body


def instance_lines(app: Flask, name: str) -> list[str]:
    path = Path(app.instance_path) / name
    return path.read_text().splitlines() if path.exists() else []


PAID = {"id": "evt_1001", "type": "payment.succeeded", "data": {"amount": 1299}}


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_default_database_is_a_sqlite_file_in_the_instance_folder(shop: Flask) -> None:
    assert database_file(shop) == Path(shop.instance_path) / "sqlqueue.db"
    assert database_file(shop).is_file()
    settings = shop.extensions["sqlqueue"].settings
    assert (settings.backoff_base, settings.backoff_cap, settings.backoff_jitter) == (1, 10, 1)


def test_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_DATABASE_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    monkeypatch.setenv("EXAMPLE_INSTANCE_PATH", str(tmp_path / "inst"))
    monkeypatch.setenv("EXAMPLE_FLAKY_FAILURE_RATE", "0.25")
    app = create_app()
    try:
        assert database_file(app) == tmp_path / "elsewhere.db"
        assert app.instance_path == str(tmp_path / "inst")
        assert app.config["EXAMPLE_FLAKY_FAILURE_RATE"] == 0.25
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


def test_index_lists_what_to_try(shop: Flask) -> None:
    response = shop.test_client().get("/")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    text = response.get_data(as_text=True)
    for path in ("/webhooks/payments", "/reports", "/shipping-quote", "/jobs/", "queue retry"):
        assert path in text


# -- the admin dashboard -----------------------------------------------------------------------


def test_the_demo_serves_the_admin_and_says_its_access_is_open(shop: Flask) -> None:
    client = shop.test_client()
    job_id = client.post("/reports", json={"report_id": 7}).get_json()["job_id"]
    work_burst(shop)
    for path in ("/admin/", "/admin/jobs", f"/admin/jobs/{job_id}", "/admin/workers"):
        response = client.get(path)
        assert response.status_code == 200, path
        body = response.get_data(as_text=True)
        assert '<p class="banner" role="alert">Demo: open access' in body, path
        assert "do not deploy like this" in body, path
    assert "example_app.tasks.build_report" in client.get("/admin/jobs").get_data(as_text=True)
    # Its forms work: the example app has a secret key for their CSRF tokens.
    page = client.get(f"/admin/jobs/{job_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert token is not None
    deleted = client.post(f"/admin/jobs/{job_id}/delete", data={"csrf_token": token.group(1)})
    assert deleted.status_code == 303
    assert client.get(f"/jobs/{job_id}").status_code == 404
    # Open to this machine only: a request from elsewhere is refused.
    remote = shop.test_client().get("/admin/", environ_base={"REMOTE_ADDR": "192.0.2.7"})
    assert remote.status_code == 403
    assert "/admin/" in client.get("/").get_data(as_text=True)  # the index points to it


def test_the_admin_blueprint_stays_closed_by_default() -> None:
    # The demo's open access is its own choice, not the blueprint's default.
    app = Flask("closed")
    app.register_blueprint(queue.admin_blueprint(), url_prefix="/queue")
    response = app.test_client().get("/queue/")
    assert response.status_code == 403
    body = response.get_data(as_text=True)
    assert "queue.admin_blueprint(authorize=" in body
    assert "banner" not in body


# -- webhooks ----------------------------------------------------------------------------------


def test_duplicate_webhook_delivery_returns_the_same_job(shop: Flask) -> None:
    client = shop.test_client()
    first = client.post("/webhooks/payments", json=PAID)
    second = client.post("/webhooks/payments", json=PAID)

    assert first.status_code == second.status_code == 202
    assert first.get_json()["duplicate"] is False
    assert second.get_json()["duplicate"] is True
    job_id = first.get_json()["job_id"]
    assert second.get_json()["job_id"] == job_id
    assert first.headers["Location"] == f"/jobs/{job_id}"
    assert job_rows(shop) == [
        (job_id, "example_app.tasks.handle_payment_event", "pending", "evt_1001")
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "must be a JSON object"),
        (b"{not json", "must be a JSON object"),
        (b'["evt_1001"]', "must be a JSON object"),
        (b'{"type": "payment.succeeded"}', 'needs an "id"'),
        (b'{"id": "", "type": "payment.succeeded"}', 'needs an "id"'),
        (b'{"id": 1001, "type": "payment.succeeded"}', 'needs an "id"'),
        (b'{"id": "' + b"e" * 256 + b'"}', 'needs an "id"'),
        (b'{"id": "evt_1", "data": {"amount": NaN}}', "cannot be queued"),
    ],
)
def test_bad_webhook_is_refused_and_enqueues_nothing(
    shop: Flask, body: bytes, message: str
) -> None:
    response = shop.test_client().post(
        "/webhooks/payments", data=body, content_type="application/json"
    )
    assert response.status_code == 400
    assert message in response.get_json()["error"]
    assert job_rows(shop) == []


def test_payment_event_is_applied_once(shop: Flask) -> None:
    job_id = shop.test_client().post("/webhooks/payments", json=PAID).get_json()["job_id"]
    work_burst(shop)

    job = get_job(shop, job_id)
    assert (job["status"], job["attempts"]) == ("completed", 1)
    assert job["result"] == {"event_id": "evt_1001", "type": "payment.succeeded", "applied": True}
    assert instance_lines(shop, "payments.log") == ["evt_1001 payment.succeeded amount=1299"]

    # The same event in a second job (say, enqueued by hand): its effect is not repeated.
    with shop.app_context():
        again = handle_payment_event.enqueue(PAID)
    work_burst(shop)
    assert get_job(shop, again.id)["result"]["applied"] is False
    assert len(instance_lines(shop, "payments.log")) == 1


def test_unhandled_event_type_goes_dead_at_once(shop: Flask) -> None:
    event = {"id": "evt_2002", "type": "payment.disputed"}
    job_id = shop.test_client().post("/webhooks/payments", json=event).get_json()["job_id"]
    work_burst(shop)

    job = get_job(shop, job_id)
    assert (job["status"], job["attempts"]) == ("dead", 1)
    assert "PermanentFailure" in job["last_error"]
    assert "payment.disputed" in job["last_error"]
    assert job["errors"][0]["attempt"] == 1
    assert "traceback" not in job["errors"][0]
    assert instance_lines(shop, "payments.log") == []


# -- reports -----------------------------------------------------------------------------------


def test_report_completes_with_a_json_result(shop: Flask) -> None:
    response = shop.test_client().post("/reports", json={"report_id": 7, "format": "csv"})
    assert response.status_code == 202
    job_id = response.get_json()["job_id"]
    assert get_job(shop, job_id)["status"] == "pending"

    work_burst(shop)

    job = get_job(shop, job_id)
    assert (job["status"], job["attempts"], job["last_error"]) == ("completed", 1, None)
    assert (job["task"], job["queue"], job["args"]) == (
        "example_app.tasks.build_report",
        "reports",
        [7, "csv"],
    )
    result = job["result"]
    assert (result["report_id"], result["format"]) == (7, "csv")
    lines = result["csv"].splitlines()
    assert lines[0] == "day,orders" and len(lines) == 8
    assert result["total_orders"] == sum(int(line.split(",")[1]) for line in lines[1:])
    assert job["finished_at"] is not None


@pytest.mark.parametrize(
    "body",
    [{"report_id": "7"}, {"report_id": 0}, {"report_id": True}, {"report_id": 7, "format": "pdf"}],
)
def test_bad_report_request_is_refused(shop: Flask, body: dict[str, Any]) -> None:
    response = shop.test_client().post("/reports", json=body)
    assert response.status_code == 400
    assert response.get_json()["error"]
    assert job_rows(shop) == []


def test_unknown_job_is_404(shop: Flask) -> None:
    response = shop.test_client().get("/jobs/999")
    assert response.status_code == 404
    assert response.get_json() == {"error": "No job with id 999."}


# -- the flaky partner API ---------------------------------------------------------------------


def test_flaky_call_waits_for_the_short_backoff(make_shop: MakeShop) -> None:
    app = make_shop(EXAMPLE_FLAKY_FAILURE_RATE=1.0)
    job_id = app.test_client().post("/orders/42/shipping-quote").get_json()["job_id"]
    work_burst(app)  # one failed attempt; the retry is 2-3 s away, so the burst ends

    job = get_job(app, job_id)
    assert (job["status"], job["attempts"], job["max_attempts"]) == ("pending", 1, 3)
    assert job["last_error"].startswith("example_app.tasks.PartnerUnavailable")
    with app.app_context():
        stored = queue.get_job(job_id)
    assert stored is not None
    wait = (stored.run_at - stored.updated_at).total_seconds()
    assert 2 <= wait <= 3.01  # min(CAP=10, BASE=1 * 2**1) + uniform(0, JITTER=1)


def test_flaky_call_goes_dead_then_replays_and_emails_once(make_shop: MakeShop) -> None:
    app = make_shop(
        EXAMPLE_FLAKY_FAILURE_RATE=1.0,
        SQLQUEUE_BACKOFF_BASE=0,
        SQLQUEUE_BACKOFF_CAP=0,
        SQLQUEUE_BACKOFF_JITTER=0,
    )
    job_id = app.test_client().post("/orders/42/shipping-quote").get_json()["job_id"]
    work_burst(app)

    job = get_job(app, job_id)
    assert (job["status"], job["attempts"]) == ("dead", 3)
    assert [error["attempt"] for error in job["errors"]] == [1, 2, 3]
    assert instance_lines(app, "outbox.log") == []

    # The partner is back: replay the dead job from the command line.
    app.config["EXAMPLE_FLAKY_FAILURE_RATE"] = 0.0
    replayed = app.test_cli_runner().invoke(args=["queue", "retry", "--dead"])
    assert replayed.exit_code == 0, replayed.output
    assert "Replayed 1 job(s)." in replayed.output
    work_burst(app)

    job = get_job(app, job_id)
    assert (job["status"], job["attempts"]) == ("completed", 1)
    assert job["result"]["email_sent"] is True
    assert instance_lines(app, "outbox.log") == ["order 42: shipping quote 450 cents"]

    # A second quote job for the same order does not email the customer again.
    second = app.test_client().post("/orders/42/shipping-quote").get_json()["job_id"]
    work_burst(app)
    assert get_job(app, second)["result"]["email_sent"] is False
    assert len(instance_lines(app, "outbox.log")) == 1


# -- the demo ----------------------------------------------------------------------------------


def status_counts(output: str) -> dict[str, int]:
    """The ``total`` row of the ``flask queue status`` table in the demo's output."""
    lines = output.splitlines()
    header = next(line for line in lines if line.startswith("queue ") and "completed" in line)
    total = next(line for line in lines if line.startswith("total "))
    names = header.split()[1:6]
    return dict(zip(names, map(int, total.split()[1:6]), strict=True))


@pytest.mark.slow
def test_demo_runs_bounded_in_its_own_instance_folder(tmp_path: Path) -> None:
    instance = tmp_path / "instance"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "EXAMPLE_"))}
    env["PYTHONPATH"] = str(ROOT)
    command = [sys.executable, "-m", "example_app.demo", "--seconds", "8", "--port", "0"]
    proc = subprocess.Popen(
        [*command, "--instance-path", str(instance)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the demo stops its worker and web app
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"the demo did not finish in time:\n{output}")

    assert proc.returncode == 0, output
    assert "(the same job" in output  # the duplicate delivery
    assert '-> 400, The event needs an "id"' in output
    counts = status_counts(output)
    # 9 distinct jobs: 3 webhooks, 2 reports and 4 flaky calls.
    assert sum(counts.values()) == 9, output
    assert counts["completed"] >= 4, output  # the two handled events and the two reports
    assert counts["dead"] >= 1, output  # the event type without a handler
    assert "completed in" in output  # the worker's log lines are shown
    assert "SIGTERM: finishing running jobs" in output
    assert re.search(r"admin dashboard is at http://127\.0\.0\.1:\d+/admin/", output)
    assert output.rstrip().endswith("Stopped.")

    # Everything it wrote is in the instance folder it was given.
    assert (instance / "sqlqueue.db").is_file()
    assert len((instance / "payments.log").read_text().splitlines()) == 2
    with closing(sqlite3.connect(instance / "sqlqueue.db")) as conn:
        workers = conn.execute("SELECT stop_reason FROM sqlqueue_workers").fetchall()
        report = conn.execute(
            "SELECT status, result FROM sqlqueue_jobs WHERE task = ? ORDER BY id LIMIT 1",
            ("example_app.tasks.build_report",),
        ).fetchone()
    assert workers == [("stopped",)]  # the worker stopped cleanly and said so
    assert report[0] == "completed"
    assert json.loads(report[1])["format"] == "csv"

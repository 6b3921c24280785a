"""The example app tested the way a user of flask_sqlqueue would test theirs: with the
``flask_sqlqueue.testing`` plugin's fixtures, no worker process and no sleeping.

docs/testing.md shows this file. A user's ``conftest.py`` would hold the
``pytest_plugins`` line and the ``app`` fixture, which the plugin's fixtures use by
default and from which pytest-flask makes ``client`` (it also pushes a request context
around each test).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient

from example_app import create_app
from example_app.tasks import build_report
from example_app.tasks import call_flaky_api
from example_app.tasks import handle_payment_event
from example_app.tasks import queue
from flask_sqlqueue import JobStatus
from flask_sqlqueue.testing import QueueTester

pytest_plugins = ["flask_sqlqueue.testing"]

EVENT = {"id": "evt_1", "type": "payment.succeeded", "data": {"amount": 1299}}


@pytest.fixture
def app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_uri: str, backend: str
) -> Iterator[Flask]:
    """The example app on the test's database with the queue's tables created."""
    for name in ("EXAMPLE_DATABASE_URI", "EXAMPLE_INSTANCE_PATH", "EXAMPLE_FLAKY_FAILURE_RATE"):
        monkeypatch.delenv(name, raising=False)
    database = {} if backend == "sqlite" else {"SQLQUEUE_DATABASE_URI": database_uri}
    app = create_app(
        {"TESTING": True, "EXAMPLE_REPORT_SECONDS": 0, "EXAMPLE_FLAKY_FAILURE_RATE": 0.0}
        | database,
        instance_path=str(tmp_path / "instance"),
    )
    queue.upgrade_database(app=app)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def test_a_webhook_delivered_twice_is_handled_once(
    client: FlaskClient, sqlqueue: QueueTester, app: Flask
) -> None:
    first = client.post("/webhooks/payments", json=EVENT)
    again = client.post("/webhooks/payments", json=EVENT)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json is not None and again.json["duplicate"] is True

    job = sqlqueue.assert_enqueued(handle_payment_event, args=[EVENT], queue="webhooks")
    assert len(sqlqueue.enqueued(handle_payment_event)) == 1

    [ran] = sqlqueue.drain()
    assert ran.id == job.id
    assert ran.result == {"event_id": "evt_1", "type": "payment.succeeded", "applied": True}
    log = Path(app.instance_path, "payments.log").read_text()
    assert log == "evt_1 payment.succeeded amount=1299\n"
    sqlqueue.assert_not_enqueued(handle_payment_event)


def test_an_unknown_event_type_is_dead_lettered(client: FlaskClient, sqlqueue: QueueTester) -> None:
    client.post("/webhooks/payments", json={"id": "evt_2", "type": "payment.disputed"})
    [ran] = sqlqueue.drain()
    assert ran.status == JobStatus.DEAD
    assert "no handler for payment event type 'payment.disputed'" in (ran.last_error or "")


def test_report_requests_are_queued_with_their_format(
    client: FlaskClient, sqlqueue: QueueTester
) -> None:
    client.post("/reports", json={"report_id": 7, "format": "csv"})
    sqlqueue.assert_enqueued(build_report, args=[7, "csv"], queue="reports")
    sqlqueue.assert_not_enqueued(build_report, args=[7, "json"])
    # A bad request queues nothing.
    assert client.post("/reports", json={"report_id": 0}).status_code == 400
    assert len(sqlqueue.enqueued()) == 1


def test_reports_run_inline_in_eager_mode(client: FlaskClient, sqlqueue_eager: QueueTester) -> None:
    response = client.post("/reports", json={"report_id": 7})
    assert response.json is not None and response.json["status"] == "completed"
    job = client.get(response.json["url"]).json
    assert job is not None and job["result"]["total_orders"] > 0


def test_a_flaky_partner_is_retried_until_the_job_goes_dead(
    client: FlaskClient, sqlqueue: QueueTester, app: Flask
) -> None:
    app.config["EXAMPLE_FLAKY_FAILURE_RATE"] = 1.0  # the partner is down
    client.post("/orders/42/shipping-quote")
    # The first attempt fails now; the retries wait for their backoff.
    [first] = sqlqueue.drain()
    assert (first.status, first.attempts) == (JobStatus.PENDING, 1)
    # Run the retries too: the test's clock jumps to each one's run_at.
    [ran] = sqlqueue.drain(include_scheduled=True)
    assert (ran.status, ran.attempts) == (JobStatus.DEAD, 3)
    assert not Path(app.instance_path, "outbox.log").exists()  # no email went out


def test_a_retry_runs_once_the_clock_passes_its_backoff(
    client: FlaskClient, sqlqueue: QueueTester, app: Flask
) -> None:
    app.config["EXAMPLE_FLAKY_FAILURE_RATE"] = 1.0
    client.post("/orders/7/shipping-quote")
    [first] = sqlqueue.drain()
    app.config["EXAMPLE_FLAKY_FAILURE_RATE"] = 0.0  # the partner is back
    # Before the retry's time, however long the first attempt took, it is not due.
    retry_at = first.refresh().run_at
    sqlqueue.clock.set(retry_at - timedelta(seconds=30))
    assert sqlqueue.drain() == []
    sqlqueue.clock.advance(timedelta(minutes=1))  # past it
    [ran] = sqlqueue.drain()
    assert (ran.id, ran.status, ran.attempts) == (first.id, JobStatus.COMPLETED, 2)
    sqlqueue.assert_not_enqueued(call_flaky_api)

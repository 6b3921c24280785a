"""Failed attempts reported to Sentry (flask_sqlqueue.sentry), on every backend.

The real ``sentry_sdk`` with its logging integration, a transport that keeps the events
instead of sending them, and real workers: threads of this process and the children of
an in-process worker. The task is in ``tests/sentry_app.py``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
import sqlalchemy as sa
from flask import Flask
from sentry_sdk.envelope import Envelope
from sentry_sdk.integrations import Integration
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.transport import Transport

from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.processes import AppLoader
from flask_sqlqueue.sentry import SQLQueueIntegration
from tests import sentry_app as tasks
from tests.workers import run_burst

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0  # upper bound, in seconds, of a burst here (a loaded 2-core machine)


class Keeping(Transport):
    """Keeps each event it is given, sends nothing."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        event = envelope.get_event()
        if event is not None:
            self.events.append(dict(event))


def init_sentry(*integrations: Integration) -> Keeping:
    transport = Keeping()
    sentry_sdk.init(
        dsn="https://key@sentry.invalid/1",
        transport=transport,
        # The logging integration as Sentry's defaults have it (error lines become
        # events), and nothing else patched into the test process.
        default_integrations=False,
        auto_enabling_integrations=False,
        integrations=[LoggingIntegration(), *integrations],
    )
    return transport


@pytest.fixture
def sentry() -> Iterator[Keeping]:
    """Sentry with the queue's integration; no client is left for the next test."""
    yield init_sentry(SQLQueueIntegration())
    _stop_sentry()


def _stop_sentry() -> None:
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


@pytest.fixture
def sapp(make_app: Any, database_uri: str) -> Iterator[Flask]:
    make_app()
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def tags_of(event: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in event["tags"].items()}


def exception_of(event: dict[str, Any]) -> dict[str, Any]:
    values: list[dict[str, Any]] = event["exception"]["values"]
    return values[-1]  # the error raised (the chained ones come first)


def functions_of(event: dict[str, Any]) -> list[str]:
    return [frame["function"] for frame in exception_of(event)["stacktrace"]["frames"]]


def test_each_failed_attempt_is_one_event_with_its_trace_and_tags(
    sentry: Keeping, sapp: Flask
) -> None:
    with sapp.app_context():
        job = tasks.reserve_stock.enqueue(-3)
    worker = tasks.queue.worker(WorkerOptions(grace=1.0), sapp)
    run_burst(worker, timeout=WAIT)

    assert job.refresh().status is JobStatus.DEAD
    # One event per attempt: the worker's "failed, job is dead" line is not a second one.
    retry, dead = sentry.events
    for attempt, (event, outcome) in enumerate([(retry, "retry"), (dead, "dead")], 1):
        assert tags_of(event) == {
            "sqlqueue.job_id": str(job.id),
            "sqlqueue.task": "tests.sentry_app.reserve_stock",
            "sqlqueue.queue": "default",
            "sqlqueue.attempt": str(attempt),
            "sqlqueue.outcome": outcome,
        }
        error = exception_of(event)
        assert error["type"] == "ValueError"
        assert error["value"] == "quantity must be positive, got -3"
        assert error["mechanism"] == {"type": "sqlqueue", "handled": False}
        assert functions_of(event)[-2:] == ["reserve_stock", "check_quantity"]
        assert event["level"] == "error"
        assert event["contexts"]["sqlqueue"]["max_attempts"] == 2
    assert "retry_at" in retry["contexts"]["sqlqueue"]


@pytest.mark.sqlite_only
def test_a_task_asking_for_a_retry_is_reported_only_once_dead(sentry: Keeping, sapp: Flask) -> None:
    with sapp.app_context():
        job = tasks.wait_for_supplier.enqueue()
    run_burst(tasks.queue.worker(WorkerOptions(grace=1.0), sapp), timeout=WAIT)

    assert (job.refresh().status, job.attempts) == (JobStatus.DEAD, 2)
    (event,) = sentry.events
    assert tags_of(event)["sqlqueue.outcome"] == "dead"
    assert tags_of(event)["sqlqueue.attempt"] == "2"
    assert exception_of(event)["type"] == "Retry"
    assert exception_of(event)["module"] == "flask_sqlqueue.exceptions"


@pytest.mark.sqlite_only
def test_a_job_whose_arguments_cannot_be_read_is_one_event_with_the_stored_error(
    sentry: Keeping, sapp: Flask
) -> None:
    with sapp.app_context():
        job = tasks.reserve_stock.enqueue(1)
    with sapp.extensions["sqlqueue"].store.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job.id).values(payload="{not json"))
    run_burst(tasks.queue.worker(WorkerOptions(grace=1.0), sapp), timeout=WAIT)

    assert (job.refresh().status, job.attempts) == (JobStatus.DEAD, 1)
    # The worker logs two error lines about it ("malformed payload, job is dead" and
    # "failed, job is dead"): neither is a second event.
    (event,) = sentry.events
    assert tags_of(event)["sqlqueue.outcome"] == "dead"
    error = exception_of(event)
    assert error["type"] == "MalformedPayload"
    assert error["value"] == job.errors[-1]["message"]
    assert "stacktrace" not in error


@pytest.mark.sqlite_only
def test_without_the_integration_only_the_dead_line_is_sent_without_a_trace(
    sapp: Flask,
) -> None:
    # What the integration replaces: the logging integration alone sends the worker's
    # error line at death, a message with no exception.
    transport = init_sentry()
    try:
        with sapp.app_context():
            tasks.reserve_stock.enqueue(-1)
        run_burst(tasks.queue.worker(WorkerOptions(grace=1.0), sapp), timeout=WAIT)
    finally:
        _stop_sentry()
    (event,) = transport.events
    assert event["logger"] == "flask_sqlqueue.worker"
    assert "failed, job is dead" in event["logentry"]["formatted"]
    assert "exception" not in event


@pytest.mark.sqlite_only
def test_a_client_without_the_integration_gets_no_job_events(sapp: Flask) -> None:
    # The signal receivers stay connected once set up: they must ask the current client.
    init_sentry(SQLQueueIntegration())
    _stop_sentry()
    transport = init_sentry(LoggingIntegration(event_level=None))
    try:
        with sapp.app_context():
            tasks.reserve_stock.enqueue(-1)
        run_burst(tasks.queue.worker(WorkerOptions(grace=1.0), sapp), timeout=WAIT)
    finally:
        _stop_sentry()
    assert transport.events == []


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_failure_in_a_child_process_carries_its_frames_from_the_traceback_text(
    sentry: Keeping, sapp: Flask, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    with sapp.app_context():
        job = tasks.reserve_stock.using(max_attempts=1).enqueue(-5)
    worker = tasks.queue.worker(
        WorkerOptions(processes=1, grace=1.0), sapp, loader=AppLoader("tests.sentry_app:create_app")
    )
    run_burst(worker, timeout=180)

    assert job.refresh().status is JobStatus.DEAD
    (event,) = sentry.events
    assert tags_of(event) == {
        "sqlqueue.job_id": str(job.id),
        "sqlqueue.task": "tests.sentry_app.reserve_stock",
        "sqlqueue.queue": "default",
        "sqlqueue.attempt": "1",
        "sqlqueue.outcome": "dead",
    }
    error = exception_of(event)
    assert error["type"] == "ValueError"
    assert error["value"] == "quantity must be positive, got -5"
    assert "module" not in error  # a builtin
    frames = error["stacktrace"]["frames"]
    assert [frame["function"] for frame in frames][-2:] == ["reserve_stock", "check_quantity"]
    assert frames[-1]["abs_path"].endswith("sentry_app.py")
    assert frames[-1]["context_line"].startswith("raise ValueError(")
    assert "Traceback (most recent call last)" in event["extra"]["sqlqueue.traceback"]


def test_without_sentry_sdk_the_import_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['sentry_sdk'] = None\n"
        "try:\n"
        "    import flask_sqlqueue.sentry\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'flask-sqlqueue[sentry]'" in out

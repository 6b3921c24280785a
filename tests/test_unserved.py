"""Pending jobs that no live worker would claim are named: by the worker's log, by
``flask queue status``, by ``flask queue doctor``."""

from __future__ import annotations

import html
import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue.core import queries
from flask_sqlqueue.core import roster
from flask_sqlqueue.core.worker import WorkerOptions
from tests import sample_app
from tests.conftest import query
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import running

# A second app on the same database, registering a task the sample app's workers lack:
# what a deploy that added a task looks like while the old workers still run.
newer = SQLQueue()


@newer.task(name="newer.only")
def only_in_the_newer_app() -> None:
    pass


@pytest.fixture
def newer_app(database_uri: str) -> Iterator[Flask]:
    app = sample_app.queue_app(__name__, newer, {"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def _status(app: Flask) -> Any:
    return app.test_cli_runner().invoke(args=["queue", "status"])


def _worker_rows(database_uri: str) -> list[tuple[Any, ...]]:
    return query(database_uri, "SELECT tasks FROM sqlqueue_workers WHERE stopped_at IS NULL")


def test_a_worker_records_and_logs_the_tasks_it_registers(
    make_app: Any, database_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    caplog.set_level(logging.INFO, logger="flask_sqlqueue.worker")
    with running(sample_app.queue.worker(WorkerOptions(poll_interval=0.05), app)):
        wait_for(lambda: len(_worker_rows(database_uri)) == 1)
        [(tasks,)] = _worker_rows(database_uri)
    assert json.loads(tasks) == sorted(sample_app.queue.registry)
    started = [r.getMessage() for r in caplog.records if " started: " in r.getMessage()]
    assert started and "tasks=" + ",".join(sorted(sample_app.queue.registry)) in started[0]


def test_jobs_no_live_worker_registers_are_named(
    make_app: Any, newer_app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app()
    other = newer_app
    with other.app_context():
        only_in_the_newer_app.enqueue()
        only_in_the_newer_app.enqueue()
    with app.app_context():
        sample_app.add.enqueue(1, 2)  # a task the live worker runs: never named

    caplog.set_level(logging.WARNING, logger="flask_sqlqueue.worker")
    with running(sample_app.queue.worker(WorkerOptions(poll_interval=0.05), app)):
        wait_for(lambda: any("newer.only" in r.getMessage() for r in caplog.records))
        # The app that registers the task: its own workers are not running.
        result = _status(other)
        assert result.exit_code == 0, result.output
        assert (
            "warning: 2 pending job(s) of task 'newer.only' in queue 'default': no live "
            "worker runs them; start a worker that serves queue 'default', or restart "
            "workers that predate the task." in result.stderr
        )
        # The app of the running worker does not even register it: the fix says so.
        result = _status(app)
        assert "this app does not register the task either" in result.stderr
        assert "'add'" not in result.stderr
        doctor = other.test_cli_runner().invoke(args=["queue", "doctor"])
        assert "warn  2 pending job(s) of task 'newer.only'" in doctor.stdout
        other.register_blueprint(newer.admin_blueprint(authorize=lambda: True), url_prefix="/q")
        page = html.unescape(other.test_client().get("/q/").get_data(as_text=True))
        assert (
            "2 pending job(s) of task 'newer.only' in queue 'default': no live worker runs "
            "them.</strong> Start a worker that serves queue 'default'" in page
        )
    [warning] = [r.getMessage() for r in caplog.records if "newer.only" in r.getMessage()]
    assert warning.startswith("2 pending job(s) of task 'newer.only' in queue 'default'")


def test_a_worker_for_other_queues_does_not_serve_a_queue(make_app: Any, database_uri: str) -> None:
    app = make_app()
    with app.app_context():
        sample_app.add.enqueue(1, 2)  # queue "default"
    options = WorkerOptions(queues=("reports",), poll_interval=0.05)
    with running(sample_app.queue.worker(options, app)):
        wait_for(lambda: len(_worker_rows(database_uri)) == 1)
        result = _status(app)
    assert (
        "1 pending job(s) of task 'tests.sample_app.add' in queue 'default': no live worker "
        "runs them; start a worker that serves queue 'default'" in result.stderr
    )


def test_with_no_live_worker_status_says_so_once(make_app: Any, database_uri: str) -> None:
    app = make_app()
    with app.app_context():
        sample_app.add.enqueue(1, 2)
        sample_app.report.enqueue(7)
    result = _status(app)
    assert result.stderr.count("warning:") == 1, result.stderr
    assert "warning: no live worker; 2 pending job(s) wait for one; flask queue work." in (
        result.stderr
    )
    deadline = time.monotonic() + WAIT
    with running(sample_app.queue.worker(WorkerOptions(poll_interval=0.05), app)):
        while query(database_uri, "SELECT id FROM sqlqueue_jobs WHERE status = 'pending'"):
            assert time.monotonic() < deadline, "the worker did not run the jobs"
            time.sleep(0.05)
    assert "warning" not in _status(app).stderr


def test_counts_stop_at_the_cap(make_app: Any) -> None:
    app = make_app()
    store = app.extensions["sqlqueue"].store
    with app.app_context():
        for n in range(3):
            sample_app.add.enqueue(n, n)
    with store.read() as conn:
        cover = queries.coverage(conn, roster.heartbeat_fresh(store, 60), cap=2)
    assert cover.live == 0
    assert [(u.task, u.count, u.capped) for u in cover.unserved] == [
        ("tests.sample_app.add", 2, True)
    ]
    assert cover.warnings(sample_app.queue.registry) == [
        ("no live worker; 2+ pending job(s) wait for one", "flask queue work")
    ]


def test_a_worker_of_this_boot_counts_as_live_by_its_boot_clock(
    make_app: Any, database_uri: str
) -> None:
    """A worker whose heartbeat time looks an hour old (this process's wall clock
    stepped) but whose boot clock is current is live for status, doctor and the admin."""
    app = make_app({"SQLQUEUE_STALE_AFTER": 5})
    store = app.extensions["sqlqueue"].store
    if store.boot is None:
        pytest.skip("no boot clock on this system: heartbeats are judged by time alone")
    app.secret_key = "test"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    with app.app_context():
        sample_app.add.enqueue(1, 2)
    with store.write() as conn:
        roster.register_worker(
            conn, "w-here", "here", 1, [], 1, store.now() - timedelta(hours=1),
            boot=store.boot, tasks=list(sample_app.queue.registry),
        )  # fmt: skip
    doctor = app.test_cli_runner().invoke(args=["queue", "doctor"]).stdout
    assert "ok    1 live worker(s)" in doctor and "stopped heartbeating" not in doctor
    assert "warning" not in _status(app).stderr
    workers_page = app.test_client().get("/q/workers").get_data(as_text=True)
    assert "w-here" in workers_page and "silent for over" not in workers_page

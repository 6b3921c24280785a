"""Wake-ups across processes (PostgreSQL LISTEN/NOTIFY, SQLite same-host sockets), the
database clock, and refusing servers without SKIP LOCKED."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.conftest import fresh_database
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import running

ENQUEUE = (
    "from tests import sample_app\n"
    "app = sample_app.create_app()\n"
    "with app.app_context():\n"
    "    print(sample_app.add.enqueue(20, 22).id)\n"
)


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-psycopg2", "mysql"])
def wake_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """SQLite's and MariaDB's workers on this host are woken by a socket; PostgreSQL's
    by NOTIFY, through psycopg 3 or psycopg2."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'queue.db'}"
    else:
        kind, _, driver = request.param.partition("-")
        with fresh_database(kind) as uri:
            if driver:
                uri = (
                    sa.make_url(uri)
                    .set(drivername=f"postgresql+{driver}")
                    .render_as_string(hide_password=False)
                )
            yield uri


@pytest.fixture(params=["postgresql", "mysql"])
def server_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_database(request.param) as uri:
        yield uri


def test_idle_worker_wakes_for_another_process_long_before_its_poll(wake_uri: str) -> None:
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": wake_uri})
    sample_app.queue.upgrade_database(app=app)
    # Polling far less often than the test waits: only a wake-up runs the job in time.
    worker = sample_app.queue.worker(WorkerOptions(poll_interval=10 * WAIT, grace=1), app)
    try:
        with running(worker):
            wait_for(worker._dispatcher.idle.is_set, "the worker to wait for a wake-up")
            out = subprocess.run(
                [sys.executable, "-c", ENQUEUE],
                env=flask_env(wake_uri),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=WAIT,
            )
            assert out.returncode == 0, out.stderr
            job_id = int(out.stdout.strip())

            def completed() -> bool:
                with app.app_context():
                    job = sample_app.queue.get_job(job_id)
                return job is not None and job.status is JobStatus.COMPLETED

            wait_for(completed, "the job the other process enqueued (a wake-up)")
        with app.app_context():
            job = sample_app.queue.get_job(job_id)
        assert job is not None and job.result == 42
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


def test_a_skewed_host_uses_the_database_clock(
    server_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flask_sqlqueue.core import clock as clock_module

    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": server_uri})
    sample_app.queue.upgrade_database(app=app)
    store = app.extensions["sqlqueue"].store
    try:
        real = clock_module.utcnow
        # This host's clock runs two hours fast.
        monkeypatch.setattr(clock_module, "utcnow", lambda: real() + timedelta(hours=2))
        offset = store.sync_clock()
        assert abs(offset + timedelta(hours=2)) < timedelta(seconds=2)
        assert abs(store.now() - real()) < timedelta(seconds=2)
        with app.app_context():
            job = sample_app.add.enqueue(1, 2)  # eligible now by the database's clock
            assert abs(job.run_at - real()) < timedelta(seconds=2)
            sample_app.queue.worker(WorkerOptions(grace=1), app).run(burst=True)
            assert job.refresh().status is JobStatus.COMPLETED
    finally:
        store.engine.dispose()


def test_a_server_without_skip_locked_is_refused(server_uri: str) -> None:
    from flask_sqlqueue import ConfigurationError

    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": server_uri})
    store = app.extensions["sqlqueue"].store
    try:
        store.check_server()  # the real server is new enough
        with store.engine.connect() as conn:
            conn.dialect.server_version_info = (
                (9, 4) if conn.dialect.name == "postgresql" else (10, 5, 9)
            )
        with pytest.raises(ConfigurationError, match=r"SKIP LOCKED needs"):
            store.check_server()
    finally:
        store.engine.dispose()


def test_a_postgresql_enqueue_notifies_in_its_insert() -> None:
    """One statement per enqueue: the NOTIFY rides on the INSERT (a round trip less),
    and an enqueue whose key is held notifies no one."""
    with fresh_database("postgresql") as uri:
        app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri})
        sample_app.queue.upgrade_database(app=app)
        store = sample_app.queue.state(app).store
        engine = store.engine
        statements: list[str] = []

        def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            statements.append(statement)

        try:
            with app.app_context():
                sample_app.add.enqueue(1, 2)  # the schema check, outside the count
                sa.event.listen(engine, "before_cursor_execute", executed)
                sample_app.add.enqueue(1, 2)  # a plain job: on a kept connection
                assert statements == []
                assert "pg_notify" in store._kept.sql
                sample_app.add.using(idempotency_key="k").enqueue(1, 2)
                assert len(statements) == 1, statements
                assert all("pg_notify" in s for s in statements), statements
                assert not any(s.lstrip().upper().startswith("NOTIFY") for s in statements)
                statements.clear()
                sample_app.add.using(idempotency_key="k").enqueue(1, 2)  # held: no insert
                assert not any(s.lstrip().upper().startswith("NOTIFY") for s in statements)
        finally:
            if sa.event.contains(engine, "before_cursor_execute", executed):
                sa.event.remove(engine, "before_cursor_execute", executed)
            engine.dispose()

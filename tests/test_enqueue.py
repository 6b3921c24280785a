"""Producing jobs through the extension, on every backend.

The app fixtures are conftest's ``sq_app`` and ``ctx``.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session
from sqlalchemy.orm import sessionmaker

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import DuplicateTask
from flask_sqlqueue import Job
from flask_sqlqueue import JobStatus
from flask_sqlqueue import Retry
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Unique
from flask_sqlqueue import UnknownTask
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.bounds import EARLIEST_RUN_AT
from flask_sqlqueue.bounds import LATEST_RUN_AT
from flask_sqlqueue.bounds import longest_delay
from tests import sample_app
from tests.conftest import install_schema
from tests.conftest import query
from tests.conftest import query_dicts
from tests.sample_app import queue_app


@pytest.fixture
def engine(database_uri: str) -> Iterator[sa.Engine]:
    """An engine of the app's own, separate from the queue's, on the queue's database."""
    engine = sa.create_engine(database_uri)
    yield engine
    engine.dispose()


def _rows(
    database_uri: str, sql: str = "SELECT * FROM sqlqueue_jobs ORDER BY id"
) -> list[dict[str, Any]]:
    """Query on a fresh connection of its own: sees exactly what has been committed."""
    return query_dicts(database_uri, sql)


def _count(database_uri: str) -> int:
    return len(_rows(database_uri))


def _new_app(tmp_path: Path, name: str, **config: Any) -> Flask:
    app = Flask(name, instance_path=str(tmp_path / f"{name}-instance"))
    app.config.update(config)
    return app


def _dispose(*apps: Flask) -> None:
    for app in apps:
        state = app.extensions.get("sqlqueue")
        if state is not None:
            state.store.engine.dispose()


# -- enqueue and the Job it returns ----------------------------------------------------------------


def _now() -> datetime:
    """The queue's clock: the database's own on a server, this host's on SQLite."""
    return sample_app.queue.state().store.now()


def test_enqueue_returns_a_committed_job(ctx: Flask, database_uri: str) -> None:
    before = _now()
    job = sample_app.add.enqueue(2, 3)
    after = _now()

    assert isinstance(job, Job)
    assert isinstance(job.id, int)
    assert (job.queue, job.task, job.args, job.kwargs) == (
        "default",
        "tests.sample_app.add",
        [2, 3],
        {},
    )
    assert job.status is JobStatus.PENDING
    assert (job.attempts, job.max_attempts, job.priority) == (0, 5, 0)
    assert job.started_at is job.finished_at is job.worker_id is job.last_error is None
    assert job.result is None and job.idempotency_key is None
    assert before <= job.created_at <= after
    assert job.run_at == job.created_at == job.updated_at

    # Committed: another connection, opened after enqueue returned, sees the row.
    (row,) = _rows(database_uri)
    assert row["id"] == job.id
    assert row["task"] == "tests.sample_app.add"
    assert row["status"] == "pending"
    assert row["payload"] == '{"args":[2,3],"kwargs":{}}'


def test_task_names(queue: SQLQueue) -> None:
    assert sample_app.add.name == "tests.sample_app.add"
    assert sample_app.report.name == "tests.sample_app.report"
    assert sample_app.echo.name == "echo"  # @queue.task(name="echo")
    assert queue.registry["echo"] is sample_app.echo
    assert queue.registry["tests.sample_app.add"] is sample_app.add
    assert sample_app.add.__name__ == "add"  # still looks like the function


def test_calling_a_task_runs_it_inline_and_writes_nothing(ctx: Flask, database_uri: str) -> None:
    assert sample_app.add(2, 3) == 5
    assert sample_app.echo(1, k="v") == {"args": [1], "kwargs": {"k": "v"}}
    with pytest.raises(RuntimeError, match="boom"):
        sample_app.always_fails("boom")
    assert _count(database_uri) == 0


def test_calling_a_task_needs_no_app_context() -> None:
    assert sample_app.report(4) == "report 4"


def test_task_defaults_are_stored(ctx: Flask, database_uri: str) -> None:
    job = sample_app.report.enqueue(11)
    (row,) = _rows(database_uri)
    assert (job.queue, job.priority, job.max_attempts) == ("reports", 3, 7)
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("reports", 3, 7)


def test_using_stores_every_option(ctx: Flask, queue: SQLQueue, database_uri: str) -> None:
    job = sample_app.add.using(
        queue="mail", priority=-4, max_attempts=2, idempotency_key="order-17"
    ).enqueue(1, b=2)

    stored = queue.get_job(job.id)
    assert stored is not None
    assert (stored.queue, stored.priority, stored.max_attempts) == ("mail", -4, 2)
    assert stored.idempotency_key == "order-17"
    assert (stored.args, stored.kwargs) == ([1], {"b": 2})
    (row,) = _rows(database_uri)
    assert (row["queue"], row["priority"], row["max_attempts"], row["idempotency_key"]) == (
        "mail",
        -4,
        2,
        "order-17",
    )


def test_using_overrides_only_what_it_sets(ctx: Flask, queue: SQLQueue) -> None:
    job = sample_app.report.using(priority=9).enqueue(1)
    assert (job.queue, job.priority, job.max_attempts) == ("reports", 9, 7)
    job = sample_app.report.using(queue="urgent", max_attempts=1).enqueue(2)
    assert (job.queue, job.priority, job.max_attempts) == ("urgent", 3, 1)
    # .using() made new options: the task's own defaults are unchanged.
    assert sample_app.report.enqueue(3).priority == 3


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (30, timedelta(seconds=30)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(minutes=5), timedelta(minutes=5)),
        (0, timedelta(0)),
    ],
    ids=["int", "float", "timedelta", "zero"],
)
def test_delay_pushes_run_at(
    ctx: Flask, queue: SQLQueue, delay: float | timedelta, expected: timedelta
) -> None:
    before = _now()
    job = sample_app.add.using(delay=delay).enqueue(1, 1)
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.run_at - stored.created_at == expected
    assert before + expected <= stored.run_at <= _now() + expected


def test_run_at_is_stored_as_utc(
    ctx: Flask, queue: SQLQueue, database_uri: str, backend: str
) -> None:
    plus_two = timezone(timedelta(hours=2))
    when = datetime(2031, 6, 1, 12, 30, 15, 250000, tzinfo=plus_two)

    job = sample_app.add.using(run_at=when).enqueue(1, 1)

    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.run_at == when
    assert stored.run_at.utcoffset() == timedelta(0)
    assert stored.run_at.hour == 10
    (row,) = _rows(database_uri)
    # As each database keeps it: SQLite as text, MariaDB as a zoneless DATETIME, both in
    # UTC; PostgreSQL as a timestamptz (an instant), read back here in the session's zone.
    stored_as = {
        "sqlite": "2031-06-01 10:30:15.250000",
        "mysql": datetime(2031, 6, 1, 10, 30, 15, 250000),
        "postgresql": datetime(2031, 6, 1, 10, 30, 15, 250000, tzinfo=UTC),
    }
    assert row["run_at"] == stored_as[backend]


def test_timestamps_are_aware_utc(ctx: Flask, queue: SQLQueue) -> None:
    job = sample_app.add.enqueue(1, 1)
    stored = queue.get_job(job.id)
    assert stored is not None
    for one in (job, stored):
        for stamp in (one.run_at, one.created_at, one.updated_at):
            assert stamp.tzinfo is not None
            assert stamp.utcoffset() == timedelta(0)
    assert stored.created_at == job.created_at


REFUSED_OPTIONS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("naive run_at", {"run_at": datetime(2031, 1, 1)}, ValueError, "timezone"),
    (
        "delay and run_at",
        {"delay": 5, "run_at": datetime(2031, 1, 1, tzinfo=UTC)},
        ValueError,
        "delay or run_at",
    ),
    ("negative delay", {"delay": -1}, ValueError, "delay=-1"),
    ("negative timedelta", {"delay": timedelta(seconds=-5)}, ValueError, "delay="),
    ("nan delay", {"delay": float("nan")}, ValueError, "delay=nan"),
    ("string delay", {"delay": "5"}, TypeError, "delay='5'"),
    ("queue with a space", {"queue": "bad name"}, ValueError, "queue='bad name'"),
    ("empty queue", {"queue": ""}, ValueError, "queue=''"),
    ("bool priority", {"priority": True}, TypeError, "priority=True"),
    ("float priority", {"priority": 1.5}, TypeError, "priority=1.5"),
    ("max_attempts 0", {"max_attempts": 0}, ValueError, "max_attempts=0"),
    ("empty idempotency key", {"idempotency_key": ""}, ValueError, "idempotency_key=''"),
    ("session of the wrong type", {"session": "db"}, TypeError, "session must be"),
]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [case[1:] for case in REFUSED_OPTIONS],
    ids=[case[0] for case in REFUSED_OPTIONS],
)
def test_bad_options_are_refused_and_nothing_is_written(
    ctx: Flask,
    queue: SQLQueue,
    database_uri: str,
    options: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        sample_app.add.using(**options).enqueue(1, 2)
    with pytest.raises(error, match=match):
        queue.enqueue("tests.sample_app.add", args=[1, 2], **options)
    assert _count(database_uri) == 0


def test_bad_options_on_the_decorator_are_refused(queue: SQLQueue) -> None:
    fresh = SQLQueue()
    with pytest.raises(ValueError, match="max_attempts=0"):
        fresh.task(max_attempts=0)
    with pytest.raises(TypeError, match="priority=False"):
        fresh.task(priority=False)
    with pytest.raises(ValueError, match="queue='no/slashes'"):
        fresh.task(queue="no/slashes")
    assert len(fresh.registry) == 0


# -- enqueue by name -------------------------------------------------------------------------------


def test_enqueue_by_name_uses_the_registered_defaults(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    job = queue.enqueue("tests.sample_app.report", args=[9])
    assert (job.task, job.queue, job.priority, job.max_attempts) == (
        "tests.sample_app.report",
        "reports",
        3,
        7,
    )
    assert (job.args, job.kwargs) == ([9], {})

    job = queue.enqueue("tests.sample_app.report", kwargs={"report_id": 10}, priority=1)
    assert (job.queue, job.priority, job.max_attempts) == ("reports", 1, 7)
    assert (job.args, job.kwargs) == ([], {"report_id": 10})
    assert [(r["queue"], r["priority"]) for r in _rows(database_uri)] == [
        ("reports", 3),
        ("reports", 1),
    ]


def test_enqueue_by_an_unregistered_name_is_stored_pending(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    job = queue.enqueue(
        "billing.tasks.charge", args=[1, "eur"], kwargs={"retry": False}, unregistered=True
    )
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.task == "billing.tasks.charge"
    assert stored.status is JobStatus.PENDING
    assert (stored.queue, stored.priority, stored.max_attempts) == ("default", 0, 5)
    assert (stored.args, stored.kwargs) == ([1, "eur"], {"retry": False})
    assert _count(database_uri) == 1


def test_enqueue_by_name_refuses_bad_arguments(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    with pytest.raises(TypeError, match="args must be a list"):
        queue.enqueue("echo", args="abc")
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        queue.enqueue("echo", kwargs=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Task name"):
        queue.enqueue("")
    assert _count(database_uri) == 0


def test_unregistered_name_uses_the_configured_max_attempts(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_MAX_ATTEMPTS": 12})
    with app.app_context():
        assert sample_app.queue.enqueue("not.here", unregistered=True).max_attempts == 12
        assert sample_app.add.enqueue(1, 1).max_attempts == 12
        assert sample_app.report.enqueue(1).max_attempts == 7  # the task's own wins


# -- idempotency -----------------------------------------------------------------------------------


def test_same_idempotency_key_returns_the_same_job(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    first = sample_app.add.using(idempotency_key="webhook-42").enqueue(1, 2)
    second = sample_app.add.using(idempotency_key="webhook-42").enqueue(3, 4)
    by_name = queue.enqueue("tests.sample_app.add", args=[5, 6], idempotency_key="webhook-42")

    assert first.id == second.id == by_name.id
    assert second.args == by_name.args == [1, 2]  # the existing job, not the new arguments
    assert _count(database_uri) == 1

    other = sample_app.add.using(idempotency_key="webhook-43").enqueue(1, 2)
    assert other.id != first.id
    assert _count(database_uri) == 2


def test_idempotency_keys_are_compared_exactly(ctx: Flask, queue: SQLQueue) -> None:
    # Keys a case-, accent- or pad-insensitive comparison would take for one another.
    keys = ["order-1", "ORDER-1", "Order-1", "café", "cafe", "key", "key ", "straße", "strasse"]
    ids = {key: sample_app.add.using(idempotency_key=key).enqueue(1, 1).id for key in keys}

    assert len(set(ids.values())) == len(keys)
    for key, job_id in ids.items():
        stored = queue.get_job(job_id)
        assert stored is not None and stored.idempotency_key == key
        assert sample_app.add.using(idempotency_key=key).enqueue(2, 2).id == job_id


# -- transactional enqueue -------------------------------------------------------------------------


def test_session_job_exists_only_after_commit(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    with Session(engine) as session:
        job = sample_app.add.using(session=session).enqueue(1, 2)
        assert session.in_transaction()
        assert queue.get_job(job.id) is None
        assert _count(database_uri) == 0
        session.commit()

    stored = queue.get_job(job.id)
    assert stored is not None
    assert (stored.task, stored.args) == ("tests.sample_app.add", [1, 2])
    assert _count(database_uri) == 1


def test_session_job_vanishes_on_rollback(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    with Session(engine) as session:
        job = queue.enqueue("echo", args=["rolled back"], session=session)
        session.rollback()
    assert queue.get_job(job.id) is None
    assert _count(database_uri) == 0

    # The app's own writes and the job share one transaction.
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    with Session(engine) as session:
        session.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
        sample_app.echo.using(session=session).enqueue("order 1")
        session.rollback()
    assert _count(database_uri) == 0
    assert _rows(database_uri, "SELECT * FROM orders") == []


def test_connection_job_exists_only_after_commit(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    with engine.connect() as conn:
        conn.begin()
        kept = sample_app.add.using(session=conn).enqueue(1, 1)
        assert queue.get_job(kept.id) is None
        conn.commit()
    assert queue.get_job(kept.id) is not None

    with engine.connect() as conn:
        conn.begin()
        dropped = sample_app.add.using(session=conn).enqueue(2, 2)
        conn.rollback()
    assert queue.get_job(dropped.id) is None
    assert [row["id"] for row in _rows(database_uri)] == [kept.id]


def test_session_idempotency_key_inside_the_transaction(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    committed = sample_app.add.using(idempotency_key="k").enqueue(1, 1)
    with Session(engine) as session:
        again = sample_app.add.using(idempotency_key="k", session=session).enqueue(2, 2)
        twice = sample_app.add.using(idempotency_key="new", session=session).enqueue(3, 3)
        thrice = sample_app.add.using(idempotency_key="new", session=session).enqueue(4, 4)
        session.commit()
    assert again.id == committed.id
    assert twice.id == thrice.id
    assert _count(database_uri) == 2


@pytest.mark.sqlite_only
def test_session_on_the_same_file_by_another_path_is_accepted(
    ctx: Flask, queue: SQLQueue, tmp_path: Path
) -> None:
    (tmp_path / "sub").mkdir()
    other_spelling = sa.create_engine(f"sqlite:///{tmp_path / 'sub' / '..' / 'queue.db'}")
    try:
        with Session(other_spelling) as session:
            job = sample_app.add.using(session=session).enqueue(1, 1)
            session.commit()
    finally:
        other_spelling.dispose()
    assert queue.get_job(job.id) is not None


def test_session_on_another_database_is_refused(
    ctx: Flask, queue: SQLQueue, database_uri: str, other_database_uri: str
) -> None:
    other = sa.create_engine(other_database_uri)
    other_name = sa.make_url(other_database_uri).database
    assert other_name
    try:
        with Session(other) as session:
            session.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
            with pytest.raises(ValueError, match="session= must be bound to the queue's own"):
                sample_app.add.using(session=session).enqueue(1, 2)
            with pytest.raises(ValueError, match=re.escape(other_name)):
                queue.enqueue("echo", session=session)
            session.commit()
        with other.connect() as conn:
            with pytest.raises(ValueError, match="queue's own database"):
                sample_app.add.using(session=conn).enqueue(1, 2)
            tables = sa.inspect(conn).get_table_names()
    finally:
        other.dispose()
    assert tables == ["orders"]
    assert _count(database_uri) == 0


def test_scoped_session_writes_in_the_current_session(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    # Flask-SQLAlchemy's db.session is a scoped_session, not a Session.
    scoped = scoped_session(sessionmaker(engine))
    try:
        job = sample_app.add.using(session=scoped).enqueue(1, 2)
        assert scoped().in_transaction()
        assert queue.get_job(job.id) is None
        scoped.commit()
        assert queue.get_job(job.id) is not None

        dropped = queue.enqueue("echo", args=["x"], session=scoped)
        scoped.rollback()
        assert queue.get_job(dropped.id) is None
    finally:
        scoped.remove()
    assert [row["id"] for row in _rows(database_uri)] == [job.id]


def test_flask_sqlalchemy_db_session(make_app: Any, database_uri: str) -> None:
    app = make_app({"SQLALCHEMY_DATABASE_URI": database_uri})
    db = SQLAlchemy(app)
    try:
        with app.app_context():
            job = sample_app.add.using(session=db.session).enqueue(1, 2)
            assert sample_app.queue.get_job(job.id) is None
            db.session.commit()
            assert sample_app.queue.get_job(job.id) is not None

            dropped = sample_app.queue.enqueue("echo", args=["x"], session=db.session)
            assert sample_app.queue.get_job(dropped.id) is None
            db.session.rollback()
        with app.app_context():
            assert sample_app.queue.get_job(dropped.id) is None
    finally:
        with app.app_context():
            db.engine.dispose()
    assert [row["id"] for row in _rows(database_uri)] == [job.id]


# -- reading jobs ----------------------------------------------------------------------------------


def test_get_job_of_an_unknown_id_is_none(ctx: Flask, queue: SQLQueue) -> None:
    assert queue.get_job(1) is None
    job = sample_app.add.enqueue(1, 1)
    assert queue.get_job(job.id + 1) is None
    assert queue.get_job(-5) is None
    assert queue.get_job(2**62) is None


def test_refresh_rereads_the_row(ctx: Flask, database_uri: str) -> None:
    job = sample_app.add.enqueue(1, 1)
    query(
        database_uri,
        "UPDATE sqlqueue_jobs SET status = 'cancelled', priority = 42, attempts = 2 WHERE id = :id",
        id=job.id,
    )
    assert job.status is JobStatus.PENDING  # a snapshot, not live

    assert job.refresh() is job
    assert (job.status, job.priority, job.attempts) == (JobStatus.CANCELLED, 42, 2)

    query(database_uri, "DELETE FROM sqlqueue_jobs WHERE id = :id", id=job.id)
    with pytest.raises(LookupError, match=f"Job {job.id}"):
        job.refresh()


# -- app context and wiring ------------------------------------------------------------------------


def test_producing_outside_an_app_context_is_refused(
    sq_app: Flask, queue: SQLQueue, database_uri: str
) -> None:
    with pytest.raises(RuntimeError, match="app context"):
        sample_app.add.enqueue(1, 2)
    with pytest.raises(RuntimeError, match="app context"):
        sample_app.add.using(priority=1).enqueue(1, 2)
    with pytest.raises(RuntimeError, match="app context"):
        queue.enqueue("echo")
    with pytest.raises(RuntimeError, match="app context"):
        queue.get_job(1)
    assert _count(database_uri) == 0


def test_app_passed_to_the_constructor(tmp_path: Path, database_uri: str) -> None:
    app = _new_app(tmp_path, "ctor", SQLQUEUE_DATABASE_URI=database_uri)
    queue = SQLQueue(app)

    @queue.task
    def ping() -> str:
        return "pong"

    try:
        assert app.extensions["sqlqueue"].queue is queue
        assert "queue" in app.cli.commands
        queue.upgrade_database(app=app)
        with app.app_context():
            job = ping.enqueue()
            stored = queue.get_job(job.id)
        assert stored is not None
        assert stored.task == f"{__name__}.test_app_passed_to_the_constructor.<locals>.ping"
    finally:
        _dispose(app)


def test_init_app_twice_on_one_app_is_refused(make_app: Any, queue: SQLQueue) -> None:
    app = make_app()
    state = app.extensions["sqlqueue"]
    with pytest.raises(ConfigurationError, match="already set up"):
        queue.init_app(app)
    with pytest.raises(ConfigurationError, match="already set up"):
        SQLQueue().init_app(app)
    assert app.extensions["sqlqueue"] is state


def test_state_of_an_app_without_the_queue_is_refused(tmp_path: Path, queue: SQLQueue) -> None:
    app = _new_app(tmp_path, "bare")
    with app.app_context(), pytest.raises(RuntimeError, match="init_app"):
        queue.get_job(1)


def test_duplicate_task_names_are_refused() -> None:
    queue = SQLQueue()

    @queue.task(name="mail.send")
    def send() -> None: ...

    with pytest.raises(DuplicateTask, match=r"'mail\.send'"):

        @queue.task(name="mail.send")
        def send_again() -> None: ...

    def ping() -> None: ...

    queue.task(ping)
    with pytest.raises(DuplicateTask, match="ping"):
        queue.task(ping)

    assert issubclass(DuplicateTask, ConfigurationError)
    assert queue.registry["mail.send"].fn is send.fn
    assert len(queue.registry) == 2


def test_one_queue_serves_two_apps_on_two_databases(
    queue: SQLQueue, database_uri: str, other_database_uri: str
) -> None:
    uri_a, uri_b = database_uri, other_database_uri
    app_a = sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri_a})
    app_b = sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri_b})
    try:
        queue.upgrade_database(app=app_a)
        queue.upgrade_database(app=app_b)
        with app_a.app_context():
            in_a = sample_app.add.enqueue(1, 1)
        with app_b.app_context():
            in_b = [sample_app.echo.enqueue("b1"), sample_app.echo.enqueue("b2")]
            assert queue.get_job(in_b[1].id) is not None

        with app_a.app_context():
            again = queue.get_job(in_a.id)
            assert again is not None and again.task == "tests.sample_app.add"
            assert queue.get_job(in_b[1].id) is None
        with app_b.app_context():
            first = queue.get_job(in_a.id)
            assert first is not None and first.task == "echo"  # B's own job 1
        assert queue.state(app_a) is not queue.state(app_b)
    finally:
        _dispose(app_a, app_b)
    assert [r["task"] for r in _rows(uri_a)] == ["tests.sample_app.add"]
    assert [r["task"] for r in _rows(uri_b)] == ["echo", "echo"]


@pytest.mark.sqlite_only
def test_database_defaults_to_a_file_in_the_instance_folder(tmp_path: Path) -> None:
    instance = tmp_path / "instance-default"
    app = Flask("default_db", instance_path=str(instance))
    queue = SQLQueue()

    @queue.task
    def ping() -> None: ...

    assert not instance.exists()
    queue.init_app(app)
    try:
        assert app.config["SQLQUEUE_DATABASE_URI"] is None
        uri = queue.state(app).settings.database_uri
        assert uri == f"sqlite:///{instance / 'sqlqueue.db'}"
        queue.upgrade_database(app=app)
        with app.app_context():
            job = ping.enqueue()
    finally:
        _dispose(app)
    assert (instance / "sqlqueue.db").is_file()
    assert [r["id"] for r in _rows(uri)] == [job.id]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("SQLQUEUE_MAX_ATTEMPTS", 0),
        ("SQLQUEUE_MAX_ATTEMPTS", "abc"),
        ("SQLQUEUE_MAX_ATTEMPTS", 2.5),
        ("SQLQUEUE_MAX_ATTEMPTS", True),
        ("SQLQUEUE_BACKOFF_BASE", -1),
        ("SQLQUEUE_BACKOFF_CAP", "1h"),
        ("SQLQUEUE_BACKOFF_JITTER", None),
        ("SQLQUEUE_STALE_AFTER", 0),
        ("SQLQUEUE_ENGINE_OPTIONS", "pool_size=5"),
        ("SQLQUEUE_DATABASE_URI", 5),
        ("SQLQUEUE_SQLITE_SYNCHRONOUS", "SLOW"),
        ("SQLQUEUE_SQLITE_BUSY_TIMEOUT", -1),
    ],
)
def test_bad_config_values_name_the_key(tmp_path: Path, key: str, value: Any) -> None:
    app = _new_app(tmp_path, "badconfig", SQLQUEUE_DATABASE_URI=f"sqlite:///{tmp_path / 'q.db'}")
    app.config[key] = value
    with pytest.raises(ConfigurationError, match=key):
        SQLQueue().init_app(app)
    assert "sqlqueue" not in app.extensions  # nothing half set up: fix the config and retry


# -- the arguments against the task's signature ----------------------------------------------------

MISFITS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("one too many", (1, 2, 3), {}, "too many positional arguments"),
    ("one missing", (1,), {}, "missing a required argument: 'b'"),
    ("unknown keyword", (1, 2), {"c": 3}, "got an unexpected keyword argument 'c'"),
    ("given twice", (1,), {"a": 2}, "multiple values for argument 'a'"),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "reason"),
    [case[1:] for case in MISFITS],
    ids=[case[0] for case in MISFITS],
)
def test_arguments_the_function_cannot_take_are_refused(
    ctx: Flask,
    queue: SQLQueue,
    database_uri: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    reason: str,
) -> None:
    expected = rf"Task 'tests\.sample_app\.add' does not take these arguments \({reason}\)"
    with pytest.raises(TypeError, match=expected) as info:
        sample_app.add.enqueue(*args, **kwargs)
    assert "it takes (a, b)." in str(info.value)  # its parameters, to fix the call by
    with pytest.raises(TypeError, match=expected):
        sample_app.add.using(priority=1, session=None).enqueue(*args, **kwargs)
    with pytest.raises(TypeError, match=expected):
        queue.enqueue("tests.sample_app.add", args=list(args), kwargs=kwargs)
    with pytest.raises(TypeError, match=expected):  # a registered name opts out of nothing
        queue.enqueue("tests.sample_app.add", args=list(args), kwargs=kwargs, unregistered=True)
    assert _count(database_uri) == 0


def test_arguments_that_fit_are_accepted_in_every_form(ctx: Flask, queue: SQLQueue) -> None:
    made = [
        sample_app.add.enqueue(1, 2),
        sample_app.add.enqueue(1, b=2),
        sample_app.add.enqueue(a=1, b=2),
        sample_app.always_fails.enqueue(),  # a default fills the rest
        sample_app.echo.enqueue(1, 2, 3, any_name=4),  # *args and **kwargs take anything
        queue.enqueue("echo", args=[1], kwargs={"x": 2}),
    ]
    assert [(job.args, job.kwargs) for job in made] == [
        ([1, 2], {}),
        ([1], {"b": 2}),
        ([], {"a": 1, "b": 2}),
        ([], {}),
        ([1, 2, 3], {"any_name": 4}),
        ([1], {"x": 2}),
    ]


def test_the_signature_is_read_once_per_task(
    ctx: Flask, queue: SQLQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unread(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("inspect.signature was called at enqueue")

    monkeypatch.setattr(inspect, "signature", unread)
    assert sample_app.add.enqueue(1, 2).args == [1, 2]
    with pytest.raises(TypeError, match="too many positional arguments"):
        queue.enqueue("tests.sample_app.add", args=[1, 2, 3])


# -- unknown task names ------------------------------------------------------------------------


def test_enqueue_by_an_unknown_name_is_refused(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    with pytest.raises(UnknownTask, match=r"No task 'billing\.charge' is registered") as info:
        queue.enqueue("billing.charge", args=[1])
    assert isinstance(info.value, LookupError)
    assert "unregistered=True" in str(info.value)  # the way out, for a producer that means it
    with pytest.raises(UnknownTask, match=r"did you mean 'tests\.sample_app\.add'"):
        queue.enqueue("tests.sample_app.ad", args=[1, 2])
    with pytest.raises(UnknownTask, match=r"did you mean 'tests\.sample_app\.add'"):
        queue.enqueue("TESTS.SAMPLE_APP.ADD", args=[1, 2])
    with pytest.raises(UnknownTask, match=r"'billing\.charge'"):
        queue.enqueue_many("billing.charge", [([1], {}), ([2], {})])
    assert _count(database_uri) == 0

    job = queue.enqueue("billing.charge", args=[1], unregistered=True)
    (made,) = queue.enqueue_many("billing.charge", [([2], {})], unregistered=True)
    assert [r["task"] for r in _rows(database_uri)] == ["billing.charge"] * 2
    assert (job.args, made.args) == ([1], [2])


# -- times the database stores ---------------------------------------------------------------------

_MINUS_FIVE = timezone(timedelta(hours=-5))

_YEAR_10000_IN_UTC = datetime(9999, 12, 31, 23, tzinfo=_MINUS_FIVE)

UNSTORABLE_TIMES: list[tuple[str, dict[str, Any], str]] = [
    ("delay of 31,700 years", {"delay": 1e12}, "delay=1000000000000.0 would make the job due"),
    ("the longest timedelta", {"delay": timedelta.max}, "delay=datetime.timedelta(days=999999999"),
    ("an int too large for a float", {"delay": 10**400}, "delay=1000000"),
    ("infinite delay", {"delay": float("inf")}, "delay=inf would make the job due"),
    ("after the latest", {"run_at": LATEST_RUN_AT + timedelta(microseconds=1)}, "9999-12-30"),
    ("year 10000 in UTC", {"run_at": _YEAR_10000_IN_UTC}, "run_at=9999-12-31T23:00:00-05:00"),
    ("before the earliest", {"run_at": datetime(999, 12, 31, tzinfo=UTC)}, "run_at=0999-12-31"),
]


@pytest.mark.parametrize(
    ("options", "named"),
    [case[1:] for case in UNSTORABLE_TIMES],
    ids=[case[0] for case in UNSTORABLE_TIMES],
)
def test_times_the_database_cannot_store_are_refused(
    ctx: Flask, queue: SQLQueue, database_uri: str, options: dict[str, Any], named: str
) -> None:
    limit = "9999-12-30" if "delay" in options else "1000-01-02 to 9999-12-30 (UTC)"
    for enqueue in (
        lambda: sample_app.add.using(**options).enqueue(1, 2),
        lambda: queue.enqueue("tests.sample_app.add", args=[1, 2], **options),
        lambda: queue.enqueue_many("tests.sample_app.add", [([1, 2], {})], **options),
        lambda: queue.enqueue("elsewhere.task", unregistered=True, **options),
    ):
        with pytest.raises(ValueError) as info:
            enqueue()
        assert named in str(info.value)
        assert limit in str(info.value)
    assert _count(database_uri) == 0


def test_the_first_and_last_storable_times_round_trip(ctx: Flask, queue: SQLQueue) -> None:
    latest = sample_app.add.using(run_at=LATEST_RUN_AT).enqueue(1, 1)
    earliest = sample_app.add.using(run_at=EARLIEST_RUN_AT).enqueue(2, 2)
    shown_in_a_zone = LATEST_RUN_AT.astimezone(timezone(timedelta(hours=23, minutes=59)))
    nearly = sample_app.add.using(run_at=shown_in_a_zone).enqueue(3, 3)
    longest = sample_app.add.using(delay=longest_delay(_now()) - 3600).enqueue(4, 4)
    stored = [queue.get_job(job.id) for job in (latest, earliest, nearly, longest)]
    assert [job.run_at if job else None for job in stored[:3]] == [
        LATEST_RUN_AT,
        EARLIEST_RUN_AT,
        LATEST_RUN_AT,
    ]
    assert stored[3] is not None
    assert LATEST_RUN_AT - timedelta(hours=2) < stored[3].run_at < LATEST_RUN_AT


def test_retry_refuses_a_delay_the_database_cannot_store() -> None:
    for delay in (1e12, timedelta.max, 10**400, float("inf"), float("nan"), -1):
        with pytest.raises(ValueError, match="Retry delay"):
            Retry(delay)
    with pytest.raises(ValueError, match="9999-12-30"):
        Retry(1e12)
    assert Retry(timedelta(days=365 * 100)).delay == 365 * 100 * 86400


def _queue_app(queue: SQLQueue, database_uri: str, **config: Any) -> Flask:
    """An app for a queue of the test's own, on the test's database."""
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri, **config})
    queue.upgrade_database(app=app)
    return app


def test_retry_too_far_ahead_spends_only_its_own_attempt(make_app: Any, database_uri: str) -> None:
    # The usual backoff puts the next attempt an hour away, where a burst stops.
    app = make_app({"SQLQUEUE_BACKOFF_BASE": 3600})
    with app.app_context():
        job = sample_app.asks_retry.enqueue(1e12)
        before = _now()
        sample_app.queue.worker(WorkerOptions(poll_interval=0.05), app).run(burst=True)
        after = _now()
    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.PENDING, 1)
    assert job.last_error is not None
    assert job.last_error.startswith("ValueError: Retry delay=1000000000000.0 would make")
    # The failure took the usual backoff: min(cap, 3600 * 2**1) is the one-hour cap.
    assert before + timedelta(hours=1) <= job.run_at <= after + timedelta(hours=1, seconds=1)


@pytest.mark.parametrize(
    "far",
    [1e12, 1e300, 10**400, timedelta(days=999_999_999)],
    ids=["1e12", "1e300", "10**400", "timedelta"],
)
def test_a_backoff_past_the_latest_time_is_refused_and_the_default_taken(
    database_uri: str, far: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = SQLQueue()

    @queue.task(name="far_backoff", backoff=lambda attempt: far, max_attempts=3)
    def far_backoff() -> None:
        raise RuntimeError("down")

    # The queue's backoff puts the next attempt an hour away, where a burst stops.
    app = _queue_app(queue, database_uri, SQLQUEUE_BACKOFF_BASE=3600)
    try:
        with app.app_context():
            job = far_backoff.enqueue()
            before = queue.state().store.now()
            with caplog.at_level(logging.ERROR, logger="flask_sqlqueue.worker"):
                queue.worker(WorkerOptions(poll_interval=0.05), app).run(burst=True)
            after = queue.state().store.now()
            job.refresh()
    finally:
        _dispose(app)
    assert (job.status, job.attempts) == (JobStatus.PENDING, 1)
    assert job.last_error == "RuntimeError: down"
    # Said, and not parked at the end of time: the queue's own backoff, its one-hour cap.
    assert any(
        "task far_backoff: backoff failed" in r.getMessage()
        and "the latest time the queue stores" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert before + timedelta(hours=1) <= job.run_at <= after + timedelta(hours=1, seconds=1)


@pytest.mark.parametrize(
    ("using", "fragment"),
    [
        ({"idempotency_key": "order-\ud800"}, r"idempotency_key='order-\\ud800' must be"),
        ({"unique": lambda: Unique(key="k\udcff")}, r"Unique\(key='k\\udcff'\)"),
    ],
    ids=["idempotency key", "unique key"],
)
def test_a_key_that_is_not_unicode_is_refused_naming_it(
    ctx: Flask, database_uri: str, using: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment) as raised:
        options = {k: (v() if callable(v) else v) for k, v in using.items()}
        sample_app.add.using(**options).enqueue(1, 2)
    assert "valid Unicode text" in str(raised.value)
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]

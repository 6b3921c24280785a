"""The queue beside Flask-SQLAlchemy (docs/flask-sqlalchemy.md): one config line to use
the app's own database, and relative SQLite paths read from the instance folder as
Flask-SQLAlchemy reads them, on every backend where it applies.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import JobStatus
from flask_sqlqueue import QueueUnavailable
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from tests.conftest import query
from tests.workers import run_burst


def make(instance: Path, config: dict[str, Any]) -> tuple[Flask, SQLAlchemy, SQLQueue]:
    """An app with Flask-SQLAlchemy, a ``Note`` model and a queue whose task reads
    notes through ``db.session``, set up in that order."""
    app = Flask(__name__, instance_path=str(instance))
    app.config.update(SQLQUEUE_BACKOFF_BASE=0, SQLQUEUE_BACKOFF_JITTER=0, **config)

    class Base(DeclarativeBase):  # one per app: each declares its own Note
        pass

    db = SQLAlchemy(model_class=Base)

    class Note(db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str] = mapped_column(sa.String(100))

    queue = SQLQueue()

    @queue.task(name="read_note")
    def read_note(note_id: int) -> str:
        return db.session.get(Note, note_id).text

    db.init_app(app)
    queue.init_app(app)
    app.extensions["test_note"] = Note
    return app, db, queue


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The instance folder; the working directory is elsewhere, as a worker's may be."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return tmp_path / "instance"


def upgrade(app: Flask) -> None:
    result = app.test_cli_runner().invoke(args=["queue", "db", "upgrade"])
    assert result.exit_code == 0, result.output


def dispose(app: Flask, db: SQLAlchemy) -> None:
    with app.app_context():
        db.engine.dispose()
    app.extensions["sqlqueue"].store.engine.dispose()


def test_the_apps_database_is_the_queues_with_one_line(
    instance: Path, database_uri: str, backend: str
) -> None:
    app, db, queue = make(
        instance, {"SQLALCHEMY_DATABASE_URI": database_uri, "SQLQUEUE_USE_APP_DATABASE": True}
    )
    Note = app.extensions["test_note"]
    try:
        # Flask-SQLAlchemy's URL, the query it adds for MySQL (charset=utf8mb4) included.
        ours = sa.make_url(queue.state(app).settings.database_uri)
        assert ours.set(query={}) == sa.make_url(database_uri).set(query={})
        with app.app_context():
            assert ours == db.engine.url
        upgrade(app)
        with app.app_context():
            db.create_all()
            # One transaction: the note and its job are both written, or neither.
            db.session.add(Note(id=1, text="kept"))
            job = queue.enqueue("read_note", args=[1], session=db.session)
            db.session.commit()
            db.session.add(Note(id=2, text="dropped"))
            dropped = queue.enqueue("read_note", args=[2], session=db.session)
            db.session.rollback()
            assert queue.get_job(dropped.id) is None
        run_burst(queue.worker(WorkerOptions(grace=1.0), app), timeout=120)
        with app.app_context():
            done = queue.get_job(job.id)
        assert done is not None
        assert (done.status, done.result) == (JobStatus.COMPLETED, "kept")
        ((count,),) = query(database_uri, "SELECT COUNT(*) FROM sqlqueue_jobs")
        assert count == 1
    finally:
        dispose(app, db)


def test_a_relative_sqlite_path_of_flask_sqlalchemy_is_the_same_file(instance: Path) -> None:
    app, db, _queue = make(
        instance, {"SQLALCHEMY_DATABASE_URI": "sqlite:///app.db", "SQLQUEUE_USE_APP_DATABASE": "1"}
    )
    try:
        upgrade(app)
        assert (instance / "app.db").exists()
        assert not Path("app.db").exists()
        with app.app_context():
            assert db.engine.url.database == str(instance / "app.db")
        tables = query(f"sqlite:///{instance / 'app.db'}", "SELECT name FROM sqlite_master")
        assert ("sqlqueue_jobs",) in tables
    finally:
        dispose(app, db)


def test_a_relative_queue_path_is_read_from_the_instance_folder(instance: Path) -> None:
    queue = SQLQueue()
    app = Flask(__name__, instance_path=str(instance))
    app.config["SQLQUEUE_DATABASE_URI"] = "sqlite:///data/queue.db"
    queue.init_app(app)
    try:
        placed = instance / "data" / "queue.db"
        assert queue.state(app).settings.database_uri == f"sqlite:///{placed}"
        upgrade(app)
        assert placed.exists()
        assert not Path("data").exists()
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


@pytest.mark.parametrize(
    "uri",
    [
        "sqlite:////abs/queue.db",
        "sqlite:///file:queue.db?mode=ro&uri=true",
        "postgresql+psycopg://user:p%40ss@db.example:5432/app",
        "mysql+pymysql://root@127.0.0.1:3306/test?charset=utf8mb4",
    ],
)
def test_other_urls_are_kept_as_they_are(uri: str, instance: Path) -> None:
    from flask_sqlqueue.core.dialects import in_folder

    assert in_folder(uri, str(instance)) == uri


def test_a_queue_file_left_in_the_working_directory_is_not_silently_replaced(
    instance: Path,
) -> None:
    Path("queue.db").write_bytes(b"")  # a queue of before: its jobs must not be left behind
    queue = SQLQueue()
    app = Flask(__name__, instance_path=str(instance))
    app.config["SQLQUEUE_DATABASE_URI"] = "sqlite:///queue.db"
    with pytest.raises(ConfigurationError) as raised:
        queue.init_app(app)
    message = str(raised.value)
    assert str(instance / "queue.db") in message
    assert f"sqlite:///{os.path.abspath('queue.db')}" in message
    assert "Move that file to the instance folder" in message
    assert "sqlqueue" not in app.extensions
    assert not (instance / "queue.db").exists()


def test_misconfigurations_name_the_fix(instance: Path) -> None:
    app = Flask(__name__, instance_path=str(instance))
    app.config["SQLQUEUE_USE_APP_DATABASE"] = True
    with pytest.raises(ConfigurationError, match=r"call db.init_app\(app\) before queue"):
        SQLQueue().init_app(app)

    app = Flask(__name__, instance_path=str(instance))
    app.config.update(
        SQLQUEUE_USE_APP_DATABASE=True,
        SQLQUEUE_DATABASE_URI="sqlite:///q.db",
        SQLALCHEMY_DATABASE_URI="sqlite:///app.db",
    )
    SQLAlchemy(app)
    with pytest.raises(ConfigurationError, match="set one of them, not both"):
        SQLQueue().init_app(app)

    app = Flask(__name__, instance_path=str(instance))
    app.config.update(SQLQUEUE_USE_APP_DATABASE="maybe")
    with pytest.raises(ConfigurationError, match="SQLQUEUE_USE_APP_DATABASE must be True or"):
        SQLQueue().init_app(app)


# -- an in-memory database of the app's (sqlite://, common in tests) ------------------------

MEMORY = ["sqlite://", "sqlite:///:memory:"]


@pytest.mark.parametrize("uri", MEMORY)
def test_eager_mode_runs_jobs_in_an_in_memory_app_database(instance: Path, uri: str) -> None:
    app, db, queue = make(
        instance,
        {"SQLALCHEMY_DATABASE_URI": uri, "SQLQUEUE_USE_APP_DATABASE": True, "SQLQUEUE_EAGER": True},
    )
    Note = app.extensions["test_note"]
    try:
        queue.upgrade_database(app=app)  # on the app's one connection, beside its own tables
        with app.app_context():
            db.create_all()
            db.session.add(Note(id=1, text="kept"))
            db.session.commit()
            job = queue.enqueue("read_note", args=[1])
            assert (job.status, job.result) == (JobStatus.COMPLETED, "kept")
            done = queue.get_job(job.id)
            assert done is not None
            assert (done.status, done.result) == (JobStatus.COMPLETED, "kept")
            # The queue's tables are in the app's database: its own session reads them.
            rows = db.session.execute(sa.text("SELECT id, status FROM sqlqueue_jobs")).all()
            assert [tuple(r) for r in rows] == [(job.id, "completed")]
        # Nothing was written to a file, in the instance folder or the working directory.
        assert not instance.exists() or not any(instance.iterdir())
        assert not any(Path().iterdir())
    finally:
        dispose(app, db)


def test_tests_drain_the_jobs_of_an_in_memory_app_database(instance: Path) -> None:
    from flask_sqlqueue.testing import assert_enqueued
    from flask_sqlqueue.testing import drain

    app, db, queue = make(
        instance, {"SQLALCHEMY_DATABASE_URI": "sqlite://", "SQLQUEUE_USE_APP_DATABASE": True}
    )
    Note = app.extensions["test_note"]
    try:
        queue.upgrade_database(app=app)
        with app.app_context():
            db.create_all()
            db.session.add(Note(id=1, text="kept"))
            job = queue.enqueue("read_note", args=[1], session=db.session)
            db.session.commit()  # the note and its job, in one transaction
            db.session.add(Note(id=2, text="dropped"))
            dropped = queue.enqueue("read_note", args=[2], session=db.session)
            db.session.rollback()
            assert queue.get_job(dropped.id) is None
            assert assert_enqueued("read_note", args=[1]).id == job.id
            [ran] = drain()
            assert (ran.id, ran.status, ran.result) == (job.id, JobStatus.COMPLETED, "kept")
            assert drain() == []
    finally:
        dispose(app, db)


def test_an_enqueue_outside_the_session_leaves_its_rows_to_it(instance: Path) -> None:
    """docs/flask-sqlalchemy.md: on the app's in-memory database an enqueue without
    ``session=`` is committed on its own; the session's uncommitted rows stay its own,
    and a rollback undoes them, not the job."""
    app, db, queue = make(
        instance, {"SQLALCHEMY_DATABASE_URI": "sqlite://", "SQLQUEUE_USE_APP_DATABASE": True}
    )
    Note = app.extensions["test_note"]
    try:
        queue.upgrade_database(app=app)
        with app.app_context():
            db.create_all()
            db.session.add(Note(id=2, text="not committed"))
            db.session.flush()
            job = queue.enqueue("read_note", args=[2])
            db.session.rollback()
            assert db.session.get(Note, 2) is None
            kept = queue.get_job(job.id)
            assert kept is not None and kept.status == JobStatus.PENDING
    finally:
        dispose(app, db)


def test_an_eager_run_does_not_see_the_sessions_uncommitted_rows(instance: Path) -> None:
    """docs/flask-sqlalchemy.md: in eager mode on the app's in-memory database, a job
    enqueued without ``session=`` runs at once and does not see what the session has
    flushed and not committed."""
    app, db, queue = make(
        instance,
        {
            "SQLALCHEMY_DATABASE_URI": "sqlite://",
            "SQLQUEUE_USE_APP_DATABASE": True,
            "SQLQUEUE_EAGER": True,
        },
    )
    Note = app.extensions["test_note"]
    try:
        queue.upgrade_database(app=app)
        with app.app_context():
            db.create_all()
            db.session.add(Note(id=2, text="not committed"))
            db.session.flush()
            job = queue.get_job(queue.enqueue("read_note", args=[2]).id)
            assert job is not None and job.status == JobStatus.PENDING  # to be retried
            assert "'NoneType' object has no attribute 'text'" in (job.last_error or "")
            db.session.rollback()
    finally:
        dispose(app, db)


def test_an_enqueue_after_a_flush_on_the_apps_file_is_locked_out(instance: Path) -> None:
    """docs/flask-sqlalchemy.md: on the app's SQLite file, an enqueue without
    ``session=`` after the session flushed waits for the app's write transaction and
    fails with "database is locked", enqueueing nothing."""
    app, db, queue = make(
        instance,
        {
            "SQLALCHEMY_DATABASE_URI": "sqlite:///app.db",
            "SQLQUEUE_USE_APP_DATABASE": True,
            "SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.2,
        },
    )
    Note = app.extensions["test_note"]
    try:
        queue.upgrade_database(app=app)
        with app.app_context():
            db.create_all()
            db.session.add(Note(id=3, text="flushed"))
            db.session.flush()
            with pytest.raises(QueueUnavailable, match="database is locked"):
                queue.enqueue("read_note", args=[3])
            db.session.rollback()
            assert queue.enqueue("read_note", args=[3]).status == JobStatus.PENDING
    finally:
        dispose(app, db)


@pytest.mark.parametrize("uri", MEMORY)
def test_a_worker_on_an_in_memory_app_database_is_refused_by_name(instance: Path, uri: str) -> None:
    app, db, queue = make(
        instance, {"SQLALCHEMY_DATABASE_URI": uri, "SQLQUEUE_USE_APP_DATABASE": True}
    )
    try:
        # As a worker's own process finds it: the app's tables and the queue's are in
        # another process's memory. The message comes first, not one about the tables.
        with app.app_context(), pytest.raises(ConfigurationError) as raised:
            queue.worker()
        message = str(raised.value)
        for fragment in ("SQLQUEUE_USE_APP_DATABASE", "SQLALCHEMY_DATABASE_URI", "in-memory"):
            assert fragment in message, message
        # What to do: a file, or run the jobs in the test itself.
        for fragment in ("sqlite:///", "SQLQUEUE_EAGER", "drain()"):
            assert fragment in message, message
        # `flask queue work` says the same, in one line.
        result = app.test_cli_runner().invoke(args=["queue", "work", "--burst"])
        assert result.exit_code == 1, (result.output, result.exception)
        assert isinstance(result.exception, SystemExit), repr(result.exception)
        assert "Traceback" not in result.output
        errors = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(errors) == 1, result.output
        assert "SQLQUEUE_USE_APP_DATABASE" in errors[0]
        # With the tables made, so still: and `flask queue doctor` names it, rather than
        # a journal mode to fix.
        queue.upgrade_database(app=app)
        with (
            app.app_context(),
            pytest.raises(ConfigurationError, match="SQLQUEUE_USE_APP_DATABASE"),
        ):
            queue.worker()
        doctor = app.test_cli_runner().invoke(args=["queue", "doctor"])
        assert "an in-memory database: no worker can share it" in doctor.output
        assert "journal_mode" not in doctor.output
    finally:
        dispose(app, db)

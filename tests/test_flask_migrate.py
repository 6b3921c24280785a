"""The queue's migrations run from an app's own Flask-Migrate history
(docs/flask-migrate.md): one ``flask db upgrade`` for the app's tables and the queue's,
autogenerate that leaves the queue's tables alone, and a downgrade back to nothing, on
every backend.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import flask_migrate
import sqlalchemy as sa
from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column

from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import schema
from flask_sqlqueue.migrate import exclude_queue_tables
from tests.conftest import query
from tests.conftest import table_names
from tests.workers import run_burst


def make(instance: Path, database_uri: str) -> tuple[Flask, SQLAlchemy, SQLQueue]:
    app = Flask(__name__, instance_path=str(instance))
    app.config.update(SQLALCHEMY_DATABASE_URI=database_uri, SQLQUEUE_USE_APP_DATABASE=True)

    class Base(DeclarativeBase):
        pass

    db = SQLAlchemy(model_class=Base)

    class Note(db.Model):  # type: ignore[name-defined,misc]
        __tablename__ = "notes"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str] = mapped_column(sa.String(100))

    queue = SQLQueue()

    @queue.task(name="count_notes")
    def count_notes() -> int:
        return int(db.session.scalar(sa.select(sa.func.count()).select_from(Note)) or 0)

    db.init_app(app)
    queue.init_app(app)
    return app, db, queue


def revision_file(directory: Path, revision: str, down: str, upgrade: str, downgrade: str) -> None:
    (directory / "versions" / f"{revision}.py").write_text(
        textwrap.dedent(
            f'''
            """{revision}"""
            from alembic import op
            from flask_sqlqueue.migrate import downgrade_queue, upgrade_queue

            revision = "{revision}"
            down_revision = "{down}"
            branch_labels = None
            depends_on = None


            def upgrade():
                {upgrade}


            def downgrade():
                {downgrade}
            '''
        )
    )


def autogenerate(directory: Path, message: str) -> tuple[str, str]:
    """``flask db migrate``: the new revision's id and its text."""
    before = set((directory / "versions").glob("*.py"))
    flask_migrate.migrate(str(directory), message=message)
    (made,) = set((directory / "versions").glob("*.py")) - before
    text = made.read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("revision = ")]
    return line.split("'")[1], text


def test_one_flask_db_upgrade_brings_the_apps_tables_and_the_queues(
    tmp_path: Path, database_uri: str
) -> None:
    app, db, queue = make(tmp_path / "instance", database_uri)
    directory = tmp_path / "migrations"
    Migrate(app, db, directory=str(directory), include_name=exclude_queue_tables)
    try:
        with app.app_context():
            flask_migrate.init(str(directory))
            env = directory / "env.py"
            # Alembic's logging set-up would disable the loggers of the tests around it.
            # Flask-SQLAlchemy 3.1 warns of the template's first try (`db.get_engine()`).
            text = env.read_text().replace("fileConfig(config.config_file_name)", "pass")
            env.write_text(text.replace(".db.get_engine()", ".db.engine"))
            notes, text = autogenerate(directory, "notes")
            assert "create_table('notes'" in text
            # The app's history pins the queue's schema; a revision after it uses `op`
            # in the same run, so the outer run's proxies must survive the queue's.
            revision_file(
                directory,
                "queue1",
                notes,
                f'upgrade_queue("{schema.head()}")',
                'downgrade_queue("base")',
            )
            revision_file(
                directory,
                "seed1",
                "queue1",
                "op.execute(\"INSERT INTO notes (id, text) VALUES (1, 'seeded')\")",
                'op.execute("DELETE FROM notes")',
            )
            flask_migrate.upgrade(str(directory))

        assert {"notes", "sqlqueue_jobs", "sqlqueue_alembic_version"} <= table_names(database_uri)
        assert query(database_uri, "SELECT version_num FROM alembic_version") == [("seed1",)]
        assert query(database_uri, "SELECT version_num FROM sqlqueue_alembic_version") == [
            (schema.head(),)
        ]
        current = app.test_cli_runner().invoke(args=["queue", "db", "current"])
        assert current.output.strip() == f"{schema.head()} (head)"

        with app.app_context():
            job = queue.enqueue("count_notes")
        run_burst(queue.worker(WorkerOptions(grace=1.0), app), timeout=120)
        with app.app_context():
            done = queue.get_job(job.id)
        assert done is not None
        assert (done.status, done.result) == (JobStatus.COMPLETED, 1)

        with app.app_context():
            # Nothing changed in the app's models: no revision is written (Flask-Migrate's
            # env.py skips an empty one). Without the filter it would drop the queue's tables.
            before = sorted((directory / "versions").glob("*.py"))
            flask_migrate.migrate(str(directory), message="nothing")
            assert sorted((directory / "versions").glob("*.py")) == before
            flask_migrate.downgrade(str(directory), "base")
        left = table_names(database_uri)
        assert not {name for name in left if name.startswith("sqlqueue_jobs")}
        assert "notes" not in left
    finally:
        dispose(app, db)


def dispose(app: Flask, db: SQLAlchemy) -> None:
    with app.app_context():
        db.engine.dispose()
    app.extensions["sqlqueue"].store.engine.dispose()


def test_the_filter_keeps_only_the_apps_tables() -> None:
    assert exclude_queue_tables("notes", "table", {}) is True
    assert exclude_queue_tables("sqlqueue_jobs", "table", {}) is False
    assert exclude_queue_tables("sqlqueue_alembic_version", "table", {}) is False
    assert exclude_queue_tables("sqlqueue_ix", "index", {}) is True  # its table decides
    assert exclude_queue_tables(None, "schema", {}) is True

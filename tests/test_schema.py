"""The queue's schema: the start-up check, its own Alembic history, and SQLite's settings.

The schema tests run on every backend; the SQLite connection settings on SQLite only.

The tests use their own fixtures rather than conftest's ``app``/``app_ctx``: pytest-flask
pushes a request context for any test that asks for a fixture named ``app``.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from flask import Flask

from flask_sqlqueue import SchemaError
from flask_sqlqueue import schema
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import cron
from flask_sqlqueue.core import models
from flask_sqlqueue.core import periodic
from flask_sqlqueue.core.models import VERSION_TABLE
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import metadata
from flask_sqlqueue.core.options import EnqueueOptions
from flask_sqlqueue.core.producing import enqueue
from flask_sqlqueue.core.store import Store
from tests import sample_app
from tests.conftest import query
from tests.conftest import query_dicts
from tests.conftest import table_names
from tests.stores import store_of
from tests.waiting import WAIT

QUEUE_TABLES = {
    "sqlqueue_jobs",
    "sqlqueue_job_effects",
    "sqlqueue_workers",
    "sqlqueue_queues",
    "sqlqueue_limits",
    "sqlqueue_schedules",
    "sqlqueue_job_dependencies",
    "sqlqueue_batches",
    "sqlqueue_audit_log",
    "sqlqueue_job_tags",
    "sqlqueue_payloads",
}
HINT = "flask queue db upgrade"
EMPTY_PAYLOAD = '{"args":[],"kwargs":{}}'


def _db_path(database_uri: str) -> Path:
    return Path(database_uri.removeprefix("sqlite:///"))


def _sql(database_uri: str, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a fresh connection of its own and commit."""
    return query(database_uri, sql)


def _tables(database_uri: str) -> set[str]:
    return table_names(database_uri)


def _assert_refused_with(app: Flask, *fragments: str) -> None:
    """Producing and reading both fail with a SchemaError containing every fragment."""
    with app.app_context():
        with pytest.raises(SchemaError) as producing:
            sample_app.add.enqueue(1, 2)
        with pytest.raises(SchemaError) as reading:
            sample_app.queue.get_job(1)
    for error in (producing.value, reading.value):
        for fragment in fragments:
            assert fragment in str(error)


# -- the start-up check -------------------------------------------------------------------------


def test_missing_schema_says_how_to_create_it(make_app: Any, database_uri: str) -> None:
    app = make_app(upgrade=False)

    _assert_refused_with(app, "do not exist", HINT)

    assert not _tables(database_uri) & (QUEUE_TABLES | {VERSION_TABLE})  # the check wrote nothing
    sample_app.queue.upgrade_database(app=app)
    with app.app_context():
        assert sample_app.add.enqueue(1, 2).id == 1


def test_downgraded_schema_says_how_to_upgrade(make_app: Any, database_uri: str) -> None:
    upgraded = make_app()
    schema.downgrade(store_of(upgraded).engine, "base")
    assert VERSION_TABLE in _tables(database_uri)  # the version table stays, empty

    _assert_refused_with(make_app(upgrade=False), HINT)


@pytest.fixture
def newer_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This package with one more migration, as the next release will have; yields the
    revision the current release ends at."""
    previous = schema.head()
    scripts = tmp_path / "scripts"
    shutil.copytree(schema.migrations_dir(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "9999_probe.py").write_text(
        f'"""A probe revision.\n\nRevision ID: 9999\nRevises: {previous}\n"""\n\n'
        "from __future__ import annotations\n\n"
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        'revision = "9999"\n'
        f'down_revision = "{previous}"\n'
        "branch_labels = None\n"
        "depends_on = None\n\n\n"
        "def upgrade() -> None:\n"
        '    op.create_table("sqlqueue_probe", sa.Column("id", sa.Integer, primary_key=True))\n\n\n'
        "def downgrade() -> None:\n"
        '    op.drop_table("sqlqueue_probe")\n'
    )
    schema.head.cache_clear()
    monkeypatch.setattr(schema, "migrations_dir", lambda: scripts)
    yield previous
    monkeypatch.undo()
    schema.head.cache_clear()


def test_older_schema_says_how_to_upgrade(
    make_app: Any, database_uri: str, newer_package: str
) -> None:
    assert schema.head() == "9999"
    app = make_app(upgrade=False)
    schema.upgrade(store_of(app).engine, newer_package)  # what the previous release created

    _assert_refused_with(app, f"revision {newer_package}", "older", "(9999)", HINT)

    sample_app.queue.upgrade_database(app=app)
    assert schema.current(store_of(app).engine) == "9999"
    assert "sqlqueue_probe" in _tables(database_uri)
    with app.app_context():
        assert sample_app.add.enqueue(1, 2).id == 1


def test_unknown_revision_says_to_upgrade_the_package(make_app: Any, database_uri: str) -> None:
    make_app()
    _sql(database_uri, f"UPDATE {VERSION_TABLE} SET version_num = 'f00dcafe'")

    app = make_app(upgrade=False)
    # A revision this release does not know was written by a newer release: running this
    # release's `db upgrade` cannot help, so the message must not suggest it.
    _assert_refused_with(app, "f00dcafe", "newer", "upgrade the flask-sqlqueue package")
    with app.app_context(), pytest.raises(SchemaError) as info:
        sample_app.add.enqueue(1, 2)
    assert HINT not in str(info.value)


# -- the queue's own Alembic history ----------------------------------------------------------


def test_the_head_read_from_the_scripts_is_alembics(newer_package: str) -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(schema.migrations_dir()))
    assert schema.head() == ScriptDirectory.from_config(config).get_current_head() == "9999"
    assert schema._revisions()["9999"] == newer_package


def test_a_worker_process_does_not_load_alembic(tmp_path: Path) -> None:
    """The start-up check reads the version table itself; Alembic (with Mako and
    Pygments) is loaded only by the commands that change the schema."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    code = (
        "import sys\n"
        "from flask import Flask\n"
        "from flask_sqlqueue import SQLQueue\n"
        "def make():\n"
        "    app = Flask('probe')\n"
        f"    app.config['SQLQUEUE_DATABASE_URI'] = {url!r}\n"
        "    queue = SQLQueue(app)\n"
        "    queue.task(name='probe.noop')(lambda: None)\n"
        "    return app, queue\n"
        "app, queue = make()\n"
        "queue.upgrade_database(app=app)\n"
        "for name in [m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')]:\n"
        "    del sys.modules[name]\n"
        "app, queue = make()  # a fresh process's state: the schema not yet checked\n"
        "import flask_sqlqueue.cli\n"
        "with app.app_context():\n"
        "    job = queue.registry['probe.noop'].enqueue()\n"
        "queue.worker(app=app).run(burst=True)\n"
        "with app.app_context():\n"
        "    assert queue.get_job(job.id).status == 'completed', 'the job did not run'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_upgrade_downgrade_upgrade_leaves_the_apps_alembic_alone(
    make_app: Any, database_uri: str
) -> None:
    _sql(database_uri, "CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
    _sql(database_uri, "INSERT INTO alembic_version VALUES ('app_rev_7')")
    _sql(database_uri, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    _sql(database_uri, "INSERT INTO users VALUES (1, 'ada')")
    app = make_app(upgrade=False)
    engine = store_of(app).engine
    assert schema.current(engine) is None

    sample_app.queue.upgrade_database(app=app)
    assert _tables(database_uri) == QUEUE_TABLES | {VERSION_TABLE, "alembic_version", "users"}
    assert _sql(database_uri, f"SELECT version_num FROM {VERSION_TABLE}") == [(schema.head(),)]
    assert schema.current(engine) == schema.head()
    with app.app_context():
        sample_app.add.enqueue(1, 2)

    schema.downgrade(engine, "base")
    assert _tables(database_uri) == {VERSION_TABLE, "alembic_version", "users"}
    assert _sql(database_uri, f"SELECT version_num FROM {VERSION_TABLE}") == []
    assert schema.current(engine) is None

    sample_app.queue.upgrade_database(app=app)
    assert QUEUE_TABLES <= _tables(database_uri)
    assert schema.current(engine) == schema.head()
    assert _sql(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]
    with app.app_context():
        assert sample_app.add.enqueue(3, 4).args == [3, 4]

    # The app's own history and data were never touched.
    assert _sql(database_uri, "SELECT version_num FROM alembic_version") == [("app_rev_7",)]
    assert _sql(database_uri, "SELECT * FROM users") == [(1, "ada")]


def test_cli_db_commands_round_trip(make_app: Any, database_uri: str) -> None:
    app = make_app(upgrade=False)
    runner = app.test_cli_runner()

    result = runner.invoke(args=["queue", "db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert schema.head() in result.output
    assert QUEUE_TABLES <= _tables(database_uri)

    result = runner.invoke(args=["queue", "db", "downgrade", "base"])
    assert result.exit_code == 0, result.output
    assert not QUEUE_TABLES & _tables(database_uri)

    result = runner.invoke(args=["queue", "db", "current"])
    assert result.exit_code == 1
    assert HINT in result.output


def _differences(engine: sa.Engine) -> list[Any]:
    """What Alembic finds between the models and the database's schema."""
    with engine.connect() as conn:
        # The queue's version table is Alembic's own bookkeeping, not part of the models:
        # told its name, Alembic leaves it out of the comparison as it does when migrating.
        context = MigrationContext.configure(
            conn,
            opts={
                "version_table": VERSION_TABLE,
                "compare_type": True,
                "compare_server_default": True,
            },
        )
        return list(compare_metadata(context, metadata))


def test_models_match_the_migrations(make_app: Any) -> None:
    assert _differences(store_of(make_app()).engine) == []


def test_columns_have_the_collations_of_the_models(make_app: Any) -> None:
    # Alembic does not compare collations, on which exact keys depend on MariaDB/MySQL.
    engine = store_of(make_app()).engine
    inspector = sa.inspect(engine)
    checked = 0
    for table in metadata.sorted_tables:
        reflected = {
            column["name"]: getattr(column["type"], "collation", None)
            for column in inspector.get_columns(table.name)
        }
        for column in table.columns:
            wanted = getattr(column.type.dialect_impl(engine.dialect), "collation", None)
            if wanted is not None:
                assert reflected[column.name] == wanted, (table.name, column.name)
                checked += 1
    assert checked == (11 if engine.dialect.name == "mysql" else 0)


# Where each database shows an index's definition as it was created.
INDEX_DEFINITION = {
    "sqlite": "SELECT sql FROM sqlite_master WHERE name = 'ix_sqlqueue_jobs_claim'",
    "postgresql": "SELECT indexdef FROM pg_indexes "
    "WHERE indexname = 'ix_sqlqueue_jobs_claim' AND schemaname = current_schema()",
    "mysql": "SHOW CREATE TABLE sqlqueue_jobs",
}


def _assert_claim_index_descending(database_uri: str, backend: str) -> None:
    ((*_, sql),) = _sql(database_uri, INDEX_DEFINITION[backend])
    if backend == "mysql":
        (sql,) = [line for line in sql.splitlines() if "`ix_sqlqueue_jobs_claim`" in line]
        assert sql.strip().rstrip(",").endswith("(`status`,`priority` DESC,`run_at`,`id`)")
    else:  # and partial: finished jobs stay out of it
        assert "(status, priority DESC, run_at, id) WHERE" in sql
        assert sql.replace("(", "").replace(")", "").split(" WHERE ")[1].startswith("status")
        assert "'pending'" in sql


def test_migrations_create_the_claim_index_descending(
    make_app: Any, database_uri: str, backend: str
) -> None:
    make_app()
    _assert_claim_index_descending(database_uri, backend)


# Every index of the jobs table, by name, as the database shows its definition.
JOBS_INDEXES = {
    "sqlite": "SELECT name, sql FROM sqlite_master "
    "WHERE type = 'index' AND tbl_name = 'sqlqueue_jobs' AND sql IS NOT NULL",
    "postgresql": "SELECT indexname, replace(indexdef, current_schema() || '.', '') "
    "FROM pg_indexes WHERE tablename = 'sqlqueue_jobs' AND schemaname = current_schema()",
    "mysql": "SELECT index_name, group_concat(column_name, ' ', coalesce(collation, '') "
    "ORDER BY seq_in_index) FROM information_schema.statistics "
    "WHERE table_schema = database() AND table_name = 'sqlqueue_jobs' GROUP BY index_name",
}


def _jobs_indexes(database_uri: str, backend: str) -> dict[str, str]:
    return {
        str(name): " ".join(str(sql).split())
        for name, sql in _sql(database_uri, JOBS_INDEXES[backend])
    }


def test_migrations_define_each_index_as_the_models_do(
    make_app: Any, database_uri: str, other_database_uri: str, backend: str
) -> None:
    # Alembic's comparison passes over a partial index's WHERE: compare the definitions.
    make_app()
    engine = sa.create_engine(other_database_uri)
    models.use_dialect(engine.dialect.name)
    metadata.create_all(engine)
    engine.dispose()
    migrated = _jobs_indexes(database_uri, backend)
    assert migrated == _jobs_indexes(other_database_uri, backend)
    partial = {name for name, sql in migrated.items() if " WHERE " in sql}
    if backend == "mysql":  # no partial indexes there
        assert partial == set()
    else:
        assert partial == {
            "ix_sqlqueue_jobs_claim",
            "ix_sqlqueue_jobs_status_worker",
            "ix_sqlqueue_jobs_task_concurrency_key_status",
            "ix_sqlqueue_jobs_started_at",
            "ix_sqlqueue_jobs_batch_id",
            "uq_sqlqueue_jobs_unique_key",
        }


# -- job ids only grow ------------------------------------------------------------------------


def _delete(store: Store, ids: list[int]) -> None:
    """Delete jobs as the admin's delete (or a purge) does."""
    assert store.run_write(lambda conn: actions.delete(conn, ids)) == len(ids)


def test_the_id_of_a_deleted_job_is_never_given_again(make_app: Any) -> None:
    app = make_app()
    with app.app_context():
        given = [sample_app.add.enqueue(n, n).id for n in range(3)]
        _delete(store_of(app), given[1:])  # the newest ones: SQLite gave the largest id out again
        again = sample_app.add.enqueue(3, 3)
        assert again.id > max(given)
        given.append(again.id)
        _delete(store_of(app), [again.id])
        # Many jobs in one multi-row INSERT: each id is still its own call's.
        many = sample_app.add.enqueue_many([([n, 0], {}) for n in range(4)])
        ids = [job.id for job in many]
        assert ids == sorted(ids) and min(ids) > max(given)
        stored = [sample_app.queue.get_job(job_id) for job_id in ids]
        assert [job.args if job else None for job in stored] == [[n, 0] for n in range(4)]


@pytest.mark.sqlite_only
def test_sqlite_jobs_table_autoincrements_as_the_models_say(
    make_app: Any, database_uri: str
) -> None:
    make_app()
    ((sql,),) = _sql(database_uri, "SELECT sql FROM sqlite_master WHERE name = 'sqlqueue_jobs'")
    declared = str(sa.schema.CreateTable(jobs).compile(dialect=sa.dialects.sqlite.dialect()))
    for ddl in (sql, declared):
        assert "id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" in ddl


def _jobs(database_uri: str) -> list[dict[str, Any]]:
    """Every job's row, but for the columns added after 0004 (these jobs leave them at
    their defaults)."""
    rows = query_dicts(database_uri, "SELECT * FROM sqlqueue_jobs ORDER BY id")
    for row in rows:
        row.pop("has_dependents", None)
        row.pop("batch_id", None)
        row.pop("tags", None)
        row.pop("meta", None)
        row.pop("expires_at", None)
        row.pop("snoozes", None)
        row.pop("unique_key", None)
        row.pop("unique_key_freed", None)
        row.pop("crashes", None)
    return rows


def test_upgrade_to_growing_ids_keeps_every_job(
    make_app: Any, database_uri: str, backend: str
) -> None:
    """From 0004 with jobs in the table: every row is kept, the schema is the models',
    and no id given before (a purged job's, still named by its effect) is given again."""
    app = make_app(upgrade=False)
    store = store_of(app)
    schema.upgrade(store.engine, "0004")
    slots = [f"{cron.KEY_PREFIX}hourly:2024-06-03T{hour:02d}:00:00Z" for hour in (9, 11, 10)]
    given = [
        enqueue(store, "hourly", [(EMPTY_PAYLOAD, key, None)], EnqueueOptions())[0].id
        for key in slots
    ]
    given += [
        enqueue(store, "some.task", [(EMPTY_PAYLOAD, None, None)], EnqueueOptions())[0].id
        for _ in range(3)
    ]
    with store.write() as conn:
        store.ops.insert_effect(conn, "mail:1", given[-1], store.now())
    # As a version of that schema deleted them (this one also deletes their dependencies,
    # a table that schema does not have).
    _sql(database_uri, f"DELETE FROM sqlqueue_jobs WHERE id IN ({given[-2]}, {given[-1]})")
    kept = _jobs(database_uri)
    assert len(kept) == 4

    sample_app.queue.upgrade_database(app=app)
    assert _jobs(database_uri) == kept
    assert _differences(store.engine) == []
    _assert_claim_index_descending(database_uri, backend)
    # The ledger starts at each task's newest periodic slot, whatever the insert order.
    with store.read() as conn:
        assert periodic.last_slots(conn, ["hourly", "some.task"]) == {
            "hourly": datetime(2024, 6, 3, 11, tzinfo=UTC)
        }
    newer = enqueue(store, "some.task", [(EMPTY_PAYLOAD, None, None)], EnqueueOptions())[0].id
    assert newer > max(given)
    given.append(newer)
    kept = _jobs(database_uri)

    schema.downgrade(store.engine, "0004")
    assert _jobs(database_uri) == kept
    assert "sqlqueue_schedules" not in _tables(database_uri)
    schema.upgrade(store.engine)
    assert _jobs(database_uri) == kept
    assert _differences(store.engine) == []
    _assert_claim_index_descending(database_uri, backend)
    with app.app_context():
        assert sample_app.add.enqueue(1, 2).id > max(given)


def test_downgrading_big_payloads_puts_them_back_in_their_rows(
    make_app: Any, database_uri: str
) -> None:
    """0017's downgrade moves every payload kept outside back into its job's row, then
    drops the table; upgrading again leaves the rows as they are."""
    app = make_app({"SQLQUEUE_INLINE_PAYLOAD_LIMIT": 100})
    store = store_of(app)
    big = '{"args":["' + "x" * 300 + '"],"kwargs":{}}'
    outside = enqueue(store, "some.task", [(big, None, None)], EnqueueOptions())[0].id
    inline = enqueue(store, "some.task", [(EMPTY_PAYLOAD, None, None)], EnqueueOptions())[0].id
    assert _sql(database_uri, "SELECT job_id FROM sqlqueue_payloads") == [(outside,)]
    schema.downgrade(store.engine, "0016")
    assert "sqlqueue_payloads" not in _tables(database_uri)
    payloads = _sql(database_uri, "SELECT id, payload FROM sqlqueue_jobs ORDER BY id")
    assert payloads == [(outside, big), (inline, EMPTY_PAYLOAD)]
    schema.upgrade(store.engine)
    assert _differences(store.engine) == []
    assert _sql(database_uri, "SELECT payload FROM sqlqueue_payloads") == []
    assert store.get_job(outside).args == ["x" * 300]  # type: ignore[union-attr]


# -- SQLite connection settings ------------------------------------------------------------------


def _pragma(conn: sa.Connection, name: str) -> Any:
    return conn.exec_driver_sql(f"PRAGMA {name}").scalar()


@pytest.mark.sqlite_only
def test_sqlite_pragmas_by_default(make_app: Any) -> None:
    store = store_of(make_app())
    with store.write() as writer:
        assert _pragma(writer, "journal_mode") == "wal"
        assert _pragma(writer, "synchronous") == 2  # FULL
        assert _pragma(writer, "busy_timeout") == 30000
    with store.read() as reader:
        assert _pragma(reader, "journal_mode") == "wal"
        assert _pragma(reader, "synchronous") == 2
        assert _pragma(reader, "busy_timeout") == 30000


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("setting", "level"), [("NORMAL", 1), ("normal", 1), ("OFF", 0), ("EXTRA", 3), ("FULL", 2)]
)
def test_sqlite_synchronous_follows_the_config(make_app: Any, setting: str, level: int) -> None:
    store = store_of(
        make_app({"SQLQUEUE_SQLITE_SYNCHRONOUS": setting, "SQLQUEUE_SQLITE_BUSY_TIMEOUT": 2.5})
    )
    with store.write() as writer:
        assert _pragma(writer, "synchronous") == level
        assert _pragma(writer, "busy_timeout") == 2500
    with store.read() as reader:
        assert _pragma(reader, "synchronous") == level


@pytest.mark.sqlite_only
def test_writes_begin_immediate_and_reads_begin_deferred(make_app: Any) -> None:
    store = store_of(make_app())
    seen: list[str] = []

    def log(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", log)
    try:
        with store.write() as conn:
            conn.exec_driver_sql("SELECT 1")
        writes, seen[:] = list(seen), []
        with store.read() as conn:
            conn.exec_driver_sql("SELECT 1")
        reads = list(seen)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", log)
    assert writes == ["BEGIN IMMEDIATE", "SELECT 1"]
    assert reads == ["BEGIN", "SELECT 1"]


@pytest.fixture
def two_stores(make_app: Any) -> tuple[Store, Store]:
    """Two apps on one database file; the second gives up on a busy database after 0.2 s."""
    holder = store_of(make_app())
    impatient = store_of(make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.2}))
    return holder, impatient


@pytest.mark.sqlite_only
def test_write_lock_is_taken_at_begin(two_stores: tuple[Store, Store], database_uri: str) -> None:
    holder, impatient = two_stores
    entered = False
    with holder.write():  # BEGIN IMMEDIATE and nothing else: no row written yet
        started = time.monotonic()
        with pytest.raises(sa.exc.OperationalError, match="database is locked"):
            with impatient.write():
                entered = True
        waited = time.monotonic() - started

        # Contrast: a deferred BEGIN takes no lock, so it gets past BEGIN and fails only
        # at its first write. The queue's writers never get that far without the lock.
        with contextlib.closing(
            sqlite3.connect(_db_path(database_uri), timeout=0.1, isolation_level=None)
        ) as deferred:
            deferred.execute("BEGIN")
            assert deferred.execute("SELECT count(*) FROM sqlqueue_jobs").fetchone() == (0,)
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                deferred.execute(
                    "INSERT INTO sqlqueue_workers (id, host, pid, queues, concurrency, "
                    "started_at, last_heartbeat_at) VALUES ('w', 'h', 1, '', 1, '2030-01-01', "
                    "'2030-01-01')"
                )
            deferred.execute("ROLLBACK")
    assert not entered
    assert waited >= 0.15  # it waited its busy timeout at BEGIN, then gave up

    with impatient.write() as conn:  # free again
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1


@pytest.mark.sqlite_only
def test_second_writer_waits_at_begin_until_the_first_commits(
    make_app: Any,
) -> None:
    holder = store_of(make_app())
    patient = store_of(make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 10}))
    committed_at: list[float] = []
    entered_at: list[float] = []
    holding = threading.Event()

    def hold() -> None:
        with holder.write():
            holding.set()
            time.sleep(0.4)
            committed_at.append(time.monotonic())

    thread = threading.Thread(target=hold, name="test-lock-holder")
    thread.start()
    try:
        assert holding.wait(WAIT)
        with patient.write():
            entered_at.append(time.monotonic())
    finally:
        thread.join(WAIT)
    assert committed_at and entered_at
    assert entered_at[0] >= committed_at[0]


def test_reads_do_not_wait_for_a_writer(two_stores: tuple[Store, Store]) -> None:
    holder, impatient = two_stores
    with holder.write() as conn:
        options = EnqueueOptions(session=conn)
        (job,) = enqueue(holder, "some.task", [(EMPTY_PAYLOAD, None, None)], options)
        # A read that waited for the lock would fail after its 0.2 s busy timeout with
        # "database is locked"; these see the last committed state, without the new row.
        with impatient.read() as reader:
            count = reader.exec_driver_sql("SELECT count(*) FROM sqlqueue_jobs").scalar()
        assert impatient.get_job(job.id) is None
    assert count == 0
    assert impatient.get_job(job.id) is not None


@pytest.mark.sqlite_only
def test_sqlite_without_returning_is_refused_at_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    from flask_sqlqueue import ConfigurationError
    from flask_sqlqueue.config import Settings

    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 31, 1))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.31.1")
    settings = Settings.from_mapping(
        {"SQLQUEUE_DATABASE_URI": f"sqlite:///{tmp_path / 'q.db'}"}, str(tmp_path)
    )
    with pytest.raises(ConfigurationError, match=r"SQLite 3\.31\.1 is too old.*3\.35"):
        Store.from_settings(settings)


def test_upgrade_counts_every_rescue_so_far_as_a_crash(make_app: Any, database_uri: str) -> None:
    """0019 adds ``crashes``, the crash budget spent: at the upgrade, every rescue so far
    counts, as it did when the budget read ``rescues``; a downgrade drops the column."""
    app = make_app(upgrade=False)
    store = store_of(app)
    schema.upgrade(store.engine, "0018")
    ids = [
        enqueue(store, "some.task", [(EMPTY_PAYLOAD, None, None)], EnqueueOptions())[0].id
        for _ in range(2)
    ]
    _sql(database_uri, f"UPDATE sqlqueue_jobs SET rescues = 2 WHERE id = {ids[0]}")
    schema.upgrade(store.engine)
    counted = {job_id: store.get_job(job_id) for job_id in ids}
    assert [(j.rescues, j.crashes) for j in counted.values() if j] == [(2, 2), (0, 0)]
    schema.downgrade(store.engine, "0018")
    assert "crashes" not in query_dicts(database_uri, "SELECT * FROM sqlqueue_jobs")[0]

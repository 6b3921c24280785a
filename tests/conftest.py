"""Fixtures shared by every test module.

Every test that touches the database runs once per backend: ``[sqlite]`` always, and
``[postgresql]`` / ``[mysql]`` when ``SQLQUEUE_TEST_POSTGRES_URL`` /
``SQLQUEUE_TEST_MYSQL_URL`` are set (an unset URL skips those runs; a set URL whose
server cannot be reached fails them). Each run gets a database of its own: a SQLite
file, a fresh schema on PostgreSQL, a fresh database on MariaDB/MySQL, all dropped
afterwards. ``@pytest.mark.sqlite_only`` keeps a test that is about SQLite itself
(PRAGMAs, ``BEGIN IMMEDIATE``, file paths) to the ``[sqlite]`` run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.pool import NullPool

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import schema
from flask_sqlqueue.config import Settings
from flask_sqlqueue.core.store import Store
from tests import sample_app
from tests.waiting import scaled

# Fixtures that live beside the apps they build, for every test module.
pytest_plugins = ["tests.control_app", "tests.workflow_app", "tests.limits_fixtures"]

ROOT = Path(__file__).resolve().parent.parent
SERVER_URL_VARS = {"postgresql": "SQLQUEUE_TEST_POSTGRES_URL", "mysql": "SQLQUEUE_TEST_MYSQL_URL"}
BACKENDS = ("sqlite", *SERVER_URL_VARS)


# -- one database per test, on every backend --------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that uses ``database_uri`` (directly or through ``make_app``,
    ``sq_app``, ``ctx``...) once per backend, or on SQLite alone if marked ``sqlite_only``."""
    if "database_uri" in metafunc.fixturenames:
        sqlite_only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize(
            "database_uri",
            [_backend_param(kind) for kind in (["sqlite"] if sqlite_only else BACKENDS)],
            indirect=True,
        )


def _backend_param(kind: str) -> Any:
    var = SERVER_URL_VARS.get(kind)
    if var is None or os.environ.get(var):
        return pytest.param(kind, id=kind)
    # Skipped by a mark rather than from the fixture, so the summary folds them into one
    # line per module.
    return pytest.param(kind, id=kind, marks=pytest.mark.skip(f"set {var} to run against {kind}"))


def server_url(kind: str) -> sa.URL:
    """The URL of the server ``kind`` from the environment; skips the test if unset."""
    var = SERVER_URL_VARS[kind]
    url = os.environ.get(var)
    if not url:
        pytest.skip(f"set {var} to run against {kind}")
    return sa.make_url(url)


_admins: dict[str, sa.Engine] = {}


def _admin(url: sa.URL) -> sa.Engine:
    """An autocommit engine on the server's own database, shared by the whole session."""
    key = url.render_as_string(hide_password=False)
    if key not in _admins:
        _admins[key] = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    return _admins[key]


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _admins:
        _admins.popitem()[1].dispose()


@contextmanager
def fresh_database(kind: str, *, schema: bool = False) -> Iterator[str]:
    """A new, empty database on server ``kind`` for one test; dropped afterwards.

    With ``schema=True`` on PostgreSQL it is a fresh schema in the server's database
    instead, named first in the ``search_path`` of every connection made from the URL
    (twice as fast to create and migrate; the queue sees an empty database either way).
    Leftover connections are ended before the drop, so a test that leaked one (or a
    worker process still running) cannot make the drop wait. The server must be
    reachable: if it is not, this raises and the test fails.
    """
    base = server_url(kind)
    admin = _admin(base)
    name = f"sqlqueue_test_{uuid.uuid4().hex[:12]}"
    if kind == "postgresql" and schema:
        url = base.update_query_dict({"options": f"-csearch_path={name}", "application_name": name})
        create, drop = f"CREATE SCHEMA {name}", f"DROP SCHEMA IF EXISTS {name} CASCADE"
        leftovers = (
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE application_name = '{name}' AND pid <> pg_backend_pid()"
        )
    elif kind == "postgresql":
        url = base.set(database=name)
        create, drop = f"CREATE DATABASE {name}", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        leftovers = ""  # WITH (FORCE) ends them
    else:
        url = base.set(database=name)
        # Upstream MariaDB's default character set, not the utf8mb4 some distributions
        # configure: the queue's tables must not depend on the server's defaults.
        create = f"CREATE DATABASE {name} CHARACTER SET latin1 COLLATE latin1_swedish_ci"
        drop = f"DROP DATABASE IF EXISTS {name}"
        leftovers = f"SELECT id FROM information_schema.processlist WHERE db = '{name}'"
    with admin.connect() as conn:
        conn.exec_driver_sql(create)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if kind == "mysql":
                for (pid,) in conn.exec_driver_sql(leftovers).all():
                    with contextlib.suppress(sa.exc.OperationalError):  # gone meanwhile
                        conn.exec_driver_sql(f"KILL CONNECTION {int(pid)}")
                conn.exec_driver_sql("SET SESSION lock_wait_timeout = 30")
            else:
                if leftovers:
                    conn.exec_driver_sql(leftovers)
                conn.exec_driver_sql("SET lock_timeout = '30s'")
            # A lock still held elsewhere fails the test's teardown instead of hanging it.
            conn.exec_driver_sql(drop)


@pytest.fixture
def database_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database on the backend this run of the test is for."""
    kind = getattr(request, "param", "sqlite")
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'queue.db'}"
        return
    with fresh_database(kind, schema=True) as uri:
        yield uri


@pytest.fixture
def backend(database_uri: str) -> str:
    """``"sqlite"``, ``"postgresql"`` or ``"mysql"``: the backend of ``database_uri``."""
    return sa.make_url(database_uri).get_backend_name()


@pytest.fixture
def other_database_uri(backend: str, tmp_path: Path) -> Iterator[str]:
    """A second fresh database on the same backend (a real database, not a schema)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'other.db'}"
        return
    with fresh_database(backend) as uri:
        yield uri


@pytest.fixture(params=sorted(SERVER_URL_VARS))
def server_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database on each server, for tests about what only the servers do."""
    with fresh_database(request.param) as uri:
        yield uri


def query(database_uri: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a connection of its own and commit: sees exactly what is committed,
    bypassing the queue's code and types."""
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(sql), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def query_dicts(database_uri: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Like :func:`query`, each row as a ``{column: value}`` dict."""
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            return [dict(row._mapping) for row in conn.execute(sa.text(sql), params)]
    finally:
        engine.dispose()


def table_names(database_uri: str) -> set[str]:
    """The tables in the database (on PostgreSQL: in the test's own schema)."""
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- the queue's schema, fast ------------------------------------------------------------------

# What ``schema.upgrade`` writes to an empty database, recorded once per backend and session.
_MIGRATION_WRITES = ("CREATE", "ALTER", "INSERT", "UPDATE", "DELETE", "DROP", "COMMENT")
_migration_scripts: dict[str, list[tuple[str, Any]]] = {}


def _migration_script(kind: str) -> list[tuple[str, Any]]:
    """The statements (with their parameters) of one real run of the migrations on an
    empty database of server ``kind``: every write, none of Alembic's look-ups."""
    if kind not in _migration_scripts:
        with fresh_database(kind, schema=True) as scratch:
            engine = sa.create_engine(scratch, poolclass=NullPool)
            script: list[tuple[str, Any]] = []

            @sa.event.listens_for(engine, "before_cursor_execute")
            def _record(
                conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any
            ) -> None:
                if statement.lstrip().upper().startswith(_MIGRATION_WRITES):
                    script.append((statement, parameters))

            schema.upgrade(engine)
            engine.dispose()
        _migration_scripts[kind] = script
    return _migration_scripts[kind]


def install_schema(database_uri: str) -> None:
    """Put the queue's tables at head in an empty server database: the statements the
    migrations ran on one database of this server earlier in the session, replayed in one
    transaction, without Alembic's start-up and look-ups (twice as fast on PostgreSQL).
    The migrations themselves run for real in test_schema.py and test_cli.py."""
    kind = sa.make_url(database_uri).get_backend_name()
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for statement, parameters in _migration_script(kind):
                conn.exec_driver_sql(statement, parameters)
    finally:
        engine.dispose()


@pytest.fixture
def core_store(database_uri: str) -> Iterator[Store]:
    """A bare :class:`Store` on the test's database, schema in place: the core, no Flask."""
    store = Store.from_settings(Settings(database_uri=database_uri))
    if store.engine.dialect.name == "sqlite":
        schema.upgrade(store.engine)
    else:
        install_schema(database_uri)
    yield store
    store.engine.dispose()


# -- the sample app --------------------------------------------------------------------------


def apps_on(
    database_uri: str,
    create_app: Callable[[dict[str, Any]], Flask],
    queue: SQLQueue,
    instance_path: Path | None = None,
) -> Iterator[Callable[..., Flask]]:
    """Build apps of ``create_app`` on the test's database with the schema in place, and
    let go of their engines at the end (the body of an app-making fixture).

    On a server the first app with ``upgrade=True`` gets the tables by
    :func:`install_schema` (the database is still empty then). Every other one runs the
    real migrations through the queue's own engine: on SQLite that also leaves the file
    in WAL mode, as ``flask queue db upgrade`` does; at head they are a no-op, and they
    redo whatever a test downgraded in between.
    """
    made: list[Flask] = []
    fast = not database_uri.startswith("sqlite")

    def make(config: dict[str, Any] | None = None, *, upgrade: bool = True) -> Flask:
        replay = upgrade and fast and not made
        if replay:
            install_schema(database_uri)
        app = create_app({"SQLQUEUE_DATABASE_URI": database_uri, **(config or {})})
        if instance_path is not None:
            app.instance_path = str(instance_path)
        if upgrade and not replay:
            queue.upgrade_database(app=app)
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["sqlqueue"].store.engine.dispose()


@pytest.fixture
def make_app(database_uri: str, tmp_path: Path) -> Iterator[Callable[..., Flask]]:
    """Build the sample app on the test's database with the schema in place
    (:func:`apps_on`)."""
    yield from apps_on(database_uri, sample_app.create_app, sample_app.queue, tmp_path / "instance")


# Not called `app`: pytest-flask, a test dependency, pushes a request context around
# every test that uses a fixture of that name, which the leak detector would report.
@pytest.fixture
def sq_app(make_app: Any) -> Flask:
    """The sample app on a fresh database, schema in place."""
    return make_app()  # type: ignore[no-any-return]


@pytest.fixture
def ctx(sq_app: Flask) -> Iterator[Flask]:
    """``sq_app`` with its app context pushed."""
    with sq_app.app_context():
        yield sq_app


@pytest.fixture
def queue() -> Any:
    return sample_app.queue


def flask_env(database_uri: str, **extra: str) -> dict[str, str]:
    """Environment for a `flask --app tests.sample_app ...` subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
    env.update(
        FLASK_APP="tests.sample_app:create_app",
        SAMPLE_DATABASE_URI=database_uri,
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        **extra,
    )
    return env


def run_flask(
    database_uri: str, *args: str, timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flask", *args],
        env=flask_env(database_uri, **extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def leak_detector() -> Iterator[None]:
    """Fail a test that leaves an app context pushed or worker threads running. (A
    context pushed before the test, as pytest-flask does around a test that uses its
    ``app`` fixture, is its pusher's to pop.)"""
    from flask.globals import _cv_app

    before = _cv_app.get(None)
    yield
    leaked_ctx = _cv_app.get(None) is not before
    while _cv_app.get(None) not in (None, before):  # leave the next test a clean slate
        _cv_app.get().pop()
    deadline = time.monotonic() + scaled(15)
    alive: list[str] = []
    while time.monotonic() < deadline:
        alive = [
            t.name for t in threading.enumerate() if t.name.startswith("sqlqueue-") and t.is_alive()
        ]
        if not alive:
            break
        time.sleep(0.05)
    assert not leaked_ctx, "the test left an app context pushed"
    assert not alive, f"worker threads still running after the test: {alive}"

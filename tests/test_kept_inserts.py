"""A plain one-job enqueue runs on a driver connection the store keeps for it
(core/inserts.py); every other job goes through the engine. Either way the row is the
same, the workers are told, a connection the server ended is replaced, a forked child
never uses its parent's, and disposing of the engine lets go of them all."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import Unique
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.store import Store
from tests import sample_app
from tests.conftest import query
from tests.stores import store_of
from tests.test_fork import in_child
from tests.test_wait import c_statements as engine_statements


def inserts(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("INSERT INTO SQLQUEUE_JOBS")]


def session_id(dbapi_connection: Any, backend: str) -> Any:
    """The server's id of a driver connection; on SQLite, the object's own."""
    if backend == "sqlite":
        return id(dbapi_connection)
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(
            "SELECT pg_backend_pid()" if backend == "postgresql" else "SELECT CONNECTION_ID()"
        )
        return cursor.fetchone()[0]
    finally:
        cursor.close()


def usable(dbapi_connection: Any) -> bool:
    """Whether a driver connection still runs a statement (a closed one raises)."""
    try:
        cursor = dbapi_connection.cursor()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        cursor.close()
    except Exception:  # each driver its own error for a closed connection
        return False
    return True


def kept_sessions(store: Store, backend: str) -> list[Any]:
    assert store._kept is not None
    return [session_id(conn, backend) for conn in store._kept._idle]


def test_a_plain_job_is_written_on_a_kept_connection_as_the_engine_would_write_it(
    ctx: Flask, backend: str
) -> None:
    store = store_of(ctx)
    due = datetime.now(UTC) + timedelta(minutes=5)
    with engine_statements(store) as statements:
        made = sample_app.report.using(run_at=due, priority=9).enqueue(4)
    assert inserts(statements) == []  # not through the engine
    assert store._kept is not None and len(store._kept._idle) == 1
    read = sample_app.queue.get_job(made.id)
    assert read is not None
    for field in (
        "id", "queue", "task", "args", "kwargs", "status", "attempts", "max_attempts",
        "priority", "idempotency_key", "rescues", "releases", "tags", "meta",
    ):  # fmt: skip
        assert getattr(read, field) == getattr(made, field), field
    assert (read.queue, read.priority, read.max_attempts) == ("reports", 9, 7)
    assert abs(read.run_at - due) < timedelta(milliseconds=1)
    assert abs(read.created_at - made.created_at) < timedelta(milliseconds=1)

    # The next one takes the same connection; a worker runs both.
    second = sample_app.add.enqueue(2, 3)
    assert second.id > made.id and len(store._kept._idle) == 1
    sample_app.queue.worker(WorkerOptions(grace=1), ctx).run(burst=True)
    done = sample_app.queue.get_job(second.id)
    assert done is not None and done.status is JobStatus.COMPLETED and done.result == 5


OPTIONS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "idempotency key": lambda _c: {"idempotency_key": "k-1"},
    "tags": lambda _c: {"tags": ["red"]},
    "meta": lambda _c: {"meta": {"user": 7}},
    "expiry": lambda _c: {"expires": 600},
    "unique": lambda _c: {"unique": Unique()},
    "dependency": lambda first: {"depends_on": [first]},
}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_a_job_with_more_than_a_plain_row_is_written_through_the_engine(
    ctx: Flask, option: str
) -> None:
    store = store_of(ctx)
    first = sample_app.add.enqueue(0, 0)
    with engine_statements(store) as statements:
        made = sample_app.add.using(**OPTIONS[option](first)).enqueue(1, 2)
    assert len(inserts(statements)) == 1, statements
    read = sample_app.queue.get_job(made.id)
    assert read is not None and read.args == [1, 2]
    assert (read.tags, read.meta, read.idempotency_key) == (
        made.tags,
        made.meta,
        made.idempotency_key,
    )


def test_a_big_payload_and_a_callers_transaction_go_through_the_engine(ctx: Flask) -> None:
    store = store_of(ctx)
    big = "x" * (store.settings.inline_payload_limit + 1)
    with engine_statements(store) as statements:
        kept_out = sample_app.echo.enqueue(big)
    assert len(inserts(statements)) == 1
    read = sample_app.queue.get_job(kept_out.id)
    assert read is not None and read.args == [big]

    with store.engine.connect() as conn, engine_statements(store) as statements:
        with conn.begin() as transaction:
            rolled_back = sample_app.add.using(session=conn).enqueue(1, 1)
            transaction.rollback()
    assert len(inserts(statements)) == 1
    assert sample_app.queue.get_job(rolled_back.id) is None  # the caller's, rolled back


def end_session(database_uri: str, backend: str, session: Any) -> None:
    if backend == "postgresql":
        assert query(database_uri, "SELECT pg_terminate_backend(:pid)", pid=session) == [(True,)]
    else:
        query(database_uri, f"KILL CONNECTION {int(session)}")


def test_a_kept_connection_the_server_ended_is_replaced_and_nothing_is_written_twice(
    ctx: Flask, database_uri: str, backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite's connection is a file opened here: no server ends it")
    store = store_of(ctx)
    first = sample_app.add.enqueue(1, 1)
    assert store._kept is not None
    [conn] = store._kept._idle
    [session] = kept_sessions(store, backend)
    end_session(database_uri, backend, session)
    # Ended while idle: the next enqueue sees it (without a round trip) before using it.
    deadline = datetime.now(UTC) + timedelta(seconds=30)
    while store.ops.kept_alive(conn):
        assert datetime.now(UTC) < deadline, "the ended connection still looks alive"
    second = sample_app.add.enqueue(2, 2)
    assert second.id > first.id
    assert store._kept._idle and store._kept._idle[0] is not conn
    assert kept_sessions(store, backend) != [session]
    rows = query(database_uri, "SELECT id FROM sqlqueue_jobs ORDER BY id")
    assert rows == [(first.id,), (second.id,)]


def test_a_forked_child_enqueues_on_connections_of_its_own(make_app: Any, backend: str) -> None:
    app = make_app()
    store = store_of(app)
    with app.app_context():
        first = sample_app.add.enqueue(1, 2)
    parent = kept_sessions(store, backend)

    def child() -> dict[str, Any]:
        with app.app_context():
            made = sample_app.add.enqueue(3, 4)
        return {"made": made.id, "sessions": kept_sessions(store, backend)}

    report = in_child(child)
    assert report["made"] > first.id
    assert report["sessions"] and set(report["sessions"]).isdisjoint(parent)
    # The parent's connection is still its own, and works.
    assert kept_sessions(store, backend) == parent
    with app.app_context():
        third = sample_app.add.enqueue(5, 6)
    assert third.id > report["made"] and kept_sessions(store, backend) == parent


def test_disposing_of_the_engine_closes_the_kept_connections(ctx: Flask, backend: str) -> None:
    store = store_of(ctx)
    sample_app.add.enqueue(1, 1)
    assert store._kept is not None
    [conn] = store._kept._idle
    assert usable(conn)
    store.engine.dispose()
    assert store._kept._idle == []
    assert not usable(conn)
    # The store goes on: the next enqueue opens another.
    assert sample_app.add.enqueue(2, 2).id > 0
    assert len(store._kept._idle) == 1 and store._kept._idle[0] is not conn


def test_while_every_kept_connection_is_in_use_an_enqueue_goes_through_the_engine(
    make_app: Any, database_uri: str
) -> None:
    app = make_app({"SQLQUEUE_ENGINE_OPTIONS": {"pool_size": 2}})
    store = store_of(app)
    with app.app_context():
        sample_app.add.enqueue(0, 0)
        kept = store._kept
        assert kept is not None and kept.keep == 2
        busy = [kept._take(), kept._take()]  # as two enqueues running would hold them
        with engine_statements(store) as statements:
            made = sample_app.add.enqueue(1, 1)
        assert len(inserts(statements)) == 1
        assert kept._take() is None and kept._open == 2
        for conn in busy:
            kept._idle.append(conn)

    # Twelve threads at once: every job written once, never more than two kept.
    made_ids: list[int] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with app.app_context():
                for i in range(20):
                    made_ids.append(sample_app.add.enqueue(n, i).id)
                    assert kept._open <= 2
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert len(made_ids) == len(set(made_ids)) == 240
    rows = query(database_uri, "SELECT id FROM sqlqueue_jobs WHERE id > :m", m=made.id)
    assert sorted(r[0] for r in rows) == sorted(made_ids)

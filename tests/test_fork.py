"""A process forked after it used the queue (gunicorn ``--preload``, uWSGI) gets
connections of its own, and its parent's keep working.

Parent and child sharing one connection interleave their statements on it: each may
read the other's answers, and one's end of the session ends the other's. A lock held
by one of the parent's threads at the fork would stay held in the child for good.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import warnings
from typing import Any

import pytest
from flask import Flask

from tests import sample_app

WAIT = 60.0


def session_of(conn: Any, backend: str) -> Any:
    """Who the database thinks this connection is: the server's session id; on SQLite,
    the connection object itself (inherited ones keep their address in the child)."""
    if backend == "postgresql":
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    if backend == "mysql":
        return conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar_one()
    return id(conn.connection.dbapi_connection)


def in_child(work: Any) -> dict[str, Any]:
    """Run ``work()`` in a forked child; what it returns (JSON), or the error it raised."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded process"
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            report = {"result": work()}
        except BaseException as exc:
            report = {"error": repr(exc)}
        os.write(write_end, json.dumps(report).encode())
        os._exit(0)
    os.close(write_end)
    data = b""
    deadline = time.monotonic() + WAIT
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], deadline - time.monotonic())
            chunk = os.read(read_end, 65536) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
    if time.monotonic() >= deadline:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert data, f"the child said nothing within {WAIT}s"
    report: dict[str, Any] = json.loads(data)
    assert "error" not in report, report["error"]
    return report["result"]  # type: ignore[no-any-return]


def test_a_forked_child_uses_connections_of_its_own(
    make_app: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    # A short wait for SQLite's write lock: a child stuck on the parent's lock fails fast.
    app: Flask = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 3})
    store = app.extensions["sqlqueue"].store
    with app.app_context():
        first = sample_app.add.enqueue(1, 2)  # the pool holds a connection now
    writer = store.writer()  # a connection kept outside the pool, as a worker's claims do
    request.addfinalizer(writer.close)
    with writer.begin() as conn:
        parent_writer = session_of(conn, backend)
    with store.read() as conn:  # the one connection left in the pool
        parent = session_of(conn, backend)

    # One of the parent's threads is writing when the fork happens.
    writing, done = threading.Event(), threading.Event()

    def write_on() -> None:
        with store._writer_turn():
            writing.set()
            done.wait(WAIT)

    holder = threading.Thread(target=write_on, name="test-writer")
    holder.start()
    writing.wait(WAIT)

    def child() -> dict[str, Any]:
        with app.app_context():
            made = sample_app.add.enqueue(3, 4)
            seen = [sample_app.queue.get_job(i).id for i in (first.id, made.id)]  # type: ignore[union-attr]
        with store.read() as conn:
            session = session_of(conn, backend)
        with writer.begin() as conn:
            writer_session = session_of(conn, backend)
        return {"made": made.id, "seen": seen, "session": session, "writer": writer_session}

    try:
        report = in_child(child)
    finally:
        done.set()
        holder.join(WAIT)
    assert report["seen"] == [first.id, report["made"]]
    assert report["session"] != parent
    assert report["writer"] != parent_writer

    # The parent goes on with the same connections, undisturbed.
    with store.read() as conn:
        assert session_of(conn, backend) == parent
    with writer.begin() as conn:
        assert session_of(conn, backend) == parent_writer
    with app.app_context():
        made = sample_app.queue.get_job(report["made"])
        assert made is not None and made.result is None and made.args == [3, 4]
        assert sample_app.add.enqueue(5, 6).id > made.id

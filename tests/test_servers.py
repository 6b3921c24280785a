"""What only the server databases do, on PostgreSQL and MariaDB when their URLs are set.

Everything else runs on every backend through conftest's parametrized ``database_uri``;
these tests are about row locks, server connections and the test set-up itself. Each
gets a database of its own (conftest's ``server_uri``), dropped afterwards. A URL that
is set but cannot be reached fails them; only an unset URL skips.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim as claim_jobs
from flask_sqlqueue.core.models import utcnow
from tests import sample_app
from tests.conftest import SERVER_URL_VARS
from tests.conftest import fresh_database
from tests.waiting import WAIT
from tests.waiting import wait_for


@pytest.fixture
def server_app(server_uri: str) -> Iterator[Any]:
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": server_uri})
    sample_app.queue.upgrade_database(app=app)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


@pytest.mark.parametrize("kind", sorted(SERVER_URL_VARS))
def test_a_set_but_unreachable_server_fails_the_test(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing listens on port 1: the database cannot be created, and that is an error
    # for the test that asked for it, never a skip.
    scheme = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}[kind]
    monkeypatch.setenv(SERVER_URL_VARS[kind], f"{scheme}://root@127.0.0.1:1/test")
    with pytest.raises(sa.exc.OperationalError):
        with fresh_database(kind):
            pytest.fail("a database was made on a server that is not there")


# Make a wait for a row lock fail after about a second instead of hanging the test.
IMPATIENT = {
    "postgresql": "SET LOCAL lock_timeout = '1s'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = 1",
}


def test_a_claim_skips_jobs_another_claim_holds_instead_of_waiting(server_app: Flask) -> None:
    store = sample_app.queue.state(server_app).store
    with server_app.app_context():
        first = sample_app.add.enqueue(1, 1)
        second = sample_app.add.enqueue(2, 2)

    def claim(conn: sa.Connection, worker: str, limit: int) -> list[int]:
        rows = claim_jobs(
            conn,
            store.ops,
            ClaimRequest(
                worker_id=worker,
                token=uuid.uuid4().hex,
                now=store.now(),
                limit=limit,
                tasks=[sample_app.add.name],
            ),
        )
        return [row.id for row in rows]

    with store.write() as holder:
        assert claim(holder, "holder", 1) == [first.id]
        # The holder's transaction is still open: its row lock is held.
        with store.write() as other:
            # Waiting for the held row would end in a lock timeout error, not a claim.
            other.exec_driver_sql(IMPATIENT[store.engine.dialect.name])
            taken = claim(other, "other", 2)
    assert taken == [second.id]
    with server_app.app_context():
        assert (first.refresh().worker_id, second.refresh().worker_id) == ("holder", "other")


def _drop_connections(server_uri: str) -> int:
    """What a server restart does to the queue: end every connection to its database,
    and wait until the server has closed them. Ending one only signals its server
    process or thread (``pg_terminate_backend`` returns once the signal is sent): until
    it has exited, a client that looks at an idle connection sees it open."""
    url = sa.make_url(server_uri)
    admin = sa.create_engine(url.set(database=None) if url.drivername.startswith("mysql") else url)
    if admin.dialect.name == "postgresql":
        listed = (
            "SELECT pid FROM pg_stat_activity WHERE datname = :name AND pid <> pg_backend_pid()"
        )
    else:
        listed = (
            "SELECT id FROM information_schema.processlist "
            "WHERE db = :name AND id <> CONNECTION_ID()"
        )
    try:
        # Autocommit: PostgreSQL keeps one snapshot of pg_stat_activity per transaction.
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:

            def connected() -> set[int]:
                found = conn.execute(sa.text(listed), {"name": url.database}).scalars()
                return {int(pid) for pid in found}

            ended = connected()
            for pid in ended:
                if admin.dialect.name == "postgresql":
                    conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                else:
                    conn.exec_driver_sql(f"KILL CONNECTION {pid}")
            wait_for(lambda: not ended & connected(), "the ended connections to close")
            return len(ended)
    finally:
        admin.dispose()


def test_worker_and_producer_survive_the_server_dropping_their_connections(
    server_app: Flask, server_uri: str
) -> None:
    worker = sample_app.queue.worker(WorkerOptions(poll_interval=0.05, grace=1), server_app)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=run, name="sqlqueue-test-worker")
    with server_app.app_context():
        before = sample_app.add.enqueue(1, 2)
        thread.start()
        try:
            wait_for(lambda: before.refresh().status is JobStatus.COMPLETED, "the first job")
            assert _drop_connections(server_uri) >= 2  # the worker's, the producer's...
            after = sample_app.add.enqueue(3, 4)  # a dropped pooled connection is replaced
            wait_for(lambda: after.refresh().status is JobStatus.COMPLETED, "the second job")
            assert not worker.stopping
        finally:
            worker.stop()
            thread.join(WAIT)
    assert not thread.is_alive(), "the worker did not stop"
    assert not errors, f"the worker died: {errors[0]!r}"
    assert (before.result, after.result) == (3, 7)


def test_the_claims_connection_is_kept_and_replaced_once_dropped(
    server_app: Flask, server_uri: str
) -> None:
    store = sample_app.queue.state(server_app).store
    writer = store.writer()
    try:
        pids = []
        for _ in range(2):
            with writer.begin() as conn:
                pids.append(conn.exec_driver_sql(_BACKEND_PID[store.engine.dialect.name]).scalar())
        assert pids[0] == pids[1]  # one connection between transactions
        assert _drop_connections(server_uri) >= 1
        with pytest.raises(sa.exc.DBAPIError) as dropped:
            with writer.begin() as conn:
                conn.exec_driver_sql("SELECT 1")
        assert dropped.value.connection_invalidated
        with writer.begin() as conn:  # replaced by the next transaction
            new = conn.exec_driver_sql(_BACKEND_PID[store.engine.dialect.name]).scalar()
        assert new != pids[0]
        if store.engine.dialect.name == "postgresql":
            # Planned for claims for its whole session; the pool's connections are not.
            with writer.begin() as conn:
                assert conn.exec_driver_sql("SHOW enable_bitmapscan").scalar() == "off"
            writer.close()
            with store.read() as conn:
                assert conn.exec_driver_sql("SHOW enable_bitmapscan").scalar() == "on"
    finally:
        writer.close()


_BACKEND_PID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


def test_a_claim_takes_no_more_jobs_than_its_limit(server_app: Any) -> None:
    # PostgreSQL may re-run an `IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` once per
    # outer row (a nested-loop semi join, its plan on a table without statistics), and each
    # run skips the rows the previous ones locked: `LIMIT 1` then claimed every pending job.
    store = sample_app.queue.state(server_app).store
    with server_app.app_context(), store.write() as conn:
        for n in range(50):
            sample_app.add.using(session=conn).enqueue(n, 1)
    claimed: list[int] = []
    for limit in (1, 2, 5):
        with store.write() as conn:
            rows = claim_jobs(
                conn,
                store.ops,
                ClaimRequest(
                    worker_id="probe",
                    token=uuid.uuid4().hex,
                    now=utcnow(),
                    limit=limit,
                    tasks=[sample_app.add.name],
                ),
            )
        assert len(rows) == limit
        claimed += [row.id for row in rows]
    assert len(set(claimed)) == 8
    with store.read() as conn:
        running = conn.execute(
            sa.text("SELECT COUNT(*) FROM sqlqueue_jobs WHERE status = 'running'")
        ).scalar_one()
    assert running == 8

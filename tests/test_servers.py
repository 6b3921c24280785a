"""The queue on PostgreSQL and MariaDB, when their URLs are set (CI sets both).

A URL that is set but cannot be reached fails these tests; only an unset URL skips.
Each test gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import schema
from flask_sqlqueue.core import lifecycle
from flask_sqlqueue.core.models import VERSION_TABLE
from flask_sqlqueue.core.models import metadata
from flask_sqlqueue.core.models import utcnow
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import SERVER_URL_VARS
from tests.conftest import flask_env


def _server_url(kind: str) -> str:
    var = SERVER_URL_VARS[kind]
    url = os.environ.get(var)
    if not url:
        pytest.skip(f"set {var} to run against {kind}")
    return url


@pytest.fixture(params=sorted(SERVER_URL_VARS))
def server_uri(request: pytest.FixtureRequest) -> Iterator[str]:
    base = sa.make_url(_server_url(request.param))
    name = f"sqlqueue_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # unreachable server: this raises, the test fails
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            force = " WITH (FORCE)" if admin.dialect.name == "postgresql" else ""
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
        admin.dispose()


@pytest.fixture
def server_app(server_uri: str) -> Iterator[Any]:
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": server_uri})
    sample_app.queue.upgrade_database(app=app)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def test_migrations_round_trip_and_match_models(server_uri: str) -> None:
    engine = sa.create_engine(server_uri)
    try:
        schema.upgrade(engine)
        schema.downgrade(engine, "base")
        assert schema.current(engine) is None
        assert not sa.inspect(engine).has_table("sqlqueue_jobs")
        schema.upgrade(engine)
        assert schema.current(engine) == schema.head()
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_enqueue_work_retry_dead_replay(server_app: Any, tmp_path: Path) -> None:
    queue = sample_app.queue
    log = tmp_path / "attempts.log"
    with server_app.app_context():
        added = sample_app.add.enqueue(2, 3)
        first = sample_app.add.using(idempotency_key="evt-1").enqueue(1, 1)
        again = sample_app.add.using(idempotency_key="evt-1").enqueue(9, 9)
        effect = sample_app.reserve.using(idempotency_key="mail-1").enqueue()
        flaky = sample_app.fails_until.enqueue(str(log), 2)
        doomed = sample_app.always_fails.enqueue("nope")
        queue.worker(WorkerOptions(concurrency=2), server_app).run(burst=True)

        assert again.id == first.id
        assert added.refresh().status is JobStatus.COMPLETED and added.result == 5
        assert effect.refresh().result == [True, False]
        assert flaky.refresh().status is JobStatus.COMPLETED and flaky.attempts == 2
        assert len(flaky.errors) == 1 and flaky.errors[0]["type"] == "ValueError"
        assert doomed.refresh().status is JobStatus.DEAD and doomed.attempts == 3
        assert doomed.last_error == "RuntimeError: nope"
        assert doomed.run_at.tzinfo is not None

        store = queue.state().store
        assert store.run_write(lambda c: lifecycle.replay(c, [doomed.id], utcnow())) == 1
        assert doomed.refresh().status is JobStatus.PENDING and doomed.attempts == 0


def test_transactional_enqueue_commits_and_rolls_back(server_app: Any) -> None:
    from sqlalchemy.orm import Session

    with server_app.app_context():
        store = sample_app.queue.state().store
        other = sa.create_engine(store.engine.url)
        try:
            with Session(other) as session:
                kept = sample_app.add.using(session=session).enqueue(1, 2)
                session.commit()
            with Session(other) as session:
                dropped = sample_app.add.using(session=session).enqueue(3, 4)
                session.rollback()
        finally:
            other.dispose()
        assert sample_app.queue.get_job(kept.id) is not None
        assert sample_app.queue.get_job(dropped.id) is None


@pytest.mark.slow
def test_worker_processes_run_every_job_exactly_once(server_app: Any, tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    jobs = 600
    with server_app.app_context():
        for n in range(jobs):
            sample_app.record.enqueue(str(side), f"t{n}")
        uri = sample_app.queue.state().store.engine.url.render_as_string(hide_password=False)
    env = flask_env(uri)
    cmd = [sys.executable, "-m", "flask", "queue", "work", "--burst", "--concurrency", "2"]
    procs = [
        subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err.decode()[-2000:]

    starts: dict[int, int] = {}
    for line in side.read_text().splitlines():
        kind, _tag, job_id, _attempt, _pid = line.split()
        if kind == "start":
            starts[int(job_id)] = starts.get(int(job_id), 0) + 1
    assert len(starts) == jobs
    assert set(starts.values()) == {1}
    with server_app.app_context(), sample_app.queue.state().store.read() as conn:
        counts = dict(
            conn.execute(
                sa.text("SELECT status, COUNT(*) FROM sqlqueue_jobs GROUP BY status")
            ).all()
        )
    assert counts == {"completed": jobs}

"""Database faults and lost heartbeats, in-process.

The locked-database tests are about SQLite's single write lock and run on SQLite only;
the rest run on every backend.

A locked database must never end a worker or burn an attempt, an enqueue that cannot
reach the database must say so and write nothing, and a worker declared dead while cut
off must carry on under a new id.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import QueueUnavailable
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import workers
from tests import sample_app
from tests.stores import store_of
from tests.waiting import wait_for
from tests.workers import running


@contextmanager
def exclusive_lock(app: Flask) -> Iterator[None]:
    """Another process's view: a connection holding SQLite's exclusive lock."""
    path = store_of(app).engine.url.database
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")


def _count(app: Flask) -> int:
    with store_of(app).read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


@contextmanager
def running_worker(
    app: Flask, *, sqlqueue: SQLQueue = sample_app.queue, **options: Any
) -> Iterator[Any]:
    with running(sqlqueue.worker(WorkerOptions(**options), app)) as worker:
        yield worker


@pytest.mark.sqlite_only
def test_enqueue_on_a_locked_database_says_so_and_writes_nothing(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.2})
    with app.app_context():
        sample_app.add.enqueue(0, 0)  # the schema check is done before the lock
        with exclusive_lock(app):
            with pytest.raises(QueueUnavailable, match=r"unavailable.*nothing was enqueued"):
                sample_app.add.enqueue(1, 2)
        assert _count(app) == 1


@pytest.mark.sqlite_only
def test_worker_survives_a_locked_database_without_burning_attempts(
    make_app: Any, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.1})
    caplog.set_level(logging.ERROR, logger="flask_sqlqueue")
    with app.app_context():
        with running_worker(app, poll_interval=0.05, stale_after=30) as worker:
            wait_for(lambda: _worker_ids(app) == [worker.id], "the worker to start")
            with exclusive_lock(app):
                time.sleep(1.0)  # the worker polls into the lock many times meanwhile
            job = sample_app.add.enqueue(2, 3)
            wait_for(lambda: job.refresh().status is JobStatus.COMPLETED, "the job")
            assert not worker.stopping
        assert job.attempts == 1 and job.result == 5
    assert any("database error during" in r.getMessage() for r in caplog.records)


@pytest.mark.sqlite_only
def test_a_finished_attempt_is_recorded_after_the_lock_is_released(
    make_app: Any, tmp_path: Path
) -> None:
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.1})
    side = tmp_path / "side.log"
    with app.app_context():
        job = sample_app.record.enqueue(str(side), "slow", 0.5)
        with running_worker(app, poll_interval=0.05, stale_after=30):
            wait_for(lambda: side.exists(), "the job to start")
            with exclusive_lock(app):
                # The task finishes while the database is locked; its outcome must wait.
                wait_for(lambda: "done" in side.read_text(), "the task to finish")
                time.sleep(0.5)
                assert job.refresh().status is JobStatus.RUNNING
            wait_for(lambda: job.refresh().status is JobStatus.COMPLETED, "the outcome")
        assert job.attempts == 1 and job.result == "slow"


def test_worker_declared_dead_carries_on_under_a_new_id(make_app: Any) -> None:
    app = make_app()
    with app.app_context():
        with running_worker(app, poll_interval=0.05, stale_after=0.4) as worker:
            first = worker.id
            wait_for(lambda: _worker_ids(app) == [first], "the worker's row")
            with store_of(app).write() as conn:  # what a rescuer does to a stale worker
                conn.execute(
                    sa.update(workers).values(stopped_at=sa.func.now(), stop_reason="lost")
                )
            wait_for(lambda: worker.id != first, "a new worker id")
            wait_for(lambda: _worker_ids(app) == [worker.id], "the new row")
            job = sample_app.add.enqueue(4, 5)
            wait_for(lambda: job.refresh().status is JobStatus.COMPLETED, "the job")
            assert job.worker_id == worker.id
            second = worker.id
        assert _worker_ids(app) == []
        # Both stay listed as gone, for the dashboard, with how they went.
        assert _worker_ids(app, gone=True) == {first: "lost", second: "stopped"}


def _worker_ids(app: Flask, *, gone: bool = False) -> Any:
    """Live worker ids; with ``gone``, stopped ones and how they stopped."""
    with store_of(app).read() as conn:
        if gone:
            rows = conn.execute(
                sa.select(workers.c.id, workers.c.stop_reason).where(
                    workers.c.stopped_at.is_not(None)
                )
            )
            return {row.id: row.stop_reason for row in rows}
        return list(
            conn.execute(sa.select(workers.c.id).where(workers.c.stopped_at.is_(None))).scalars()
        )


def test_status_shows_jobs_with_a_status_it_does_not_know(make_app: Any) -> None:
    app = make_app()
    with app.app_context():
        job = sample_app.add.enqueue(1, 1)
        with store_of(app).write() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == job.id).values(status="paused"))
    result = app.test_cli_runner().invoke(args=["queue", "status"])
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()[:2]
    assert header.split()[-3:] == ["paused", "oldest", "eligible"]
    assert row.split()[:8] == ["default", "0", "0", "0", "0", "0", "0", "1"]
    assert "unknown status 'paused'" in result.stderr


@pytest.mark.sqlite_only
def test_hand_edited_timestamps_do_not_break_claims(make_app: Any) -> None:
    app = make_app()
    with app.app_context():
        odd = sample_app.add.enqueue(1, 1)
        fine = sample_app.add.enqueue(2, 2)
        with store_of(app).write() as conn:  # text SQLite sorts before any real timestamp
            conn.exec_driver_sql(
                "UPDATE sqlqueue_jobs SET run_at = '1999 by hand', created_at = 'x' "
                f"WHERE id = {odd.id}"
            )
        with running_worker(app, poll_interval=0.05, concurrency=2):
            wait_for(
                lambda: _statuses(app) == {odd.id: "completed", fine.id: "completed"}, "both jobs"
            )


def _statuses(app: Flask) -> dict[int, str]:
    with store_of(app).read() as conn:
        return dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())  # type: ignore[arg-type]


def test_a_rescued_job_keeps_its_place_in_line(make_app: Any) -> None:
    from datetime import timedelta

    from flask_sqlqueue.core import roster

    app = make_app({"SQLQUEUE_STALE_AFTER": 5})
    store = store_of(app)
    with app.app_context():
        first = sample_app.add.enqueue(1, 1)
        long_ago = store.now() - timedelta(minutes=5)
        with store.write() as conn:  # claimed by a worker that died without a trace
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == first.id)
                .values(
                    status="running",
                    attempts=1,
                    worker_id="gone:1:x",
                    claim_token="t" * 32,
                    started_at=long_ago,
                )
            )
        second = sample_app.add.enqueue(2, 2)  # due after the first
        now = store.now()
        rescued = store.run_write(
            lambda conn: roster.rescue_stale(conn, now - timedelta(seconds=5), now)
        )
        assert [job_id for job_id, _, _ in rescued] == [first.id]
        assert first.refresh().run_at < second.run_at
        assert sample_app.queue.worker(app=app).run_once()
        assert first.refresh().status is JobStatus.COMPLETED
        assert second.refresh().status is JobStatus.PENDING


def test_an_unexpected_error_while_recording_hands_the_job_back(
    make_app: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug (not a database error) while recording must not strand the job as running
    while its worker heartbeats on: the attempt counts as failed and the job runs again."""
    from flask_sqlqueue.core import transitions

    real = transitions.complete_many
    calls = []

    def broken_once(*args: Any, **kwargs: Any) -> set[int]:
        calls.append(args)
        # Fails with the next claim, then again when recorded on its own.
        if len(calls) <= 2:
            raise RuntimeError("a bug in recording")
        return real(*args, **kwargs)

    monkeypatch.setattr(transitions, "complete_many", broken_once)
    app = make_app()
    with app.app_context(), caplog.at_level(logging.WARNING, logger="flask_sqlqueue"):
        job = sample_app.add.enqueue(2, 3)
        with running_worker(app, poll_interval=0.05):
            wait_for(lambda: job.refresh().status is JobStatus.COMPLETED, "the job to finish")
    assert job.attempts == 2 and job.result == 5
    (record,) = job.errors
    assert record["type"] == "OutcomeNotRecorded"
    assert "a bug in recording" in record["message"]
    assert any(
        "outcome not recorded; the job is now pending" in r.getMessage() for r in caplog.records
    )

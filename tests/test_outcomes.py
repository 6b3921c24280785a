"""What a worker does with an attempt's outcome, on every backend: ``async def`` tasks,
results and errors larger than the database stores, and writes the database refuses.

The tasks are in ``tests/outcomes_app.py``. Workers are real: threads of this process
on the real claim path, children of an in-process worker, and ``flask queue work``
processes. No outcome may leave a job ``running``.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import ResultTooLarge
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import signals
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import failures
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.processes import AppLoader
from flask_sqlqueue.testing import drain
from flask_sqlqueue.testing import eager
from tests import outcomes_app as tasks
from tests.conftest import flask_env
from tests.conftest import query
from tests.stores import burst
from tests.stores import store_of
from tests.test_processes import side_lines
from tests.test_resilience import running_worker
from tests.test_timeouts import wait_until
from tests.workers import FLASK
from tests.workers import run_burst
from tests.workers import spawn
from tests.workers import wait_exit

APP = "tests.outcomes_app:create_app"
WAIT = 60.0  # upper bound, in seconds, of every wait here (a loaded 2-core machine)


@pytest.fixture
def oapp(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The outcomes app on the test's database (the schema put there by ``make_app``)."""
    make_app()
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def too_large(app: Flask, backend: str) -> int:
    """A result size this database refuses: over MariaDB's real ``max_allowed_packet``
    (17 MiB with its default of 16 MiB); elsewhere over a limit lowered for the test."""
    app.extensions["sqlqueue"].ensure_schema()  # reads the server's limit, once
    store = store_of(app)
    if backend == "mysql":
        assert store.value_limit < 2**30, "the server's own limit was read"
        return store.value_limit + 2**20
    store.value_limit = 5_000
    return 10_000


# -- async def tasks ---------------------------------------------------------------------------


def test_calling_an_async_task_directly_returns_its_coroutine() -> None:
    coro = tasks.async_add(1, 2)
    assert inspect.iscoroutine(coro)
    coro.close()  # never awaited: what a plain call of an async function gives
    assert inspect.iscoroutinefunction(tasks.async_add.fn)


def test_a_thread_worker_awaits_async_tasks(oapp: Flask) -> None:
    with oapp.app_context():
        added = tasks.async_add.enqueue(2, 3)
        retry = tasks.async_fails.enqueue("retry")
        permanent = tasks.async_fails.enqueue("permanent")
        cancel = tasks.async_fails.enqueue("cancel")
        other = tasks.async_fails.enqueue("other")
    burst(oapp, concurrency=2)

    added.refresh()
    assert added.status is JobStatus.COMPLETED, added.last_error
    result = added.result
    assert result.pop("thread").startswith("sqlqueue-job-")  # awaited in the job's thread
    assert result == {
        "sum": 5,
        "job": added.id,  # current_job inside the coroutine, and in a task it starts
        "attempts": 1,
        "subtask_job": added.id,
        "effects": [True, False],
        "app": oapp.name,  # the attempt's app context too
        "pid": os.getpid(),
    }

    retry.refresh()
    assert (retry.status, retry.attempts) == (JobStatus.PENDING, 1)
    assert retry.last_error == "flask_sqlqueue.exceptions.Retry: not ready"
    assert retry.run_at > store_of(oapp).now() + timedelta(minutes=50)
    permanent.refresh()
    assert (permanent.status, permanent.attempts) == (JobStatus.DEAD, 1)
    assert permanent.last_error == "flask_sqlqueue.exceptions.PermanentFailure: no such account"
    assert "async_fails" in permanent.errors[0]["traceback"]
    cancel.refresh()
    assert (cancel.status, cancel.errors) == (JobStatus.CANCELLED, [])
    other.refresh()  # the usual retries (no backoff in this app), then dead
    assert (other.status, other.attempts) == (JobStatus.DEAD, 3)
    assert [e["type"] for e in other.errors] == ["KeyError"] * 3


def test_eager_mode_and_drain_await_async_tasks(oapp: Flask) -> None:
    with oapp.app_context():
        with eager():
            done = tasks.async_add.enqueue(1, 1)
            failed = tasks.async_fails.enqueue("permanent")

            async def view() -> Any:
                # Eager mode called where an event loop runs already (an async view).
                return tasks.async_add.enqueue(2, 2)

            from_async = asyncio.run(view())
        queued = tasks.async_add.enqueue(3, 3)
        [drained] = tasks.queue.drain()

    assert done.status is JobStatus.COMPLETED, done.last_error
    assert (done.result["sum"], done.result["job"]) == (2, done.id)
    assert failed.status is JobStatus.DEAD
    assert failed.last_error == "flask_sqlqueue.exceptions.PermanentFailure: no such account"
    assert from_async.status is JobStatus.COMPLETED, from_async.last_error
    assert (from_async.result["sum"], from_async.result["job"]) == (4, from_async.id)
    assert drained.id == queued.id
    assert drained.status is JobStatus.COMPLETED, drained.last_error
    assert (drained.result["sum"], drained.result["job"]) == (6, queued.id)


@pytest.mark.slow
def test_a_process_worker_awaits_async_tasks_and_enforces_their_timeout(
    oapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    with oapp.app_context():
        added = tasks.async_add.enqueue(4, 5)
        stuck = tasks.async_stuck.enqueue(str(side))  # timeout=1, max_attempts=1
        retry = tasks.async_fails.enqueue("retry")
        permanent = tasks.async_fails.enqueue("permanent")
        cancel = tasks.async_fails.enqueue("cancel")
    env = flask_env(database_uri)
    env["FLASK_APP"] = APP
    output = tmp_path / "worker.out"
    with spawn([*FLASK, "queue", "work", "--processes", "1", "--burst"], env, output) as proc:
        code = wait_exit(proc, 120, output)
    log = output.read_text()
    assert code == 0, log
    assert "mode=processes (1 children)" in log

    added.refresh()
    assert added.status is JobStatus.COMPLETED, added.last_error
    assert added.result["sum"] == 9
    assert added.result["job"] == added.result["subtask_job"] == added.id
    assert added.result["effects"] == [True, False]
    assert added.result["pid"] not in (proc.pid, os.getpid())  # in the child

    stuck.refresh()  # stopped at its timeout, its coroutine unwound
    assert (stuck.status, stuck.last_error) == (JobStatus.DEAD, "JobTimeout: timed out after 1s")
    assert [parts[0] for parts in side_lines(side)] == ["start", "unwound"]

    assert retry.refresh().status is JobStatus.PENDING
    assert retry.last_error == "flask_sqlqueue.exceptions.Retry: not ready"
    assert permanent.refresh().status is JobStatus.DEAD
    assert permanent.last_error == "flask_sqlqueue.exceptions.PermanentFailure: no such account"
    assert cancel.refresh().status is JobStatus.CANCELLED


# -- results the database cannot store ----------------------------------------------------------


@pytest.mark.parametrize("runner", ["worker", "eager", "drain"])
def test_a_result_too_large_to_store_ends_the_job_dead(
    oapp: Flask, backend: str, tmp_path: Path, runner: str
) -> None:
    size = too_large(oapp, backend)
    limit = store_of(oapp).value_limit
    seen: list[BaseException] = []

    def on_dead(sender: Any, job: Any, error: BaseException, **extra: Any) -> None:
        seen.append(error)

    signals.job_dead.connect(on_dead)
    try:
        with oapp.app_context(), eager() if runner == "eager" else nullcontext():
            big = tasks.big_result.enqueue(size)
            async_big = tasks.async_big_result.enqueue(size)
            after = tasks.small_result.enqueue(str(tmp_path / "after"))
            if runner == "drain":
                drain()
        if runner == "worker":
            burst(oapp, concurrency=2)
    finally:
        signals.job_dead.disconnect(on_dead)

    for job, name in ((big, "big_result"), (async_big, "async_big_result")):
        job.refresh()
        # Dead at once, whatever max_attempts says: another attempt would return as much.
        assert (job.status, job.attempts, job.max_attempts) == (JobStatus.DEAD, 1, 3)
        assert job.result is None
        assert job.last_error is not None
        assert job.last_error.startswith(
            f"ResultTooLarge: task tests.outcomes_app.{name} returned "
        )
        assert job.last_error.endswith(
            f" bytes of JSON; this database stores at most {limit:,}; return less, "
            "e.g. a reference to where the data is."
        )
        reported = int(job.last_error.split(" returned ")[1].split()[0].replace(",", ""))
        assert reported >= size + 2  # the JSON string's quotes
    assert after.refresh().status is JobStatus.COMPLETED  # the worker carried on
    assert len(seen) == 2 and all(isinstance(error, ResultTooLarge) for error in seen)


@pytest.mark.slow
def test_a_process_worker_refuses_a_result_too_large_from_its_child(
    oapp: Flask, backend: str, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    with oapp.app_context():
        size = too_large(oapp, backend)
        big = tasks.big_result.enqueue(size)
        async_big = tasks.async_big_result.enqueue(size)
    worker = tasks.queue.worker(WorkerOptions(processes=1, grace=1.0), oapp, loader=AppLoader(APP))
    run_burst(worker, timeout=180)
    for job in (big, async_big):
        job.refresh()
        assert (job.status, job.attempts) == (JobStatus.DEAD, 1), job.last_error
        assert job.last_error is not None
        assert job.last_error.startswith("ResultTooLarge: task tests.outcomes_app.")


# -- errors: cut, and a bounded history ----------------------------------------------------------


def test_long_errors_are_cut_before_they_are_stored(oapp: Flask, backend: str) -> None:
    # On MariaDB a message larger than its packet: stored whole, the failure could not
    # be written at all.
    size = 17 * 2**20 if backend == "mysql" else 300_000
    with oapp.app_context():
        job = tasks.fails_loudly.using(max_attempts=1).enqueue(size, 150)
    burst(oapp)

    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.DEAD, 1)
    assert job.last_error is not None
    cut = f" [cut: {size:,} characters in all]"
    assert job.last_error == "ValueError: " + "e" * (2_000 - len(cut)) + cut
    (record,) = job.errors
    assert len(record["message"]) == failures.MAX_ERROR_MESSAGE
    assert record["message"].endswith(cut)
    traceback = record["traceback"]
    assert len(traceback) <= failures.MAX_TRACEBACK
    # Its end, where the exception is: the innermost frames and the message, cut.
    assert traceback.startswith("[cut: ")
    assert "characters in all; the end follows]\n" in traceback
    assert 'raise ValueError("e" * size)' in traceback
    assert traceback.rstrip().endswith(" characters in all]")
    assert traceback.count("e" * 1_000) == 1


def test_the_error_history_keeps_the_newest_records_that_fit(oapp: Flask) -> None:
    with oapp.app_context():
        job = tasks.always_fails.enqueue(100)  # max_attempts=25, no backoff in this app
    burst(oapp)
    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.DEAD, 25)
    assert [e["attempt"] for e in job.errors] == list(range(6, 26))
    assert job.last_error is not None and job.last_error.startswith("RuntimeError: attempt 25 ")

    # Where the database stores less, fewer: each failure's write must fit.
    store = store_of(oapp)
    store.value_limit = 12_000
    with store.write() as conn:
        actions.replay(conn, [job.id], store.now())
    with oapp.app_context():
        wide = tasks.always_fails.using(max_attempts=3).enqueue(5_000)
    burst(oapp)
    for failed, attempts in ((job, 25), (wide, 3)):
        failed.refresh()
        assert (failed.status, failed.attempts) == (JobStatus.DEAD, attempts)
        with store.read() as conn:
            stored = conn.execute(sa.select(jobs.c.errors).where(jobs.c.id == failed.id)).scalar()
        assert store.value_size(stored) is None
        assert failed.errors[-1]["attempt"] == attempts  # the newest is kept
    assert 1 < len(job.errors) < 20
    assert [e["attempt"] for e in wide.errors] == [2, 3]


def test_cut_text_is_stable() -> None:
    text = "x" * 5_000
    head = failures.cut_text(text, 100)
    tail = failures.cut_text(text, 100, keep_end=True)
    assert len(head) == len(tail) == 100
    assert failures.cut_text(head, 100) == head
    assert failures.cut_text(tail, 100, keep_end=True) == tail
    assert failures.cut_text("short", 100) == "short"
    history = json.loads(failures.appended("not json", {"traceback": "t", "message": "m"}))
    assert history == [{"traceback": "t", "message": "m"}]


# -- writes the database refuses -----------------------------------------------------------------


def refuse_large_values(app: Flask, database_uri: str, backend: str, column: str) -> None:
    """Make the database refuse a large ``column`` value where the queue's own check
    would let it through (its estimate of the limit is wrong, say): SQLite with a lower
    length limit on every connection, PostgreSQL and MariaDB with a CHECK constraint;
    MariaDB's results go over its real packet size instead."""
    app.extensions["sqlqueue"].ensure_schema()  # reads the server's limit, once
    store = store_of(app)
    if backend == "sqlite":

        @sa.event.listens_for(store.engine, "connect")
        def lower_limit(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000)

        store.engine.dispose()  # pooled connections were opened without it
    elif backend == "mysql" and column == "result":
        pass  # a 17 MiB result: MariaDB drops the connection that sends it
    else:
        query(
            database_uri,
            f"ALTER TABLE sqlqueue_jobs ADD CONSTRAINT refuse_large "
            f"CHECK ({column} IS NULL OR length({column}) < 10000)",
        )
    store.value_limit = 2**31  # the queue's check lets everything through


@pytest.mark.slow
@pytest.mark.parametrize("what", ["result", "error"])
def test_an_outcome_the_database_refuses_still_ends_the_job(
    oapp: Flask,
    database_uri: str,
    backend: str,
    tmp_path: Path,
    what: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with oapp.app_context():
        if what == "result":
            size = 17 * 2**20 if backend == "mysql" else 20_000
            job = tasks.big_result.enqueue(size)  # max_attempts=3
        else:
            job = tasks.fails_loudly.enqueue(1_000, 100)  # max_attempts=2
    refuse_large_values(oapp, database_uri, backend, "result" if what == "result" else "errors")
    with caplog.at_level(logging.ERROR, logger="flask_sqlqueue"):
        options = {"poll_interval": 0.05, "grace": 1.0, "stale_after": 2.0}
        with running_worker(oapp, sqlqueue=tasks.queue, **options):
            wait_until(lambda: job.refresh().status is JobStatus.DEAD, WAIT, "the job's end")
            with oapp.app_context():
                after = tasks.small_result.enqueue(str(tmp_path / "after"))
            done = after.refresh
            wait_until(lambda: done().status is JobStatus.COMPLETED, WAIT, "the next job")

    assert job.result is None
    if what == "result":  # the work is done: dead at once, as with a result too large
        assert job.attempts == 1
        (record,) = job.errors
        assert record["message"].startswith("the database refused to store the result: ")
    else:  # the failure's own decision stands: a retry, then dead
        assert job.attempts == 2
        assert [e["attempt"] for e in job.errors] == [1, 2]
        for record in job.errors:
            assert record["message"].startswith(
                "the database refused to store the error (ValueError: eeeeeeeeee"
            )
    assert all(e["type"] == "OutcomeNotStored" for e in job.errors)
    assert job.last_error is not None
    assert job.last_error.startswith("OutcomeNotStored: the database refused to store the ")
    assert len(job.last_error) < 1_000
    assert any(
        "the database refused to record the outcome" in r.getMessage() for r in caplog.records
    )

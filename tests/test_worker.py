"""The worker in-process, on every backend: claiming, retries, results, effects, fencing.

The app fixture is ``sq_app``, not ``app``: pytest-flask pushes a request context
around any test that uses a fixture named ``app``.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import failures
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim
from flask_sqlqueue.core.failures import Backoff
from flask_sqlqueue.core.models import effects
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.exceptions import InvalidTransition
from tests import sample_app
from tests.stores import burst
from tests.stores import store_of
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import run_burst
from tests.workers import running


def clock(app: Flask) -> datetime:
    """The queue's clock (the database's own on a server), which stamps every job."""
    return store_of(app).now()


def row(app: Flask, job_id: int) -> Any:
    with store_of(app).read() as conn:
        return conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one()


def execute(app: Flask, statement: Any) -> int:
    with store_of(app).write() as conn:
        return conn.execute(statement).rowcount  # type: ignore[no-any-return]


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def assert_near(value: datetime, low: datetime, high: datetime, seconds: float) -> None:
    """``value`` is ``seconds`` after some instant in [low, high] (1 ms of rounding allowed)."""
    slack = timedelta(milliseconds=1)
    shift = timedelta(seconds=seconds)
    assert low + shift - slack <= value <= high + shift + slack, (value, low, high, seconds)


# -- which job runs, and when --------------------------------------------------------------


def test_claim_order_is_priority_then_run_at_then_id(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "order.log"
    base = utcnow() - timedelta(minutes=5)
    record = sample_app.record
    record.using(run_at=base + timedelta(seconds=20)).enqueue(str(log), "a")
    record.using(priority=5, run_at=base + timedelta(seconds=30)).enqueue(str(log), "b")
    record.using(run_at=base + timedelta(seconds=10)).enqueue(str(log), "c")
    record.using(priority=5, run_at=base + timedelta(seconds=25)).enqueue(str(log), "d")
    record.using(run_at=base + timedelta(seconds=20)).enqueue(str(log), "e")  # ties a: by id
    record.using(priority=-1, run_at=base).enqueue(str(log), "f")
    record.using(priority=5, run_at=base + timedelta(seconds=30)).enqueue(str(log), "g")

    burst(ctx, concurrency=1)

    started = [parts[1] for parts in lines(log) if parts[0] == "start"]
    assert started == ["d", "b", "g", "c", "a", "e", "f"]


def test_delay_and_run_at_decide_eligibility(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "delay.log"
    before = clock(ctx)
    delayed = sample_app.record.using(delay=60).enqueue(str(log), "delayed")
    after = clock(ctx)
    later = sample_app.record.using(run_at=after + timedelta(hours=1)).enqueue(str(log), "later")
    past = sample_app.record.using(run_at=before - timedelta(hours=1)).enqueue(str(log), "past")
    as_timedelta = sample_app.record.using(delay=timedelta(0)).enqueue(str(log), "now")

    burst(ctx)

    assert_near(delayed.refresh().run_at, before, after, 60)
    for job in (delayed, later):
        job.refresh()
        assert job.status is JobStatus.PENDING
        assert job.attempts == 0
        assert job.started_at is None
    assert past.refresh().status is JobStatus.COMPLETED
    assert as_timedelta.refresh().status is JobStatus.COMPLETED
    assert sorted(parts[1] for parts in lines(log) if parts[0] == "done") == ["now", "past"]


def test_worker_claims_only_its_tasks_and_queues(ctx: Flask) -> None:
    unknown = sample_app.queue.enqueue(
        "nobody.knows", args=[1], kwargs={"x": "y"}, unregistered=True
    )
    report = sample_app.report.enqueue(7)
    add = sample_app.add.enqueue(1, 2)
    assert report.queue == "reports"

    burst(ctx, queues=("reports",))
    assert report.refresh().status is JobStatus.COMPLETED
    assert report.result == "report 7"
    assert add.refresh().status is JobStatus.PENDING
    assert add.attempts == 0

    burst(ctx)  # every queue now
    assert add.refresh().status is JobStatus.COMPLETED
    unknown.refresh()
    assert unknown.status is JobStatus.PENDING
    assert unknown.attempts == 0
    assert unknown.started_at is None
    assert unknown.worker_id is None
    assert unknown.last_error is None
    assert (unknown.args, unknown.kwargs) == ([1], {"x": "y"})


def test_task_and_queue_names_are_compared_exactly(ctx: Flask) -> None:
    shouted = sample_app.queue.enqueue(sample_app.add.name.upper(), args=[1, 2], unregistered=True)
    capitalised = sample_app.report.using(queue="Reports").enqueue(1)
    burst(ctx, queues=("reports",))
    assert capitalised.refresh().status is JobStatus.PENDING

    burst(ctx)  # every queue: "Reports" now, but still no task named like the shouted one
    assert capitalised.refresh().status is JobStatus.COMPLETED
    shouted.refresh()
    assert (shouted.status, shouted.attempts, shouted.last_error) == (JobStatus.PENDING, 0, None)


# -- failures, retries, backoff -------------------------------------------------------------


def test_failing_task_is_retried_until_it_succeeds(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "attempts.log"
    job = sample_app.fails_until.enqueue(str(log), 3)
    worker = sample_app.queue.worker(WorkerOptions(), ctx)
    before = clock(ctx)
    run_burst(worker)  # backoff base is 0 in the sample app: retries are due at once
    after = clock(ctx)

    job.refresh()
    assert job.status is JobStatus.COMPLETED
    assert job.attempts == 3
    assert job.result == 3
    assert job.last_error == "ValueError: attempt 2 fails"
    assert [record["attempt"] for record in job.errors] == [1, 2]
    for n, record in enumerate(job.errors, start=1):
        assert record["type"] == "ValueError"
        assert record["message"] == f"attempt {n} fails"
        assert "Traceback" in record["traceback"]
        assert f"ValueError: attempt {n} fails" in record["traceback"]
        assert "fails_until" in record["traceback"]
        assert record["worker"] == worker.id
        assert before <= datetime.fromisoformat(record["at"]) <= after
    assert lines(log) == [[str(job.id), "1"], [str(job.id), "2"], [str(job.id), "3"]]


@pytest.mark.parametrize(
    ("config", "low", "high"),
    [
        ({}, 60, 60),  # base * 2**1 after attempt 1
        ({"SQLQUEUE_BACKOFF_CAP": 45}, 45, 45),
        ({"SQLQUEUE_BACKOFF_JITTER": 10}, 60, 70),
    ],
)
def test_failed_job_waits_for_its_backoff(
    make_app: Any, tmp_path: Path, config: dict[str, Any], low: float, high: float
) -> None:
    app = make_app({"SQLQUEUE_BACKOFF_BASE": 30, "SQLQUEUE_BACKOFF_JITTER": 0, **config})
    log = tmp_path / "attempts.log"
    with app.app_context():
        job = sample_app.fails_until.enqueue(str(log), 3)
    before = clock(app)
    burst(app)
    after = clock(app)

    job.refresh()
    assert job.status is JobStatus.PENDING
    assert job.attempts == 1
    assert job.last_error == "ValueError: attempt 1 fails"
    assert before + timedelta(seconds=low) <= job.run_at <= after + timedelta(seconds=high)
    assert len(lines(log)) == 1

    burst(app)  # not due yet: nothing runs
    assert job.refresh().attempts == 1
    assert len(lines(log)) == 1


def test_backoff_delay_bounds() -> None:
    backoff = Backoff(base=2.0, cap=100.0, jitter=5.0)
    rng = random.Random(1234)
    seen = []
    for attempt in [*range(1, 12), 64, 65, 1000, 10**6]:
        expected = min(100.0, 2 * 2**attempt)
        delay = backoff.delay(attempt, rng)
        assert expected <= delay <= expected + 5.0, (attempt, delay)
        seen.append(delay - expected)
    assert len(set(seen)) > 1, "jitter never varied"
    assert backoff.delay(1000, rng) <= 105.0  # no OverflowError, cap honoured

    same = [Backoff(30, 3600, 20).delay(k, random.Random(7)) for k in (3, 3)]
    assert same[0] == same[1]  # a seeded rng gives reproducible delays
    assert Backoff(30, 3600, 0).delay(3, random.Random()) == 240.0
    assert Backoff(30, 3600, 0).delay(20, random.Random()) == 3600.0
    assert Backoff(0, 3600, 0).delay(5, random.Random()) == 0.0


def test_task_backoff_callable_is_used(database_uri: str) -> None:
    own = SQLQueue()

    @own.task(name="custom_backoff", backoff=lambda attempt: 1000 + attempt)
    def custom() -> None:
        raise RuntimeError("custom")

    @own.task(name="timedelta_backoff", backoff=lambda attempt: timedelta(minutes=attempt * 5))
    def as_timedelta() -> None:
        raise RuntimeError("timedelta")

    @own.task(name="broken_backoff", backoff=lambda attempt: 1 / 0)
    def broken() -> None:
        raise RuntimeError("broken")

    app = Flask(__name__)
    app.config.update(
        SQLQUEUE_DATABASE_URI=database_uri,
        SQLQUEUE_BACKOFF_BASE=7,
        SQLQUEUE_BACKOFF_JITTER=0,
    )
    own.init_app(app)
    try:
        own.upgrade_database(app=app)
        with app.app_context():
            jobs_ = [custom.enqueue(), as_timedelta.enqueue(), broken.enqueue()]
        before = clock(app)
        run_burst(own.worker(WorkerOptions(), app))
        after = clock(app)
        for job, seconds in zip(jobs_, (1001, 300, 14), strict=True):
            job.refresh()
            assert job.status is JobStatus.PENDING, job
            assert job.attempts == 1
            assert_near(job.run_at, before, after, seconds)
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


def test_attempts_spent_goes_dead_and_replay_runs_again(ctx: Flask, tmp_path: Path) -> None:
    job = sample_app.always_fails.enqueue()
    target = tmp_path / "missing" / "flag"
    fixable = sample_app.touch.using(max_attempts=2).enqueue(str(target))
    burst(ctx)

    job.refresh()
    assert job.status is JobStatus.DEAD
    assert job.attempts == 3
    assert job.last_error == "RuntimeError: boom"
    assert len(job.errors) == 3
    assert job.finished_at is not None
    fixable.refresh()
    assert fixable.status is JobStatus.DEAD
    assert fixable.attempts == 2
    assert fixable.last_error is not None
    assert fixable.last_error.startswith("FileNotFoundError")

    # Replaying a job that is not dead is refused and changes nothing.
    done = sample_app.add.enqueue(1, 1)
    burst(ctx)
    store = store_of(ctx)
    with pytest.raises(InvalidTransition):
        store.run_write(lambda conn: actions.replay(conn, [fixable.id, done.id], utcnow()))
    assert fixable.refresh().status is JobStatus.DEAD

    target.parent.mkdir()  # "fix" the task
    now = utcnow()
    assert store.run_write(lambda conn: actions.replay(conn, [fixable.id], now)) == 1
    fixable.refresh()
    assert fixable.status is JobStatus.PENDING
    assert fixable.attempts == 0
    assert fixable.last_error is None
    assert fixable.run_at == now

    task = sample_app.always_fails.name
    replayed = store.run_write(lambda conn: actions.replay_dead(conn, utcnow(), None, task))
    assert replayed == 1
    assert job.refresh().status is JobStatus.PENDING
    assert job.attempts == 0

    burst(ctx)
    fixable.refresh()
    assert fixable.status is JobStatus.COMPLETED
    assert fixable.attempts == 1
    assert target.exists()
    job.refresh()
    assert job.status is JobStatus.DEAD
    assert job.attempts == 3  # a fresh set of attempts, all used again
    assert len(job.errors) == 6  # the history is kept across replays
    assert done.refresh().status is JobStatus.COMPLETED


def test_retry_exception_and_permanent_failure(ctx: Flask) -> None:
    before = clock(ctx)
    retry = sample_app.asks_retry.enqueue(120)
    spent = sample_app.asks_retry.using(max_attempts=1).enqueue(0)
    permanent = sample_app.gives_up.enqueue()
    burst(ctx)
    after = clock(ctx)

    retry.refresh()
    assert retry.status is JobStatus.PENDING
    assert retry.attempts == 1
    assert retry.last_error is not None
    assert "not ready yet" in retry.last_error
    assert_near(retry.run_at, before, after, 120)

    spent.refresh()
    assert spent.status is JobStatus.DEAD  # Retry does not outlive max_attempts
    assert spent.attempts == 1

    permanent.refresh()
    assert permanent.status is JobStatus.DEAD
    assert permanent.attempts == 1
    assert permanent.max_attempts == 5
    assert permanent.last_error is not None
    assert "PermanentFailure: invalid account" in permanent.last_error

    burst(ctx)
    assert retry.refresh().attempts == 1  # not due yet


# -- results and effects ----------------------------------------------------------------------


def test_results_are_stored_and_bad_results_do_not_stop_the_worker(ctx: Flask) -> None:
    bad = sample_app.bad_result.enqueue()
    added = sample_app.add.enqueue(2, 3)
    echoed = sample_app.echo.enqueue(1, "é", k=[1, {"n": None}])
    burst(ctx, concurrency=1)

    assert added.refresh().result == 5
    assert added.status is JobStatus.COMPLETED
    assert added.attempts == 1
    assert added.finished_at is not None
    assert echoed.refresh().result == {"args": [1, "é"], "kwargs": {"k": [1, {"n": None}]}}
    bad.refresh()
    assert bad.status is JobStatus.COMPLETED
    assert bad.attempts == 1
    assert bad.result is None
    assert row(ctx, bad.id).result is None


def test_effect_keys_are_compared_exactly(ctx: Flask) -> None:
    keys = ["mail:Ada", "mail:ada", "mail:adá", "mail:ada "]
    jobs_ = [sample_app.reserve.enqueue(key) for key in keys]
    burst(ctx, concurrency=1)
    assert [job.refresh().result for job in jobs_] == [[True, False]] * len(keys)
    with store_of(ctx).read() as conn:
        reserved = set(conn.execute(sa.select(effects.c.key)).scalars())
    assert reserved == set(keys)


def test_error_text_no_database_could_store_is_recorded_escaped(
    ctx: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    odd = sample_app.fails_with_odd_text.enqueue()
    after = sample_app.add.enqueue(1, 2)
    with caplog.at_level(logging.INFO, logger="flask_sqlqueue"):
        burst(ctx, concurrency=1)  # one job thread: it must survive the odd failure
    # Logged escaped too: a UTF-8 log file or terminal could not take a lone surrogate.
    (dead,) = [r.getMessage() for r in caplog.records if "job is dead" in r.getMessage()]
    assert dead.endswith("ValueError: nul \\x00 and lone \\ud800 end")
    assert all(r.getMessage().encode("utf-8") for r in caplog.records)

    odd.refresh()
    assert (odd.status, odd.attempts) == (JobStatus.DEAD, 1)
    assert odd.last_error == "ValueError: nul \\x00 and lone \\ud800 end"
    (record,) = odd.errors
    assert record["message"] == "nul \\x00 and lone \\ud800 end"
    assert "ValueError: nul \\x00 and lone \\ud800 end" in record["traceback"]
    assert after.refresh().status is JobStatus.COMPLETED


def test_reserve_effect_is_granted_once_per_key(ctx: Flask) -> None:
    first = sample_app.reserve.enqueue("mail:42")
    second = sample_app.reserve.enqueue("mail:42")
    keyed = sample_app.reserve.using(idempotency_key="order-7").enqueue()
    same_key = sample_app.reserve.enqueue("order-7")
    keyless = sample_app.reserve.using(max_attempts=1).enqueue()
    burst(ctx, concurrency=1)

    assert first.refresh().result == [True, False]
    assert second.refresh().result == [False, False]
    assert keyed.refresh().result == [True, False]
    assert same_key.refresh().result == [False, False]
    keyless.refresh()
    assert keyless.status is JobStatus.DEAD
    assert keyless.last_error is not None
    assert keyless.last_error.startswith("ValueError:")
    assert "idempotency_key" in keyless.last_error
    with store_of(ctx).read() as conn:
        reserved = dict(conn.execute(sa.select(effects.c.key, effects.c.job_id)).all())
    assert reserved == {"mail:42": first.id, "order-7": keyed.id}


# -- fencing and damaged rows -------------------------------------------------------------------


def test_write_with_a_stale_claim_token_changes_nothing(ctx: Flask) -> None:
    job = sample_app.add.enqueue(1, 2)
    store = store_of(ctx)
    with store.write() as conn:
        claimed = claim(
            conn,
            store.ops,
            ClaimRequest(
                worker_id="test-worker",
                token="old-token",
                now=utcnow(),
                limit=5,
                tasks=[sample_app.add.name],
            ),
        )
    assert [(r.id, r.claim_token, r.attempts) for r in claimed] == [(job.id, "old-token", 1)]
    assert job.refresh().status is JobStatus.RUNNING
    execute(ctx, sa.update(jobs).where(jobs.c.id == job.id).values(claim_token="new-token"))

    now = utcnow()
    record = failures.error_record(1, "X", "late", "", "test-worker", now)
    assert not store.run_write(lambda c: transitions.complete(c, job.id, "old-token", "3", now))
    assert not store.run_write(lambda c: transitions.fail(c, job.id, "old-token", record, now, now))
    assert not store.run_write(lambda c: transitions.release(c, job.id, "old-token", now))
    after = row(ctx, job.id)
    assert (after.status, after.claim_token, after.result, after.attempts) == (
        "running",
        "new-token",
        None,
        1,
    )
    assert (after.last_error, after.errors, after.finished_at, after.releases) == (
        None,
        None,
        None,
        0,
    )

    assert store.run_write(lambda c: transitions.complete(c, job.id, "new-token", "3", now))
    assert job.refresh().status is JobStatus.COMPLETED
    assert job.result == 3


def test_worker_whose_claim_was_taken_records_nothing(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "fence.log"
    job = sample_app.record.enqueue(str(log), "fenced", 1.5)
    worker = sample_app.queue.worker(WorkerOptions(), ctx)
    thread = threading.Thread(target=worker.run_once, name="sqlqueue-test-once", daemon=True)
    thread.start()
    try:
        wait_for(lambda: any(parts[0] == "start" for parts in lines(log)))
        execute(ctx, sa.update(jobs).where(jobs.c.id == job.id).values(claim_token="rescuer"))
    finally:
        thread.join(WAIT)
        worker.close()
    assert not thread.is_alive()
    assert [parts[0] for parts in lines(log)] == ["start", "done"]
    after = row(ctx, job.id)
    assert (after.status, after.claim_token, after.result, after.finished_at) == (
        "running",
        "rescuer",
        None,
        None,
    )


@pytest.mark.parametrize("payload", ["not json", "[1, 2]", '{"args": {}, "kwargs": []}'])
def test_malformed_payload_goes_dead_without_stopping_the_worker(ctx: Flask, payload: str) -> None:
    broken = sample_app.add.enqueue(1, 2)
    good = sample_app.add.enqueue(3, 4)
    execute(ctx, sa.update(jobs).where(jobs.c.id == broken.id).values(payload=payload))
    burst(ctx, concurrency=1)

    broken.refresh()
    assert broken.status is JobStatus.DEAD
    assert broken.last_error is not None
    assert re.search("malformed ?payload", broken.last_error, re.IGNORECASE), broken.last_error
    assert broken.payload_error is not None
    assert good.refresh().status is JobStatus.COMPLETED
    assert good.result == 7


# -- eager mode, wake-ups, transactions ---------------------------------------------------------


def test_eager_mode_runs_the_task_at_enqueue(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_EAGER": True})
    with app.app_context():
        job = sample_app.add.enqueue(1, 2)
        assert job.status is JobStatus.COMPLETED
        assert job.result == 3
        assert job.attempts == 1
        stored = sample_app.queue.get_job(job.id)
    assert stored is not None
    assert (stored.status, stored.result) == (JobStatus.COMPLETED, 3)


def test_enqueue_in_process_wakes_an_idle_worker(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "wake.log"
    # Polling far less often than any wait here: only the wake-up can run the job in time.
    with running(sample_app.queue.worker(WorkerOptions(poll_interval=10 * WAIT), ctx)) as worker:
        # Its first claim found nothing, so only a wake-up runs the job before its poll.
        wait_for(worker._dispatcher.idle.is_set, "the worker to wait for a wake-up")
        job = sample_app.record.enqueue(str(log), "woken")
        wait_for(lambda: job.refresh().status is JobStatus.COMPLETED, "the woken worker")
    assert job.result == "woken"


# Each database's way to make a writer give up after about half a second if it must wait
# for a lock: SQLite's whole-database write lock, or a row lock on the servers.
IMPATIENT_WRITER = {
    "sqlite": "PRAGMA busy_timeout = 500",
    "postgresql": "SET lock_timeout = '500ms'",
    "mysql": "SET SESSION innodb_lock_wait_timeout = 1",  # whole seconds only
}


def test_no_transaction_is_held_while_a_task_runs(
    ctx: Flask, tmp_path: Path, database_uri: str, backend: str
) -> None:
    # The writers below give up on any lock held longer than half a second (a second on
    # MariaDB), so they succeed only if the running task holds none; the task outlasts
    # them by far, even on a loaded machine.
    log = tmp_path / "slow.log"
    slow = sample_app.record.enqueue(str(log), "slow", 6.0)
    other_writer = sa.create_engine(database_uri, poolclass=NullPool)
    with running(sample_app.queue.worker(WorkerOptions(), ctx), burst=True):
        wait_for(lambda: any(parts[0] == "start" for parts in lines(log)))
        try:
            with other_writer.connect() as conn:
                conn.exec_driver_sql(IMPATIENT_WRITER[backend])
                conn.commit()
                if backend == "sqlite":
                    conn.exec_driver_sql("BEGIN IMMEDIATE")  # take the write lock at once
                conn.execute(
                    sa.text("UPDATE sqlqueue_jobs SET priority = 9 WHERE id = :id"),
                    {"id": slow.id},
                )
                conn.commit()
        finally:
            other_writer.dispose()
        other = sample_app.add.enqueue(1, 1)
        assert row(ctx, slow.id).status == "running"
        assert not any(parts[0] == "done" for parts in lines(log))
        wait_for(lambda: other.refresh().status is JobStatus.COMPLETED)
    assert slow.refresh().status is JobStatus.COMPLETED
    assert slow.priority == 9


def test_transactional_enqueue_does_not_wait_for_the_callers_own_lock(
    make_app: Any, database_uri: str
) -> None:
    # The first enqueue in a process checks the schema; on SQLite that check must not
    # queue behind the caller's own transaction, which already holds the write lock (it
    # would wait out the busy timeout, then fail).
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": WAIT})
    own = sa.create_engine(database_uri)
    try:
        with own.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        with app.app_context(), Session(own) as session:
            session.execute(sa.text("INSERT INTO orders (id) VALUES (1)"))
            started = time.monotonic()
            job = sample_app.add.using(session=session).enqueue(1, 2)
            assert time.monotonic() - started < WAIT / 2
            session.commit()
            assert sample_app.queue.get_job(job.id) is not None
    finally:
        own.dispose()


def test_timestamps_are_aware_utc(ctx: Flask) -> None:
    job = sample_app.add.enqueue(1, 2)
    burst(ctx)
    job.refresh()
    for value in (job.run_at, job.created_at, job.updated_at, job.started_at, job.finished_at):
        assert value is not None
        assert value.tzinfo is not None
        assert value.utcoffset() == timedelta(0)
    assert job.created_at <= job.started_at <= job.finished_at <= clock(ctx)  # type: ignore[operator]

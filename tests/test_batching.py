"""The worker's hot path: completions recorded with the next claim, still fenced by claim;
SQLite writers of one process queueing in-process instead of in SQLite's busy handler."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import QueueUnavailable
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim
from flask_sqlqueue.core.dialects.base import LISTED_MOST
from flask_sqlqueue.core.dialects.base import complete_listed
from flask_sqlqueue.core.dialects.base import listed
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.core.store import Store
from tests import sample_app
from tests.stores import store_of
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import running

# -- successes ride on the next claim's transaction ----------------------------------------------


def test_successes_are_recorded_in_the_transaction_of_the_next_claim(ctx: Flask) -> None:
    """Draining a queue takes about one commit per batch of jobs, not two per job: each
    transaction that claims also completes the jobs that finished since the last one."""
    made = sample_app.add.enqueue_many([([i, 3], {}) for i in range(40)])
    store = store_of(ctx)
    statements: dict[int, list[str]] = {}  # connection -> statements of its open transaction
    both = 0
    commits = 0
    lock = threading.Lock()

    def executed(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        with lock:
            statements.setdefault(id(conn), []).append(statement)

    def committed(conn: Any) -> None:
        nonlocal both, commits
        with lock:
            seen = statements.pop(id(conn), [])
            commits += 1
            # A completion on PostgreSQL starts WITH its locking CTE.
            updates = [s for s in seen if "UPDATE SQLQUEUE_JOBS SET" in s.upper()]
            claims = any("started_at=" in s.replace(" ", "") for s in updates)
            completions = any("finished_at=" in s.replace(" ", "") for s in updates)
            both += claims and completions

    sa.event.listen(store.engine, "before_cursor_execute", executed)
    sa.event.listen(store.engine, "commit", committed)
    try:
        worker = sample_app.queue.worker(WorkerOptions(concurrency=2), ctx)
        worker.run(burst=True)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", executed)
        sa.event.remove(store.engine, "commit", committed)
    assert [job.refresh().result for job in made] == [i + 3 for i in range(40)]
    assert both > 0, "no transaction both completed jobs and claimed more"
    # 40 jobs with one commit for each claim and another for each completion would be
    # about 60 or more commits (claims of at most 2, plus completions).
    assert commits < 50, commits


def test_a_claim_waits_briefly_for_jobs_claimed_just_before_it(
    ctx: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Jobs of one claim that finish within LINGER of it are recorded in one commit
    (``complete_many`` gives them one ``finished_at``); a job running longer is not
    waited for."""
    from flask_sqlqueue.core.worker import dispatch

    log = str(tmp_path / "linger.log")
    monkeypatch.setattr(dispatch, "LINGER", 0.6)
    together = [sample_app.record.enqueue(log, f"t{i}", 0.1 * i) for i in range(4)]
    # Without claiming ahead, which records short jobs in batches of its own.
    worker = sample_app.queue.worker(WorkerOptions(concurrency=4, claim_ahead=0), ctx)
    worker.run(burst=True)
    finished = {job.refresh().finished_at for job in together}
    assert len(finished) == 1, finished

    monkeypatch.setattr(dispatch, "LINGER", 0.05)
    quick, slow = (sample_app.record.enqueue(log, tag, s) for tag, s in (("q", 0), ("s", 1.0)))
    worker = sample_app.queue.worker(WorkerOptions(concurrency=2, claim_ahead=0), ctx)
    worker.run(burst=True)
    quick_at, slow_at = quick.refresh().finished_at, slow.refresh().finished_at
    assert quick_at is not None and slow_at is not None
    assert (slow_at - quick_at).total_seconds() > 0.5


# -- complete_many: fenced like complete ------------------------------------------------------


def _claim(app: Flask, token: str, limit: int) -> list[Any]:
    store = store_of(app)
    with store.write() as conn:
        return _claim_in(store, conn, token, limit)


def _claim_in(store: Store, conn: Any, token: str, limit: int) -> list[Any]:
    return claim(
        conn,
        store.ops,
        ClaimRequest(
            worker_id="test-worker",
            token=token,
            now=utcnow(),
            limit=limit,
            tasks=[sample_app.add.name],
        ),
    )


def test_complete_many_is_fenced_by_each_claim(ctx: Flask) -> None:
    made = sample_app.add.enqueue_many([([i, i], {}) for i in range(4)])
    claimed = _claim(ctx, "tok-a", 4)
    assert sorted(row.id for row in claimed) == [job.id for job in made]
    stolen, lost, with_result, plain = (job.id for job in made)
    store = store_of(ctx)
    with store.write() as conn:  # a rescuer took one; another went back to pending
        conn.execute(sa.update(jobs).where(jobs.c.id == stolen).values(claim_token="tok-b"))
        conn.execute(
            sa.update(jobs).where(jobs.c.id == lost).values(status="pending", claim_token=None)
        )
    now = utcnow()
    done = store.run_write(
        lambda conn: transitions.complete_many(
            conn,
            store.ops,
            [
                (stolen, "tok-a", "1"),
                (lost, "tok-a", None),
                (with_result, "tok-a", '{"n":4}'),
                (plain, "tok-a", None),
            ],
            now,
        )
    )
    assert done == {with_result, plain}
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(jobs).order_by(jobs.c.id))}
    assert (rows[stolen].status, rows[stolen].claim_token, rows[stolen].result) == (
        "running",
        "tok-b",
        None,
    )
    assert (rows[lost].status, rows[lost].finished_at) == ("pending", None)
    for job_id, result in ((with_result, '{"n":4}'), (plain, None)):
        row = rows[job_id]
        assert (row.status, row.result, row.claim_token) == ("completed", result, None)
        assert row.finished_at == row.updated_at == now

    # A batch of one goes the single-job way, with the same fence.
    assert not store.run_write(
        lambda c: transitions.complete_many(c, store.ops, [(stolen, "tok-a", None)], now)
    )
    assert store.run_write(
        lambda c: transitions.complete_many(c, store.ops, [(stolen, "tok-b", None)], now)
    ) == {stolen}


def test_a_batch_larger_than_one_statement_is_fenced_job_by_job(ctx: Flask) -> None:
    """A worker that claims ahead records hundreds of successes at once: they go in
    statements of at most LISTED_MOST jobs, each padded to a power of two, and every job
    is still fenced by its own claim, whichever statement carries it."""
    size = LISTED_MOST + 75
    made = sample_app.add.enqueue_many([([i, 1], {}) for i in range(size)])
    claimed = _claim(ctx, "tok-a", size)
    assert len(claimed) == size
    ids = [job.id for job in made]
    stolen = set(ids[::7])  # in both statements, and the padded one
    store = store_of(ctx)
    with store.write() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(stolen)).values(claim_token="tok-b"))
    batch = [(i, "tok-a", None if i % 2 else f'{{"n":{i}}}') for i in ids]
    done = store.run_write(lambda conn: transitions.complete_many(conn, store.ops, batch, utcnow()))
    assert done == set(ids) - stolen
    with store.read() as conn:
        rows = {r.id: r for r in conn.execute(sa.select(jobs))}
    for i in stolen:
        assert (rows[i].status, rows[i].claim_token, rows[i].result) == ("running", "tok-b", None)
    for i, _, result in batch:
        if i not in stolen:
            assert (rows[i].status, rows[i].claim_token, rows[i].result) == (
                "completed",
                None,
                result,
            )


def test_listed_completions_compile_a_few_statements_whatever_the_batch_sizes() -> None:
    """One statement per batch size held about 12 MiB of compiled SQL in a worker that
    claims ahead (its batches take every size up to a hundred and more)."""
    complete_listed.cache_clear()
    now = utcnow()
    for n in range(1, 3 * LISTED_MOST):
        for stmt, params in listed([(i, "t", None if i % 3 else "1") for i in range(n)], now):
            assert len(params) <= 3 * LISTED_MOST + 1
            assert stmt is not None
    assert complete_listed.cache_info().currsize <= 2 * (LISTED_MOST.bit_length() + 1)


def _statements(store: Store, fn: Any) -> tuple[Any, list[str]]:
    """What ``fn(conn)`` returns in a write transaction, and the statements it ran."""
    seen: list[str] = []

    def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    with store.write() as conn:
        sa.event.listen(conn, "before_cursor_execute", executed)
        try:
            return fn(conn), seen
        finally:
            sa.event.remove(conn, "before_cursor_execute", executed)


def test_complete_many_is_one_statement_for_the_batch(ctx: Flask) -> None:
    """A batch of completions, with results and without, is written by one statement;
    only MariaDB, without UPDATE … RETURNING, reads back which were completed, and only
    when a claim among them was lost."""
    made = sample_app.add.enqueue_many([([i, i], {}) for i in range(7)])
    _claim(ctx, "tok-a", 7)
    store = store_of(ctx)
    now = utcnow()
    results = [None, '"two"', None, "[4]", None]
    won = [(job.id, "tok-a", result) for job, result in zip(made, results, strict=False)]
    done, seen = _statements(
        store, lambda conn: transitions.complete_many(conn, store.ops, won[::-1], now)
    )
    assert done == {job.id for job in made[:5]}
    assert len(seen) == 1, seen
    with store.read() as conn:
        stored = dict(conn.execute(sa.select(jobs.c.id, jobs.c.result)).all())
    assert [stored[job.id] for job in made[:5]] == results

    lost_one = [(made[5].id, "tok-a", "1"), (made[6].id, "tok-b", "2")]
    done, seen = _statements(
        store, lambda conn: transitions.complete_many(conn, store.ops, lost_one, now)
    )
    assert done == {made[5].id}
    assert len(seen) == (2 if store.engine.dialect.name == "mysql" else 1), seen
    assert [made[5].refresh().status, made[6].refresh().status] == [
        JobStatus.COMPLETED,
        JobStatus.RUNNING,
    ]


def test_a_job_listed_twice_is_completed_by_the_token_that_holds_its_claim(ctx: Flask) -> None:
    """A job whose claim was lost and which was claimed again may come twice in one
    batch; the token holding the claim completes it, wherever it comes in the batch."""
    made = sample_app.add.enqueue_many([([i, i], {}) for i in range(3)])
    _claim(ctx, "tok-new", 3)
    store = store_of(ctx)
    now = utcnow()
    first, second, third = (job.id for job in made)
    batch = [
        (first, "tok-old", "0"),
        (first, "tok-new", "1"),
        (second, "tok-new", "2"),
        (third, "tok-new", "3"),
        (third, "tok-old", "4"),
    ]
    done = store.run_write(lambda conn: transitions.complete_many(conn, store.ops, batch, now))
    assert done == {first, second, third}
    assert [job.refresh().result for job in made] == [1, 2, 3]


def test_worker_records_many_outcomes_and_drops_the_one_it_lost(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "batch.log"
    slow = [sample_app.record.enqueue(str(log), f"slow-{i}", 1.0) for i in range(3)]
    quick = sample_app.add.enqueue_many([([i, 1], {}) for i in range(30)])
    worker = sample_app.queue.worker(WorkerOptions(concurrency=4, poll_interval=0.05), ctx)
    with running(worker):
        wait_for(lambda: log.exists() and log.read_text().count("start") == 3, "the slow jobs")
        with store_of(ctx).write() as conn:  # what a rescue does to the first one
            conn.execute(
                sa.update(jobs).where(jobs.c.id == slow[0].id).values(claim_token="rescuer")
            )
        wait_for(lambda: all(j.refresh().status is JobStatus.COMPLETED for j in slow[1:]), "slow")
        wait_for(lambda: all(j.refresh().status is JobStatus.COMPLETED for j in quick), "quick")
        wait_for(lambda: log.read_text().count("done") == 3, "the fenced job to finish")
    assert [job.result for job in quick] == [i + 1 for i in range(30)]
    assert [job.result for job in slow[1:]] == ["slow-1", "slow-2"]
    fenced = slow[0].refresh()
    assert (fenced.status, fenced.result, fenced.finished_at) == (JobStatus.RUNNING, None, None)


def test_stopping_records_outcomes_still_waiting(ctx: Flask) -> None:
    # A burst ends as soon as nothing is eligible; every finished job is recorded by then.
    made = sample_app.add.enqueue_many([([i, 2], {}) for i in range(50)])
    worker = sample_app.queue.worker(WorkerOptions(concurrency=8, grace=1.0), ctx)
    worker.run(burst=True)
    assert [job.refresh().status for job in made] == [JobStatus.COMPLETED] * 50
    assert [job.result for job in made] == [i + 2 for i in range(50)]


# -- SQLite: writers of one process queue in-process --------------------------------------------


@pytest.mark.sqlite_only
def test_writers_of_one_process_take_turns(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 5})
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            with app.app_context():
                for i in range(30):
                    sample_app.add.enqueue(i, i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, name=f"producer-{n}") for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    with store_of(app).read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one() == 240


@pytest.mark.sqlite_only
def test_a_writer_held_up_in_process_gets_sqlites_error(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.2})
    store = store_of(app)
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with store.write():
            holding.set()
            done.wait(WAIT)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    try:
        assert holding.wait(WAIT)
        with app.app_context():
            with pytest.raises(QueueUnavailable, match="database is locked"):
                sample_app.add.enqueue(1, 2)
    finally:
        done.set()
        holder.join(WAIT)
    with app.app_context():
        assert sample_app.add.enqueue(3, 4).id == 1  # nothing was written before


# -- PostgreSQL: the claim's plan does not hang on the table's statistics ----------------------


def test_the_postgresql_claim_walks_the_claim_index_whatever_the_statistics(ctx: Flask) -> None:
    store = store_of(ctx)
    if store.engine.dialect.name != "postgresql":
        pytest.skip("planner settings are PostgreSQL's")
    sample_app.add.enqueue_many([([i, i], {}) for i in range(500)])
    with store.write() as conn:
        claimed = _claim_in(store, conn, "tok", 4)
        settings = [
            conn.exec_driver_sql(f"SHOW {name}").scalar()
            for name in ("enable_bitmapscan", "enable_sort", "jit")
        ]
        assert settings == ["off", "off", "off"]
        plan = conn.exec_driver_sql(
            "EXPLAIN SELECT id FROM sqlqueue_jobs WHERE status = 'pending' "
            "ORDER BY priority DESC, run_at, id LIMIT 4 FOR UPDATE SKIP LOCKED"
        ).scalars()
        text = "\n".join(plan)
        assert "ix_sqlqueue_jobs_claim" in text and "Sort" not in text, text
    assert len(claimed) == 4
    with store.read() as conn:  # for the claim's transaction only
        assert conn.exec_driver_sql("SHOW enable_bitmapscan").scalar() == "on"


def test_run_once_gives_its_connection_back(ctx: Flask) -> None:
    job = sample_app.add.enqueue(2, 2)
    store = store_of(ctx)
    worker = sample_app.queue.worker(app=ctx)
    assert worker.run_once()
    assert job.refresh().result == 4
    assert store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]

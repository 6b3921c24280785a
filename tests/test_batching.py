"""The worker's hot path: completions recorded in group commits, still fenced by claim;
SQLite writers of one process queueing in-process instead of in SQLite's busy handler."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import QueueUnavailable
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import lifecycle
from flask_sqlqueue.core.groupcommit import GroupCommit
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.core.store import Store
from tests import sample_app

WAIT = 10.0


def store_of(app: Flask) -> Store:
    return app.extensions["sqlqueue"].store  # type: ignore[no-any-return]


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# -- the group commit itself ---------------------------------------------------------------


def test_items_that_arrive_during_a_flush_share_the_next_one() -> None:
    batches: list[list[int]] = []
    first_flush_started = threading.Event()
    release = threading.Event()

    def flush(batch: list[int]) -> None:
        batches.append(batch)
        if len(batches) == 1:
            first_flush_started.set()
            release.wait(WAIT)

    commit: GroupCommit[int] = GroupCommit(flush, max_batch=3).start()
    commit.put(0)  # alone: flushed at once, without waiting for company
    assert first_flush_started.wait(WAIT)
    for item in range(1, 6):
        commit.put(item)  # all arrive while the first flush is busy
    release.set()
    commit.close(WAIT)
    assert batches == [[0], [1, 2, 3], [4, 5]]


def test_close_flushes_what_is_waiting_and_a_failing_flush_does_not_stop_it() -> None:
    batches: list[list[str]] = []

    def flush(batch: list[str]) -> None:
        batches.append(batch)
        if batch == ["boom"]:
            raise RuntimeError("flush failed")

    commit: GroupCommit[str] = GroupCommit(flush).start()
    commit.put("boom")
    wait_for(lambda: batches, "the first flush")
    commit.put("after")
    commit.close(WAIT)
    assert batches == [["boom"], ["after"]]


# -- complete_many: fenced like complete ------------------------------------------------------


def _claim(app: Flask, token: str, limit: int) -> list[Any]:
    store = store_of(app)
    with store.write() as conn:
        return store.ops.claim(
            conn,
            worker_id="test-worker",
            token=token,
            now=utcnow(),
            limit=limit,
            queues=(),
            tasks=[sample_app.add.name],
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
        lambda conn: lifecycle.complete_many(
            conn,
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
    assert not store.run_write(lambda c: lifecycle.complete_many(c, [(stolen, "tok-a", None)], now))
    assert store.run_write(
        lambda c: lifecycle.complete_many(c, [(stolen, "tok-b", None)], now)
    ) == {stolen}


def test_worker_records_many_outcomes_and_drops_the_one_it_lost(ctx: Flask, tmp_path: Path) -> None:
    log = tmp_path / "batch.log"
    slow = [sample_app.record.enqueue(str(log), f"slow-{i}", 1.0) for i in range(3)]
    quick = sample_app.add.enqueue_many([([i, 1], {}) for i in range(30)])
    worker = sample_app.queue.worker(WorkerOptions(concurrency=4, poll_interval=0.05), ctx)
    runner = threading.Thread(target=worker.run, name="sqlqueue-test-runner", daemon=True)
    runner.start()
    try:
        wait_for(lambda: log.exists() and log.read_text().count("start") == 3, "the slow jobs")
        with store_of(ctx).write() as conn:  # what a rescue does to the first one
            conn.execute(
                sa.update(jobs).where(jobs.c.id == slow[0].id).values(claim_token="rescuer")
            )
        wait_for(lambda: all(j.refresh().status is JobStatus.COMPLETED for j in slow[1:]), "slow")
        wait_for(lambda: all(j.refresh().status is JobStatus.COMPLETED for j in quick), "quick")
        wait_for(lambda: log.read_text().count("done") == 3, "the fenced job to finish")
    finally:
        worker.stop()
        runner.join(WAIT)
    assert not runner.is_alive()
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

"""``enqueue_many``: many jobs in one transaction, on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from flask_sqlqueue import JobStatus
from flask_sqlqueue import PayloadError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.options import Call
from tests import sample_app
from tests.conftest import query_dicts
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import running


@pytest.fixture
def engine(database_uri: str) -> Iterator[sa.Engine]:
    """An engine of the app's own, separate from the queue's, on the queue's database."""
    engine = sa.create_engine(database_uri)
    yield engine
    engine.dispose()


def _rows(database_uri: str) -> list[dict[str, Any]]:
    return query_dicts(database_uri, "SELECT * FROM sqlqueue_jobs ORDER BY id")


def test_jobs_come_back_in_order_and_are_committed(ctx: Flask, database_uri: str) -> None:
    calls = [([i, i + 1], {}) for i in range(250)] + [Call(kwargs={"a": 1, "b": 2})]
    made = sample_app.add.enqueue_many(calls)

    assert [(job.args, job.kwargs) for job in made] == [
        *[([i, i + 1], {}) for i in range(250)],
        ([], {"a": 1, "b": 2}),
    ]
    ids = [job.id for job in made]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)  # call order is id order
    assert all(job.status is JobStatus.PENDING and job.task == sample_app.add.name for job in made)
    rows = _rows(database_uri)
    assert [row["id"] for row in rows] == ids
    assert rows[3]["payload"] == '{"args":[3,4],"kwargs":{}}'
    assert {(row["queue"], row["priority"], row["max_attempts"]) for row in rows} == {
        ("default", 0, 5)
    }
    again = sample_app.queue.get_job(ids[-1])
    assert again is not None and again.kwargs == {"a": 1, "b": 2}


def test_no_calls_write_nothing(ctx: Flask, database_uri: str) -> None:
    assert sample_app.add.enqueue_many([]) == []
    assert sample_app.add.enqueue_many(iter(())) == []
    assert _rows(database_uri) == []


def test_options_apply_to_every_job(ctx: Flask, database_uri: str) -> None:
    before = sample_app.queue.state().store.now()
    made = sample_app.report.using(priority=9, delay=60, max_attempts=2).enqueue_many(
        [([1], {}), ([2], {})]
    )
    assert [(j.queue, j.priority, j.max_attempts) for j in made] == [("reports", 9, 2)] * 2
    for job in made:
        assert job.run_at - job.created_at == timedelta(seconds=60)
        assert job.run_at >= before + timedelta(seconds=60)
    when = datetime(2031, 6, 1, 12, 0, tzinfo=UTC)
    later = sample_app.report.using(run_at=when, queue="urgent").enqueue_many([([3], {})])
    rows = _rows(database_uri)
    assert [(r["queue"], r["priority"], r["max_attempts"]) for r in rows] == [
        ("reports", 9, 2),
        ("reports", 9, 2),
        ("urgent", 3, 7),  # the task's own priority and attempts
    ]
    stored = sample_app.queue.get_job(later[0].id)
    assert stored is not None and stored.run_at == when


BAD_CALLS: list[tuple[str, Any, type[Exception], str]] = [
    ("object argument", ([1], {"b": object()}), PayloadError, r"calls\[2\]: kwargs\['b'\]"),
    ("NaN", ([float("nan"), 1], {}), ValueError, r"calls\[2\]: args\[0\] = nan"),
    ("tuple argument", ([(1, 2), 1], {}), TypeError, r"calls\[2\]: args\[0\] = \(1, 2\)"),
    ("not a call", 42, TypeError, r"calls\[2\] = 42 is not a call"),
    ("three items", ([1], {}, "key"), TypeError, r"calls\[2\] = .* is not a call"),
    ("string args", ("12", {}), TypeError, r"calls\[2\]: args must be a list"),
    ("list kwargs", ([1, 2], [("a", 1)]), TypeError, r"calls\[2\]: kwargs must be a dict"),
    ("empty key", Call([1, 2], idempotency_key=""), ValueError, r"calls\[2\]: idempotency_key"),
    ("missing argument", ([1], {}), TypeError, r"calls\[2\]: Task '\S+add' does not take .* 'b'"),
    ("unknown keyword", ([1, 2], {"c": 3}), TypeError, r"calls\[2\]: .*unexpected keyword .*'c'"),
    ("huge int", ([10**5000, 1], {}), ValueError, r"calls\[2\]: args\[0\] = <an int of"),
]


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [case[1:] for case in BAD_CALLS],
    ids=[case[0] for case in BAD_CALLS],
)
def test_a_bad_call_names_its_index_and_nothing_is_written(
    ctx: Flask, queue: SQLQueue, database_uri: str, bad: Any, error: type[Exception], match: str
) -> None:
    calls = [([1, 2], {}), Call([3, 4], idempotency_key="fine"), bad, ([5, 6], {})]
    with pytest.raises(error, match=match):
        sample_app.add.enqueue_many(calls)
    with pytest.raises(error, match=match):
        queue.enqueue_many("tests.sample_app.add", calls)
    assert _rows(database_uri) == []


def test_a_bad_list_of_calls_is_refused(ctx: Flask, queue: SQLQueue, database_uri: str) -> None:
    with pytest.raises(TypeError, match="a list of calls"):
        sample_app.add.enqueue_many("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a list of calls"):
        sample_app.add.enqueue_many({"args": [1, 2]})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="each job its own"):
        sample_app.add.using(idempotency_key="one").enqueue_many([([1, 2], {})])
    with pytest.raises(ValueError, match="queue='bad name'"):
        queue.enqueue_many("tests.sample_app.add", [([1, 2], {})], queue="bad name")
    assert _rows(database_uri) == []


def test_idempotency_keys_per_call(ctx: Flask, database_uri: str) -> None:
    held = sample_app.add.using(idempotency_key="k-1").enqueue(100, 100)
    made = sample_app.add.enqueue_many(
        [
            ([1, 1], {}),
            Call([2, 2], idempotency_key="k-1"),  # exists: the existing job
            Call([3, 3], idempotency_key="k-2"),  # new
            ([4, 4], {}),
            Call([5, 5], idempotency_key="k-2"),  # repeats a call of this batch
            Call([6, 6], idempotency_key="K-2"),  # another key (compared exactly)
        ]
    )
    assert made[1].id == held.id and made[1].args == [100, 100]
    assert made[4] is made[2] and made[2].args == [3, 3]
    assert made[5].id not in {made[2].id, held.id}
    new = [made[0], made[2], made[3], made[5]]
    assert [job.args for job in new] == [[1, 1], [3, 3], [4, 4], [6, 6]]
    assert [job.id for job in new] == sorted(job.id for job in new)  # still in call order
    rows = _rows(database_uri)
    assert len(rows) == 5  # the held job and four new ones: no key inserted twice
    assert sorted(r["idempotency_key"] or "" for r in rows) == ["", "", "K-2", "k-1", "k-2"]

    again = sample_app.add.enqueue_many([Call([9, 9], idempotency_key=k) for k in ("k-2", "K-2")])
    assert [job.id for job in again] == [made[2].id, made[5].id]
    assert len(_rows(database_uri)) == 5


def test_by_name_uses_the_registered_defaults(
    ctx: Flask, queue: SQLQueue, database_uri: str
) -> None:
    made = queue.enqueue_many("tests.sample_app.report", [([1], {}), ([2], {})], priority=1)
    assert [(j.queue, j.priority, j.max_attempts) for j in made] == [("reports", 1, 7)] * 2
    other = queue.enqueue_many(
        "billing.charge", [Call([1, "eur"], idempotency_key="c-1")], unregistered=True
    )
    assert (other[0].task, other[0].queue, other[0].max_attempts) == (
        "billing.charge",
        "default",
        5,
    )
    assert [r["task"] for r in _rows(database_uri)] == [
        "tests.sample_app.report",
        "tests.sample_app.report",
        "billing.charge",
    ]


def test_session_writes_every_job_in_the_callers_transaction(
    ctx: Flask, queue: SQLQueue, engine: sa.Engine, database_uri: str
) -> None:
    with Session(engine) as session:
        made = sample_app.add.using(session=session).enqueue_many([([1, 1], {}), ([2, 2], {})])
        assert session.in_transaction()
        assert _rows(database_uri) == []
        session.rollback()
    assert all(queue.get_job(job.id) is None for job in made)
    assert _rows(database_uri) == []

    with Session(engine) as session:
        kept = queue.enqueue_many("echo", [(["a"], {}), (["b"], {})], session=session)
        session.commit()
    assert [r["id"] for r in _rows(database_uri)] == [job.id for job in kept]


def test_one_batch_wakes_an_idle_worker(ctx: Flask) -> None:
    # A worker polling far less often than any wait here runs the whole batch well
    # before its next poll: the enqueue woke it.
    worker = sample_app.queue.worker(WorkerOptions(poll_interval=10 * WAIT, concurrency=4), ctx)
    with running(worker):
        # Its first claim found nothing, so only a wake-up runs the jobs before its poll.
        wait_for(worker._dispatcher.idle.is_set, "the worker to wait for a wake-up")
        made = sample_app.add.enqueue_many([([i, i], {}) for i in range(20)])
        wait_for(
            lambda: all(job.refresh().status is JobStatus.COMPLETED for job in made),
            "the batch to wake the worker",
        )
    assert [job.result for job in made] == [2 * i for i in range(20)]


def test_eager_mode_runs_every_job(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_EAGER": True})
    with app.app_context():
        made = sample_app.add.enqueue_many([([1, 2], {}), Call([3, 4], idempotency_key="e")])
    assert [(job.status, job.result) for job in made] == [
        (JobStatus.COMPLETED, 3),
        (JobStatus.COMPLETED, 7),
    ]


def test_a_large_batch_keeps_call_order_and_keys(
    ctx: Flask, queue: SQLQueue, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keyed and unkeyed calls mixed, a held key, a key repeated in the batch: ids in call
    order, one job per key. PostgreSQL writes each page of rows in one INSERT (pages of
    100 here), whatever keys they hold."""
    from flask_sqlqueue.core.dialects import postgresql

    monkeypatch.setattr(postgresql, "ROWS_PER_INSERT", 100)
    held = sample_app.add.using(idempotency_key="k-30").enqueue(0, 0)
    calls = [
        Call([n, n], idempotency_key=f"k-{n}" if n % 10 == 0 else None) for n in range(250)
    ] + [Call([1, 1], idempotency_key="k-20")]
    store = queue.state().store
    inserts: list[str] = []

    def executed(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", executed)
    try:
        made = sample_app.add.enqueue_many(calls)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", executed)
    assert made[30].id == held.id and made[30].args == [0, 0]
    assert made[250] is made[20]
    new = [job for n, job in enumerate(made[:250]) if n != 30]
    assert [job.args for job in new] == [[n, n] for n in range(250) if n != 30]
    assert [job.id for job in new] == sorted(job.id for job in new)
    rows = _rows(database_uri)
    assert len(rows) == 250  # the held job and 249 new ones
    assert {row["id"]: row["payload"] for row in rows} == {
        job.id: f'{{"args":[{job.args[0]},{job.args[0]}],"kwargs":{{}}}}' for job in made
    }
    if store.engine.dialect.name == "postgresql":
        assert len(inserts) == 3, inserts

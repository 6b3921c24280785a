"""Jobs that depend on jobs (``depends_on``), on every backend, with real workers.

A job waits until every dependency completed and is cancelled once one ends dead or
cancelled, its own dependents with it; both happen in the transaction that ends the
dependency. The kill storm at the end runs a graph of jobs through workers SIGKILLed at
random (``benchmarks/chaos``).
"""

from __future__ import annotations

import os
import re
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from flask_sqlqueue import Call
from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import current_job
from flask_sqlqueue import schema
from flask_sqlqueue.core import failures
from flask_sqlqueue.core import operations
from flask_sqlqueue.core import roster
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core.claim import claim_job
from flask_sqlqueue.core.features import retention
from flask_sqlqueue.core.models import dependencies
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.exceptions import InvalidTransition
from flask_sqlqueue.exceptions import NoJobContext
from flask_sqlqueue.testing import assert_enqueued
from flask_sqlqueue.testing import drain
from tests import workflow_app as w
from tests.conftest import SERVER_URL_VARS
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import running

WAITING, PENDING, COMPLETED = JobStatus.WAITING, JobStatus.PENDING, JobStatus.COMPLETED
DEAD, CANCELLED = JobStatus.DEAD, JobStatus.CANCELLED


def cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["queue", *args])


def edges(app: Flask) -> set[tuple[int, int]]:
    with w.store_of(app).read() as conn:
        edge = sa.select(dependencies.c.job_id, dependencies.c.depends_on_id)
        return {(a, b) for a, b in conn.execute(edge)}


def job_count(app: Flask) -> int:
    with w.store_of(app).read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


def assert_order(app: Flask, graph: dict[int, list[int]]) -> None:
    """Every job of ``graph`` started after each of its dependencies had ended (or, for
    a task that logs no end, had started for the last time)."""
    lines = w.ran(app)
    first_start: dict[int, int] = {}
    last_line: dict[int, int] = {}
    for index, (kind, job) in enumerate(lines):
        if kind == "start":
            first_start.setdefault(job, index)
        last_line[job] = index
    for job, depends_on in graph.items():
        for dependency in depends_on:
            assert last_line[dependency] < first_start[job], (job, dependency, lines)


def claimed(app: Flask, job_id: int, token: str, worker: str = "test-worker") -> None:
    """Mark ``job_id`` running for ``worker`` with claim ``token``, as a worker's claim."""
    store = w.store_of(app)
    now = store.now()
    row = store.run_write(
        lambda conn: claim_job(conn, store.ops, job_id, worker_id=worker, token=token, now=now)
    )
    assert row is not None


# -- enqueueing -----------------------------------------------------------------------------


def test_a_job_starts_waiting_and_runs_after_every_dependency(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue("a")
        b = w.step.using(depends_on=[a]).enqueue("b")
        c = w.step.using(depends_on=[a.id]).enqueue("c")
        d = w.step.using(depends_on=[b, c.id, b]).enqueue("d")  # a diamond; b named twice
    assert (a.status, b.status, c.status, d.status) == (PENDING, WAITING, WAITING, WAITING)
    assert edges(app) == {(b.id, a.id), (c.id, a.id), (d.id, b.id), (d.id, c.id)}
    assert [w.row(app, i).has_dependents for i in (a.id, b.id, c.id, d.id)] == [1, 1, 1, 0]
    w.burst(app, concurrency=3)
    assert [w.status(app, i) for i in (a.id, b.id, c.id, d.id)] == [COMPLETED] * 4
    assert sorted(w.starts(app)) == [a.id, b.id, c.id, d.id]  # each ran once
    assert_order(app, {b.id: [a.id], c.id: [a.id], d.id: [b.id, c.id]})


def test_a_job_whose_dependencies_all_completed_starts_pending(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue(1)
    w.burst(app)
    with app.app_context():
        b = w.step.using(depends_on=[a]).enqueue(2)
    assert b.status is PENDING and b.last_error is None
    assert edges(app) == {(b.id, a.id)}
    w.burst(app)
    assert w.status(app, b.id) == COMPLETED


@pytest.mark.parametrize("ended", ["dead", "cancelled"])
def test_a_dependency_that_ended_badly_cancels_the_job_at_once(
    workflow_app: Flask,
    ended: str,
) -> None:
    app = workflow_app
    with app.app_context():
        ok = w.step.enqueue()
        if ended == "dead":
            bad = w.gives_up.enqueue()
        else:
            bad = w.step.using(delay=3600).enqueue()
            operations.cancel(w.store_of(app), [bad.id])
    w.burst(app)
    assert w.status(app, bad.id) == ended
    with app.app_context():
        job = w.step.using(depends_on=[ok, bad]).enqueue()
    verb = "is dead" if ended == "dead" else "was cancelled"
    assert job.status is CANCELLED
    assert job.last_error == f"DependencyFailed: dependency {bad.id} {verb}"
    assert job.finished_at is not None
    w.burst(app)
    assert job.id not in w.starts(app)


def test_unknown_dependency_ids_are_refused_and_nothing_is_written(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue()
        before = job_count(app)
        with pytest.raises(ValueError, match=f"no job with id {a.id + 7}, {a.id + 9};"):
            w.step.using(depends_on=[a, a.id + 9, a.id + 7]).enqueue()
        with pytest.raises(ValueError, match=f"no job with id {a.id + 7};"):
            w.step.using(depends_on=[a.id + 7]).enqueue_many([((), {})] * 3)
        with pytest.raises(ValueError, match=f"no job with id {a.id + 7};"):
            w.queue.enqueue("workflow.step", depends_on=[a.id + 7])
        # Thousands missing: the first twenty are named, the rest counted.
        many = [a.id + 100 + n for n in range(5_000)]
        with pytest.raises(ValueError) as raised:
            w.step.using(depends_on=many).enqueue()
        message = str(raised.value)
        assert f"no job with id {a.id + 100}, {a.id + 101}," in message
        assert f"{a.id + 119}... (5,000 in all);" in message
        assert str(a.id + 120) not in message and len(message) < 400
    assert job_count(app) == before
    assert edges(app) == set()
    assert not w.row(app, a.id).has_dependents


@pytest.mark.parametrize(
    ("depends_on", "error"),
    [
        (5, TypeError),  # one id, not a list of them
        ("5", TypeError),
        (b"5", TypeError),
        ({5: 6}, TypeError),
        ([True], TypeError),
        (["5"], TypeError),
        ([5.0], TypeError),
        ([None], TypeError),
        ([0], ValueError),
        ([-3], ValueError),
        ([2**63], ValueError),
    ],
)
def test_depends_on_takes_a_list_of_jobs_and_ids(depends_on: Any, error: type) -> None:
    with pytest.raises(error, match="depends_on"):
        w.step.using(depends_on=depends_on)


def test_every_way_to_enqueue_takes_depends_on(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue("a")
        by_name = w.queue.enqueue("workflow.step", args=["n"], depends_on=[a])
        batch = w.step.using(depends_on=[a]).enqueue_many([(["b1"], {}), (["b2"], {})])
        named = w.queue.enqueue_many("workflow.step", [(["c1"], {})], depends_on=[a.id])
    later = [by_name, *batch, *named]
    assert {job.status for job in later} == {WAITING}
    assert edges(app) == {(job.id, a.id) for job in later}
    w.burst(app, concurrency=2)
    assert {w.status(app, job.id) for job in later} == {COMPLETED}
    assert_order(app, {job.id: [a.id] for job in later})


def test_a_batch_with_a_key_held_already_links_only_its_new_jobs(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue("a")
        held = w.step.using(idempotency_key="held").enqueue("held")
        again = w.step.using(idempotency_key="held", depends_on=[a]).enqueue("again")
        made = w.step.using(depends_on=[a]).enqueue_many(
            [Call(["new"]), Call(["held"], idempotency_key="held")]
        )
    assert again.id == held.id and again.status is PENDING
    assert made[1].id == held.id
    assert edges(app) == {(made[0].id, a.id)}


@pytest.mark.parametrize("kind", ["connection", "session"])
def test_a_whole_graph_is_written_in_the_callers_transaction(
    workflow_app: Flask,
    database_uri: str,
    kind: str,
) -> None:
    app = workflow_app
    engine = sa.create_engine(database_uri, poolclass=sa.pool.NullPool)
    try:
        for commit in (False, True):
            with app.app_context(), engine.connect() as conn:
                target: Any = conn if kind == "connection" else Session(bind=conn)
                if kind == "connection":
                    conn.begin()
                a = w.step.using(session=target).enqueue("a")
                b = w.step.using(session=target, depends_on=[a]).enqueue("b")
                c = w.step.using(session=target, depends_on=[a, b]).enqueue_many([(["c"], {})])
                assert (a.status, b.status, c[0].status) == (PENDING, WAITING, WAITING)
                target.commit() if commit else target.rollback()
            if not commit:
                assert job_count(app) == 0 and edges(app) == set()
    finally:
        engine.dispose()
    assert edges(app) == {(b.id, a.id), (c[0].id, a.id), (c[0].id, b.id)}
    w.burst(app)
    assert_order(app, {b.id: [a.id], c[0].id: [a.id, b.id]})


# -- a dependency ends -------------------------------------------------------------------------


def test_dependents_wait_through_their_dependencys_retries(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.fails_once.enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
    w.burst(app)
    assert w.row(app, a.id).attempts == 2
    assert [w.status(app, a.id), w.status(app, b.id)] == [COMPLETED, COMPLETED]
    assert w.starts(app) == [a.id, a.id, b.id]


@pytest.mark.parametrize("task", ["fails", "gives_up"])
def test_a_dead_dependency_cancels_its_dependents_transitively(
    workflow_app: Flask,
    task: str,
) -> None:
    app = workflow_app
    with app.app_context():
        bad = getattr(w, task).enqueue()
        ok = w.step.enqueue()
        b = w.step.using(depends_on=[bad, ok]).enqueue()
        c = w.step.using(depends_on=[b]).enqueue()
        d = w.step.using(depends_on=[ok, c]).enqueue()
        other = w.step.using(depends_on=[ok]).enqueue()
    w.burst(app)
    assert w.status(app, bad.id) == DEAD
    assert [w.status(app, i) for i in (ok.id, other.id)] == [COMPLETED, COMPLETED]
    errors = {i: (w.status(app, i), w.row(app, i).last_error) for i in (b.id, c.id, d.id)}
    root = f"job {bad.id} is dead"
    assert errors == {
        b.id: (CANCELLED, f"DependencyFailed: dependency {bad.id} is dead"),
        c.id: (CANCELLED, f"DependencyFailed: dependency {b.id} was cancelled ({root})"),
        d.id: (CANCELLED, f"DependencyFailed: dependency {c.id} was cancelled ({root})"),
    }
    assert all(w.row(app, i).finished_at is not None for i in (b.id, c.id, d.id))
    assert not {b.id, c.id, d.id} & set(w.starts(app))


def test_cancelling_a_waiting_or_pending_job_cancels_its_dependents(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.using(delay=3600).enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
        c = w.step.using(depends_on=[b]).enqueue()
        x = w.step.using(delay=3600).enqueue()
        y = w.step.using(depends_on=[x]).enqueue()
    result = cli(app, "cancel", str(b.id))
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "Cancelled 1 job(s)."
    assert [w.status(app, i) for i in (a.id, b.id, c.id)] == [PENDING, CANCELLED, CANCELLED]
    assert w.row(app, b.id).last_error is None  # cancelled by a person, not for a dependency
    assert w.row(app, c.id).last_error == f"DependencyFailed: dependency {b.id} was cancelled"
    operations.cancel(w.store_of(app), [x.id])
    assert [w.status(app, x.id), w.status(app, y.id)] == [CANCELLED, CANCELLED]
    assert w.row(app, y.id).last_error == f"DependencyFailed: dependency {x.id} was cancelled"


def test_a_running_dependency_that_stops_for_its_cancellation_cancels_dependents(
    workflow_app: Flask,
) -> None:
    app = workflow_app
    with app.app_context():
        a = w.blocks.enqueue()
    with running(w.queue.worker(WorkerOptions(poll_interval=0.05), app)):
        assert w.started.wait(scaled(60))
        with app.app_context():  # while its dependency runs
            b = w.step.using(depends_on=[a]).enqueue()
        assert b.status is WAITING
        assert cli(app, "cancel", str(a.id)).exit_code == 0
        wait_for(lambda: w.status(app, b.id) != WAITING, "the dependent to be cancelled")
    assert [w.status(app, a.id), w.status(app, b.id)] == [CANCELLED, CANCELLED]
    assert w.row(app, b.id).last_error == f"DependencyFailed: dependency {a.id} was cancelled"


def test_a_dependent_enqueued_while_its_dependency_runs_is_released(
    workflow_app: Flask,
) -> None:
    """The dependency was claimed before it had dependents: its completion (a batch
    of the worker's loop) must still see the flag the enqueue set meanwhile."""
    app = workflow_app
    with app.app_context():
        a = w.blocks.enqueue("a")
        fast = w.step.enqueue("fast")  # completed in the same batch as a, or before it
    with running(w.queue.worker(WorkerOptions(poll_interval=0.05, concurrency=2), app)):
        assert w.started.wait(scaled(60))
        with app.app_context():
            b = w.step.using(depends_on=[a, fast]).enqueue("b")
        assert b.status is WAITING and w.status(app, a.id) == "running"
        w.go.set()
        wait_for(lambda: w.status(app, b.id) == COMPLETED, "the dependent to run")
    assert_order(app, {b.id: [a.id]})


def test_each_completion_path_releases_its_dependents(workflow_app: Flask) -> None:
    """The single completion (one statement, or two for a job with dependents) and the
    batch (one statement on every database while no job of it has dependents), with
    jobs with and without dependents and a lost claim in one batch."""
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        parents = [w.step.enqueue(n) for n in range(5)]
        plain = w.step.enqueue("no dependents")
        p = [job.id for job in parents]
        kids = {
            "single": w.step.using(depends_on=[p[0]]).enqueue(),
            "batch": w.step.using(depends_on=[p[1], p[2]]).enqueue(),
            "lost": w.step.using(depends_on=[p[3]]).enqueue(),
            "half": w.step.using(depends_on=[p[2], p[4]]).enqueue(),
        }
    for job_id in [*p, plain.id]:
        claimed(app, job_id, f"tok-{job_id}")
    now = store.now()
    assert store.run_write(lambda c: transitions.complete(c, p[0], f"tok-{p[0]}", "0", now))
    assert w.status(app, kids["single"].id) == PENDING
    batch = [(i, f"tok-{i}", None) for i in (p[1], p[2], plain.id)] + [(p[3], "stolen", None)]
    done = store.run_write(lambda c: transitions.complete_many(c, store.ops, batch, now))
    assert done == {p[1], p[2], plain.id}
    statuses = {name: w.status(app, job.id) for name, job in kids.items()}
    assert statuses == {"single": PENDING, "batch": PENDING, "lost": WAITING, "half": WAITING}
    assert w.status(app, p[3]) == "running"


def test_two_dependencies_completing_at_once_release_their_dependent_once(
    workflow_app: Flask,
    database_uri: str,
) -> None:
    """Each completion sees the other still running when it starts; the one that takes
    the dependent's lock second must see the first's commit and release it."""
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        a, b = w.step.enqueue("a"), w.step.enqueue("b")
        both = w.step.using(depends_on=[a, b]).enqueue()
    claimed(app, a.id, "tok-a")
    claimed(app, b.id, "tok-b")
    now = store.now()
    first = store.engine.connect()
    try:
        first.begin()  # BEGIN IMMEDIATE on SQLite: the write lock, until it commits
        assert transitions.complete(first, a.id, "tok-a", None, now)
        assert w.status(app, both.id) == WAITING  # b still runs for the first
        done = threading.Event()
        second = threading.Thread(
            target=lambda: (
                done.set()
                if store.run_write(lambda c: transitions.complete(c, b.id, "tok-b", None, now))
                else None
            )
        )
        second.start()
        # The second waits for the first: for the dependent's row lock on a server, for
        # the database's write lock on SQLite.
        assert not done.wait(scaled(0.5))
        first.commit()
    finally:
        first.close()
    second.join(scaled(30))
    assert done.is_set()
    assert w.status(app, both.id) == PENDING
    w.burst(app)
    assert w.starts(app) == [both.id]


def test_a_dead_workers_job_with_its_attempts_spent_cancels_dependents(
    workflow_app: Flask,
) -> None:
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        a = w.step.using(max_attempts=1).enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
    claimed(app, a.id, "tok", worker="a-worker-that-never-was")
    # Judged lost at once (no worker row, no time to wait): what `flask queue rescue`
    # and every worker's heartbeat do after SQLQUEUE_STALE_AFTER.
    assert roster.rescue(store, 0.0) == [(a.id, DEAD, "a-worker-that-never-was")]
    assert [w.status(app, a.id), w.status(app, b.id)] == [DEAD, CANCELLED]
    assert w.row(app, b.id).last_error == f"DependencyFailed: dependency {a.id} is dead"


# -- a person acts on a workflow ------------------------------------------------------------


def test_replaying_a_dead_dependency_leaves_its_cancelled_dependents(workflow_app: Flask) -> None:
    app = workflow_app
    w.failing.set()
    with app.app_context():
        a = w.flaky.enqueue("a")
        b = w.step.using(depends_on=[a]).enqueue("b")
        c = w.step.using(depends_on=[b]).enqueue("c")
    w.burst(app)
    assert [w.status(app, i) for i in (a.id, b.id, c.id)] == [DEAD, CANCELLED, CANCELLED]
    # A dependent cannot be replayed alone while its dependency is dead: it would wait
    # for good, or run without it.
    refused = cli(app, "retry", str(b.id))
    assert refused.exit_code == 1
    assert f"Cannot replay job {b.id} (DependencyFailed: dependency {a.id} is dead)" in (
        refused.output
    )
    assert w.status(app, b.id) == CANCELLED
    w.failing.clear()
    assert cli(app, "retry", str(a.id)).exit_code == 0
    w.burst(app)
    assert [w.status(app, i) for i in (a.id, b.id, c.id)] == [COMPLETED, CANCELLED, CANCELLED]
    # Replayed once its dependency completed: pending at once, and its own dependent
    # replayed with it waits for it.
    assert cli(app, "retry", str(b.id), str(c.id)).exit_code == 0
    assert [w.status(app, b.id), w.status(app, c.id)] == [PENDING, WAITING]
    w.burst(app)
    assert [w.status(app, i) for i in (b.id, c.id)] == [COMPLETED, COMPLETED]
    assert_order(app, {b.id: [a.id], c.id: [b.id]})


def test_a_dependency_and_its_dependent_replayed_together(workflow_app: Flask) -> None:
    app = workflow_app
    w.failing.set()
    with app.app_context():
        a = w.flaky.enqueue("a")
        b = w.step.using(depends_on=[a]).enqueue("b")
    w.burst(app)
    w.failing.clear()
    assert operations.retry(w.store_of(app), [b.id, a.id]) == 2
    assert [w.status(app, a.id), w.status(app, b.id)] == [PENDING, WAITING]
    w.burst(app)
    assert [w.status(app, a.id), w.status(app, b.id)] == [COMPLETED, COMPLETED]
    with pytest.raises(InvalidTransition):
        operations.retry(w.store_of(app), [b.id])  # completed: nothing to replay


def test_deleting_an_unfinished_dependency_cancels_its_dependents(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.using(delay=3600).enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
        c = w.step.using(depends_on=[b]).enqueue()
    assert operations.delete(w.store_of(app), [a.id]) == 1
    assert [w.status(app, b.id), w.status(app, c.id)] == [CANCELLED, CANCELLED]
    assert w.row(app, b.id).last_error == f"DependencyFailed: dependency {a.id} was deleted"
    shown = cli(app, "show", str(b.id)).output
    assert f"depends on: 1\n  {a.id}  gone (purged or deleted; counts as completed)" in shown
    operations.delete(w.store_of(app), [b.id, c.id])
    assert edges(app) == set()  # the edges of deleted jobs go with them


def test_a_purged_completed_dependency_counts_as_completed(workflow_app: Flask) -> None:
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        a = w.step.enqueue("a")
    w.burst(app)
    with app.app_context():
        later = w.step.using(delay=3600).enqueue("later")
        both = w.collects.using(depends_on=[a, later]).enqueue()
    assert operations.purge(store, "completed", timedelta(0)) == 1
    assert w.status(app, both.id) == WAITING  # still waiting for the other one
    with store.write() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == later.id).values(run_at=store.now()))
    w.burst(app)
    assert w.status(app, both.id) == COMPLETED
    # The purged dependency's result went with it.
    assert w.row(app, both.id).result == f'{{"{later.id}":"later"}}'
    # Pruning finished jobs deletes their own edges too.
    old = store.now() + timedelta(seconds=1)
    pruned = store.run_write(lambda c: retention.prune_jobs_batch(c, "completed", old, 500))
    assert pruned == 2
    assert edges(app) == set()


def test_dependency_results_inside_a_task(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue(3)
        b = w.step.enqueue({"x": [1, None]})
        n = w.step.enqueue()
        both = w.collects.using(depends_on=[b, a, n]).enqueue()
        alone = w.collects.enqueue()
    w.burst(app)
    with app.app_context():
        assert both.refresh().result == {
            str(a.id): 3,
            str(b.id): {"x": [1, None]},
            str(n.id): None,
        }
        assert alone.refresh().result == {}
    with pytest.raises(NoJobContext):
        current_job.dependency_results  # noqa: B018


def test_drain_and_eager_mode_release_dependents(workflow_app: Flask, tmp_path: Path) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.enqueue("a")
        b = w.step.using(depends_on=[a]).enqueue("b")
        c = w.collects.using(depends_on=[b]).enqueue()
        assert assert_enqueued(w.collects).id == c.id  # waiting counts as enqueued
        ran = drain()
    assert [job.id for job in ran] == [a.id, b.id, c.id]
    assert [job.status for job in ran] == [COMPLETED] * 3
    database = app.config["SQLQUEUE_DATABASE_URI"]
    eager = w.make_app(database, tmp_path, schema=False, SQLQUEUE_EAGER=True)
    try:
        with eager.app_context():
            first = w.step.enqueue("first")
            second = w.collects.using(depends_on=[first]).enqueue()
            w.failing.set()
            bad = w.flaky.enqueue()
            skipped = w.step.using(depends_on=[bad]).enqueue()
        assert (first.status, second.status) == (COMPLETED, COMPLETED)
        assert second.result == {str(first.id): "first"}
        assert (bad.status, skipped.status) == (DEAD, CANCELLED)
    finally:
        w.store_of(eager).engine.dispose()


def test_the_command_line_shows_waiting_jobs_and_edges(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a = w.step.using(delay=3600).enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
        c = w.step.using(depends_on=[a, b]).enqueue()
    listed = cli(app, "list", "--status", "waiting")
    assert listed.exit_code == 0, listed.output
    assert [int(line.split()[0]) for line in listed.stdout.splitlines()[1:]] == [c.id, b.id]
    shown = cli(app, "show", str(b.id)).stdout.splitlines()
    assert re.fullmatch(r"status\s+waiting", shown[3]), shown
    at = shown.index("depends on: 1")
    assert shown[at : at + 4] == [
        "depends on: 1",
        f"  {a.id}  pending",
        "dependents: 1",
        f"  {c.id}  waiting",
    ]
    plain = cli(app, "show", str(a.id)).stdout
    assert "depends on" not in plain and f"dependents: 2\n  {b.id}  waiting\n" in plain
    header, default = cli(app, "status").stdout.splitlines()[:2]
    assert header.split()[:3] == ["queue", "waiting", "pending"]
    assert default.split()[:3] == ["default", "2", "1"]


def test_a_downgrade_cancels_the_jobs_still_waiting(workflow_app: Flask) -> None:
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        a = w.step.using(delay=3600).enqueue()
        b = w.step.using(depends_on=[a]).enqueue()
    schema.downgrade(store.engine, "0009")
    with store.read() as conn:
        row = conn.execute(
            sa.text(f"SELECT status, last_error FROM sqlqueue_jobs WHERE id = {b.id}")
        ).one()
    assert row.status == "cancelled"
    assert row.last_error.startswith("DependencyFailed: cancelled by a schema downgrade")
    schema.upgrade(store.engine)
    assert w.status(app, a.id) == PENDING and edges(app) == set()


def test_a_fan_out_larger_than_a_statement_is_released_and_cancelled(
    workflow_app: Flask,
) -> None:
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        a, b = w.step.enqueue(), w.step.enqueue()
        released = w.step.using(depends_on=[a]).enqueue_many([((), {})] * 1100)
        cancelled = w.step.using(depends_on=[b]).enqueue_many([((), {})] * 1100)
        tail = w.step.using(depends_on=[cancelled[-1]]).enqueue()
    claimed(app, a.id, "tok-a")
    claimed(app, b.id, "tok-b")
    now = store.now()
    assert store.run_write(lambda c: transitions.complete(c, a.id, "tok-a", None, now))
    record = failures.error_record(1, "Boom", "boom", "", "w", now)
    assert store.run_write(lambda c: transitions.fail(c, b.id, "tok-b", record, None, now)) == DEAD
    with store.read() as conn:
        counts = dict(
            conn.execute(
                sa.select(jobs.c.status, sa.func.count())
                .where(jobs.c.id > b.id)
                .group_by(jobs.c.status)
            ).all()
        )
    assert counts == {"pending": len(released), "cancelled": len(cancelled) + 1}
    assert w.row(app, tail.id).last_error == (
        f"DependencyFailed: dependency {cancelled[-1].id} was cancelled (job {b.id} is dead)"
    )


def test_the_example_of_the_workflows_page_runs_as_it_says(tmp_path: Path) -> None:
    assert w.run_doc_example(tmp_path, "workflow_demo.py") == ["waiting", "completed 5"]


# -- a kill storm over a graph ---------------------------------------------------------------


def _base_urls() -> list[Any]:
    params = [pytest.param("sqlite:///", id="sqlite")]
    for kind, var in SERVER_URL_VARS.items():
        url = os.environ.get(var)
        marks = [] if url else [pytest.mark.skip(f"set {var} to run against {kind}")]
        params.append(pytest.param(url or "", id=kind, marks=marks))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("base_url", _base_urls())
def test_a_kill_storm_over_a_graph_loses_nothing_and_keeps_the_order(
    base_url: str, tmp_path: Path
) -> None:
    from benchmarks.chaos.kill_storm import kill_storm

    result = kill_storm(
        base_url,
        tmp_path,
        jobs=200,
        graph=3,
        job_ms=(20, 80),
        duration=8,
        workers=3,
        kill_every=0.5,
        target="ready",
    )
    print(result.markdown())
    assert result.ok, result.violations
    figures = dict(result.figures)
    assert figures["jobs lost (not completed)"] == "0"
    assert figures["jobs left waiting"] == "0"
    assert figures["dependents started before a dependency completed"] == "0"
    assert int(figures["jobs with dependencies"]) > 100
    # Jobs were taken from killed workers (running, or claimed ahead) and run again.
    assert int(figures["rescues recorded (sum of rescues)"]) > 0, "the storm hit no job"

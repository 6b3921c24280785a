"""Chains and batches with callbacks, on every backend, with real workers.

A chain is steps each depending on the one before; a batch is members with callbacks
that wait for every member over edges of their own kind (core/batches.py): on_success
once all completed, on_failure once all finished and one did not complete, on_complete
once all finished. Each callback runs at most once, or ends cancelled saying why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask
from sqlalchemy.orm import Session

from flask_sqlqueue import Batch
from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import schema
from flask_sqlqueue.core import operations
from flask_sqlqueue.core.models import batches
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.tasks import Step
from flask_sqlqueue.testing import drain
from tests import workflow_app as w
from tests.test_dependencies import assert_order
from tests.test_dependencies import edges
from tests.test_dependencies import job_count
from tests.waiting import wait_for
from tests.workers import running

WAITING, PENDING, COMPLETED = JobStatus.WAITING, JobStatus.PENDING, JobStatus.COMPLETED
DEAD, CANCELLED = JobStatus.DEAD, JobStatus.CANCELLED
queue = w.queue


def statuses(app: Flask, *ids: int | None) -> list[str]:
    return [w.status(app, i) for i in ids if i is not None]


def batch_count(app: Flask) -> int:
    with w.store_of(app).read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one())


# -- chains ----------------------------------------------------------------------------------


def test_a_chain_runs_its_steps_in_order(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        made = queue.chain(
            w.step.step("a"), w.step.using(queue="default", priority=5).step("b"), w.collects.step()
        )
    a, b, c = made
    assert (a.status, b.status, c.status) == (PENDING, WAITING, WAITING)
    assert b.priority == 5
    assert edges(app) == {(b.id, a.id), (c.id, b.id)}
    w.burst(app, concurrency=3)
    assert statuses(app, a.id, b.id, c.id) == [COMPLETED] * 3
    assert_order(app, {b.id: [a.id], c.id: [b.id]})
    with app.app_context():
        # The step after reads the result of the one before.
        assert c.refresh().result == {str(b.id): "b"}


def test_a_step_that_ends_dead_cancels_the_rest_of_the_chain(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a, bad, c, d = queue.chain(w.step.step(), w.gives_up.step(), w.step.step(), w.step.step())
    w.burst(app)
    assert statuses(app, a.id, bad.id, c.id, d.id) == [COMPLETED, DEAD, CANCELLED, CANCELLED]
    assert w.row(app, d.id).last_error == (
        f"DependencyFailed: dependency {c.id} was cancelled (job {bad.id} is dead)"
    )
    assert sorted(w.starts(app)) == [a.id, bad.id]


def test_cancelling_the_first_unfinished_step_cancels_the_chain(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        a, b, c = queue.chain(w.step.using(delay=3600).step(), w.step.step(), w.step.step())
    operations.cancel(w.store_of(app), [a.id])
    assert statuses(app, a.id, b.id, c.id) == [CANCELLED] * 3


def test_a_chain_is_checked_before_anything_is_written(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        with pytest.raises(ValueError, match="at least one step"):
            queue.chain()
        with pytest.raises(TypeError, match="not a step"):
            queue.chain(w.step.step(), w.step)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="does not take these arguments"):
            queue.chain(w.step.step(), w.step.step(1, 2, 3))
    assert job_count(app) == 0


def test_a_chain_and_a_batch_are_written_in_the_callers_transaction(
    workflow_app: Flask,
) -> None:
    app = workflow_app
    engine = w.store_of(app).engine
    with app.app_context():
        with Session(engine) as session:
            queue.chain(w.step.step(), w.step.step(), session=session)
            queue.batch([w.step.step()], on_complete=w.step.step(), session=session)
            session.rollback()
        assert job_count(app) == 0 and batch_count(app) == 0
        with Session(engine) as session:
            a, b = queue.chain(w.step.step(), w.step.step(), session=session)
            made = queue.batch([w.step.step()], on_complete=w.step.step(), session=session)
            session.commit()
    assert statuses(app, a.id, b.id) == [PENDING, WAITING]
    assert batch_count(app) == 1 and job_count(app) == 4
    with app.app_context():
        found = queue.get_batch(made.id)
    assert found is not None and found.size == 1


def test_a_failing_step_in_the_queues_own_transaction_writes_nothing(
    workflow_app: Flask,
) -> None:
    app = workflow_app
    with app.app_context():
        with pytest.raises(ValueError, match="names no job"):
            queue.batch([w.step.step(), w.step.using(depends_on=[10**9]).step()])
        with pytest.raises(ValueError, match="names no job"):
            queue.chain(w.step.step(), w.step.using(depends_on=[10**9]).step())
    assert job_count(app) == 0 and batch_count(app) == 0


# -- batches ---------------------------------------------------------------------------------


def callbacks() -> dict[str, Step]:
    return {
        "on_success": w.collects.step(),
        "on_failure": w.collects.step(),
        "on_complete": w.collects.step(),
    }


def assert_callbacks(
    app: Flask, batch: Batch, ids: list[int], *, ran: tuple[str, ...], skipped: tuple[str, str]
) -> None:
    """The callbacks named in ``ran`` completed, each run once, after every member of
    ``ids`` ended; ``skipped`` (its name, and the error it ends with) ended cancelled
    and never ran."""
    ran_ids = [getattr(batch, f"{name}_id") for name in ran]
    name, error = skipped
    skipped_id = getattr(batch, f"{name}_id")
    assert statuses(app, *ran_ids) == [COMPLETED] * len(ran_ids)
    assert w.status(app, skipped_id) == CANCELLED
    assert w.row(app, skipped_id).last_error == error
    runs = w.starts(app)
    assert [runs.count(job_id) for job_id in ran_ids] == [1] * len(ran_ids)
    assert skipped_id not in runs
    assert_order(app, dict.fromkeys(ran_ids, ids))


def test_a_batch_that_all_completes_runs_on_success_and_on_complete(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        batch = queue.batch([w.step.step(n) for n in range(3)], label="three", **callbacks())
        members = batch.jobs
        assert [job.status for job in members] == [PENDING] * 3
        assert all(job.batch_id == batch.id for job in members)
        assert str(batch.progress()) == "0 of 3 done"
        assert batch.progress().counts[PENDING] == 3
    w.burst(app, concurrency=3)
    ids = [job.id for job in members]
    error = f"NotNeeded: batch {batch.id}: every member completed"
    assert_callbacks(
        app, batch, ids, ran=("on_success", "on_complete"), skipped=("on_failure", error)
    )
    with app.app_context():
        found = queue.get_batch(batch.id)
        assert found is not None and found.label == "three"
        assert str(found.progress()) == "3 of 3 done"
        assert found.progress().counts[COMPLETED] == 3
        assert found.on_complete is not None
        assert found.on_complete.result == {str(i): n for n, i in enumerate(ids)}


def test_a_batch_with_a_dead_member_runs_on_failure_and_on_complete(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        batch = queue.batch([w.step.step(1), w.gives_up.step(), w.step.step(2)], **callbacks())
        ids = [job.id for job in batch.jobs]
    w.burst(app, concurrency=3)
    assert statuses(app, *ids) == [COMPLETED, DEAD, COMPLETED]
    error = f"DependencyFailed: dependency {ids[1]} is dead"
    assert_callbacks(
        app, batch, ids, ran=("on_failure", "on_complete"), skipped=("on_success", error)
    )
    with app.app_context():
        progress = batch.progress()
    assert str(progress) == "3 of 3 done"
    assert (progress.counts[COMPLETED], progress.counts[DEAD]) == (2, 1)


def test_a_callback_waits_for_every_member_however_each_ends(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        batch = queue.batch(
            [w.gives_up.step(), w.blocks.step()],
            on_failure=w.step.step(),
            on_complete=w.step.step(),
        )
        dead, slow = (job.id for job in batch.jobs)
    with running(queue.worker(WorkerOptions(poll_interval=0.05, concurrency=2), app)):
        wait_for(lambda: w.status(app, dead) == DEAD and w.started.is_set())
        # The dead member released nothing: the other one is still running.
        assert statuses(app, batch.on_failure_id, batch.on_complete_id) == [WAITING] * 2
        with app.app_context():
            assert str(batch.progress()) == "1 of 2 done"
        w.go.set()
        wait_for(lambda: w.status(app, batch.on_complete_id) == COMPLETED)
        wait_for(lambda: w.status(app, batch.on_failure_id) == COMPLETED)
    assert w.status(app, slow) == COMPLETED


def test_a_batch_of_callbacks_in_any_subset(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        only = queue.batch([w.step.step()], on_complete=w.step.step())
        none = queue.batch([w.step.step(), w.step.step()])
    assert (only.on_success_id, only.on_failure_id) == (None, None)
    assert none.callback_ids == []
    w.burst(app)
    assert w.status(app, only.on_complete_id) == COMPLETED
    with app.app_context():
        assert str(none.progress()) == "2 of 2 done"
        assert queue.get_batch(10**9) is None


def test_a_batch_is_checked_before_anything_is_written(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        with pytest.raises(ValueError, match="at least one step"):
            queue.batch([], on_complete=w.step.step())
        with pytest.raises(ValueError, match="idempotency_key"):
            queue.batch([w.step.using(idempotency_key="k").step()])
        with pytest.raises(TypeError, match="does not take these arguments"):
            queue.batch([w.step.step()], on_success=w.step.step(1, 2, 3))
        with pytest.raises(ValueError, match="label"):
            queue.batch([w.step.step()], label="x" * 256)
    assert job_count(app) == 0 and batch_count(app) == 0


def test_cancelling_a_batch_cancels_what_has_not_run(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        batch = queue.batch(
            [w.blocks.step(), w.step.using(delay=3600).step(), w.step.using(delay=3600).step()],
            **callbacks(),
        )
        slow, later, other = (job.id for job in batch.jobs)
    with running(queue.worker(WorkerOptions(poll_interval=0.05), app)):
        wait_for(w.started.is_set)
        with app.app_context():
            done = queue.cancel_batch(batch.id)
        assert sorted(done.cancelled) == sorted([later, other, *batch.callback_ids])
        assert done.requested == [slow]
        wait_for(lambda: w.status(app, slow) == CANCELLED)
    assert statuses(app, later, other, *batch.callback_ids) == [CANCELLED] * 5
    # No callback ran: each was cancelled before the last member ended.
    assert w.starts(app) == [slow]
    with app.app_context():
        assert str(batch.progress()) == "3 of 3 done"
        with pytest.raises(LookupError):
            queue.cancel_batch(10**9)


def test_drain_and_eager_mode_run_chains_and_batches(workflow_app: Flask, tmp_path: Path) -> None:
    app = workflow_app
    with app.app_context():
        a, b = queue.chain(w.step.step("a"), w.collects.step())
        batch = queue.batch([w.step.step(1)], on_success=w.step.step(), on_failure=w.step.step())
        drain()
        assert b.refresh().result == {str(a.id): "a"}
    assert w.status(app, batch.on_success_id) == COMPLETED
    assert w.status(app, batch.on_failure_id) == CANCELLED
    database = app.config["SQLQUEUE_DATABASE_URI"]
    eager = w.make_app(database, tmp_path, schema=False, SQLQUEUE_EAGER=True)
    try:
        with eager.app_context():
            first, second = queue.chain(w.step.step("first"), w.collects.step())
        assert (first.status, second.status) == (COMPLETED, COMPLETED)
        assert second.result == {str(first.id): "first"}
    finally:
        w.store_of(eager).engine.dispose()


# -- where people see it -----------------------------------------------------------------------


def test_the_command_line_and_the_admin_name_a_jobs_batch(workflow_app: Flask) -> None:
    app = workflow_app
    with app.app_context():
        batch = queue.batch([w.step.step(), w.step.using(delay=3600).step()], label="nightly")
        done, _ = (job.id for job in batch.jobs)
        plain = w.step.enqueue()
    w.burst(app)
    shown = app.test_cli_runner().invoke(args=["queue", "show", str(done)]).stdout
    assert re.search(rf"batch\s+{batch.id} \(nightly\): 1 of 2 done", shown), shown
    alone = app.test_cli_runner().invoke(args=["queue", "show", str(plain.id)]).stdout
    assert "batch" not in alone
    app.secret_key = "test secret"
    app.register_blueprint(queue.admin_blueprint(authorize=lambda: True))
    body = app.test_client().get(f"/jobs/{done}").get_data(as_text=True)
    assert f'id="sqlqueue-batch">{batch.id} (nightly): 1 of 2 done</dd>' in body
    assert f"/jobs/{done}/workflow" in body
    lone = app.test_client().get(f"/jobs/{plain.id}").get_data(as_text=True)
    assert 'id="sqlqueue-batch"' not in lone


# -- the schema --------------------------------------------------------------------------------


def test_a_downgrade_drops_batches_and_an_upgrade_brings_them_back(workflow_app: Flask) -> None:
    app = workflow_app
    store = w.store_of(app)
    with app.app_context():
        queue.batch([w.step.step()], on_complete=w.step.step())
    schema.downgrade(store.engine, "0008")
    inspector = sa.inspect(store.engine)
    assert "sqlqueue_batches" not in inspector.get_table_names()
    assert "batch_id" not in {c["name"] for c in inspector.get_columns("sqlqueue_jobs")}
    schema.upgrade(store.engine)
    store.engine.dispose()
    with store.read() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one() == 0
        assert conn.execute(sa.select(jobs.c.batch_id)).scalars().all() == [None, None]


def test_the_examples_of_the_workflows_page_run_as_they_say(tmp_path: Path) -> None:
    expected = {
        "chain_demo.py": ["completed 14"],
        "batch_demo.py": [
            "0 of 3 done",
            "3 of 3 done",
            "cancelled completed completed",
            "2 of 3 resized",
        ],
    }
    for name, output in expected.items():
        assert w.run_doc_example(tmp_path, name) == output

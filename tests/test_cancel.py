"""Cancelling running jobs, cooperatively, on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest
from flask import Flask

from flask_sqlqueue import JobCancelled
from flask_sqlqueue import JobStatus
from flask_sqlqueue import current_job
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import roster
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core.context import JobContext
from flask_sqlqueue.core.worker import Worker
from flask_sqlqueue.core.worker.attempt import Attempt
from flask_sqlqueue.exceptions import InvalidTransition
from flask_sqlqueue.exceptions import NoJobContext
from tests import control_app as c
from tests.waiting import wait_for


def cancel_cli(app: Flask, *ids: int) -> str:
    result = app.test_cli_runner().invoke(args=["queue", "cancel", *map(str, ids)])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output.strip()


def test_a_running_job_stops_when_its_task_checks(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        output = cancel_cli(app, job.id)
        assert output.startswith("Asked 1 running job(s) to stop")
        assert c.row(app, job.id).cancel_requested_at is not None
        wait_for(lambda: c.row(app, job.id).status != "running")
    row = c.row(app, job.id)
    assert row.status == JobStatus.CANCELLED
    # Not a failed attempt: no error recorded, nothing retried.
    assert row.attempts == 1
    assert row.last_error is None and row.errors is None
    assert row.finished_at is not None and row.claim_token is None


def test_a_task_may_return_when_asked_to_stop(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.returns_when_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        cancel_cli(app, job.id)
        wait_for(lambda: c.row(app, job.id).status != "running")
    assert job.refresh().status is JobStatus.COMPLETED
    assert job.result == "stopped early"
    assert job.cancel_requested_at is not None


def test_a_task_that_ignores_the_request_finishes_normally(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.waits.enqueue("all of it")
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        before = app.test_cli_runner().invoke(args=["queue", "status"]).output
        cancel_cli(app, job.id)
        status = app.test_cli_runner().invoke(args=["queue", "status"]).output
        c.go.set()
        wait_for(lambda: c.row(app, job.id).status != "running")
    assert job.refresh().status is JobStatus.COMPLETED
    assert job.result == "all of it"
    # flask queue status lists running jobs asked to stop, while they run.
    assert "cancel requested" not in before
    assert f"cancel requested: running job(s) {job.id} (each stops when" in status
    after = app.test_cli_runner().invoke(args=["queue", "status"]).output
    assert "cancel requested" not in after


def test_a_failed_attempt_after_a_request_is_not_retried(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.waits_then_fails.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        cancel_cli(app, job.id)
        c.go.set()
        wait_for(lambda: c.row(app, job.id).status != "running")
    job.refresh()
    assert job.status is JobStatus.CANCELLED
    assert job.attempts == 1 < job.max_attempts
    assert job.last_error == "RuntimeError: failed after the cancel request"


def test_pending_and_running_in_one_batch(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        running = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        with app.app_context():
            pending = c.add.using(delay=3600).enqueue(1, 2)
        output = cancel_cli(app, pending.id, running.id)
        assert output == (
            f"Cancelled 1 job(s). Asked 1 running job(s) to stop ({running.id}); "
            "each stops when its task checks current_job.cancel_requested."
        )
        assert c.row(app, pending.id).status == "cancelled"
        wait_for(lambda: c.row(app, running.id).status == "cancelled")


def test_a_finished_job_in_the_batch_refuses_all(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        done = c.add.enqueue(1, 2)
        pending = c.add.using(delay=3600).enqueue(3, 4)
    c.burst(app)
    store = c.store_of(app)
    update = {"status": "running", "claim_token": "t"}
    c.update(app, pending.id, **update)
    with pytest.raises(
        InvalidTransition, match=f"Cannot cancel job {done.id}: it is completed; nothing cancelled"
    ):
        store.run_write(lambda conn: actions.cancel_jobs(conn, [pending.id, done.id], store.now()))
    assert c.row(app, pending.id).cancel_requested_at is None
    # Two that cannot: each with its state, in one sentence.
    with app.app_context():
        also = c.add.enqueue(5, 6)
    c.burst(app)
    with pytest.raises(
        InvalidTransition,
        match=rf"Cannot cancel jobs {done.id} \(completed\), {also.id} \(completed\); nothing",
    ):
        store.run_write(lambda conn: actions.cancel_jobs(conn, [done.id, also.id], store.now()))


def test_release_and_rescue_of_a_job_asked_to_stop_end_cancelled(control_app: Flask) -> None:
    app = control_app
    store = c.store_of(app)
    now = store.now()
    with app.app_context():
        released, rescued, plain = (c.add.enqueue(i, i) for i in range(3))
    for job in (released, rescued, plain):
        c.update(
            app,
            job.id,
            status="running",
            attempts=1,
            worker_id="gone:1:x",
            claim_token=f"token{job.id}",
            started_at=now - timedelta(hours=1),
        )
    store.run_write(lambda conn: actions.cancel_jobs(conn, [released.id, rescued.id], now))

    assert store.run_write(
        lambda conn: transitions.release(conn, released.id, f"token{released.id}", now)
    )
    found = store.run_write(lambda conn: roster.rescue_stale(conn, now - timedelta(minutes=1), now))

    assert sorted((job_id, status) for job_id, status, _ in found) == [
        (rescued.id, "cancelled"),
        (plain.id, "pending"),
    ]
    for job in (released, rescued):
        row = c.row(app, job.id)
        assert (row.status, row.finished_at is not None) == ("cancelled", True)
    assert c.row(app, plain.id).finished_at is None


def test_replay_clears_the_request_and_progress(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        cancel_cli(app, job.id)
        wait_for(lambda: c.row(app, job.id).status == "cancelled")
    c.update(app, job.id, progress=0.5, progress_message="half")
    result = app.test_cli_runner().invoke(args=["queue", "retry", str(job.id)])
    assert result.exit_code == 0, result.output
    row = c.row(app, job.id)
    assert (row.status, row.cancel_requested_at, row.progress, row.progress_message) == (
        "pending",
        None,
        None,
        None,
    )


def test_cancel_requested_reads_the_row_at_most_once_a_second(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.waits.enqueue()
    worker = c.queue.worker(app=app)
    claimed = worker._claim(1)
    assert [a.job.id for a in claimed] == [job.id]
    ctx = lifecycle_context(worker, claimed[0])
    with c.statements(app) as seen:
        answers = {ctx.cancel_requested for _ in range(500)}
    assert answers == {False}
    reads = [s for s in seen if "cancel_requested_at" in s]
    assert 1 <= len(reads) <= 3, reads  # 500 calls; one read, two if a second passed
    store = c.store_of(app)
    store.run_write(lambda conn: actions.cancel_jobs(conn, [job.id], store.now()))
    ctx._live.cancel_checked_at = -1e9  # as if a second went by
    assert ctx.cancel_requested is True
    with c.statements(app) as seen:
        assert all(ctx.cancel_requested for _ in range(100))
    assert seen == []  # a request once seen is never read again
    with pytest.raises(JobCancelled, match=f"Job {job.id} was cancelled"):
        ctx.raise_if_cancelled()
    worker.close()


def lifecycle_context(worker: Worker, attempt: Attempt) -> JobContext:
    """The context the worker would give the task running ``attempt``."""
    return attempt.context(worker.store, worker.id)


def test_outside_a_task_there_is_nothing_to_cancel() -> None:
    with pytest.raises(NoJobContext):
        _ = current_job.cancel_requested
    with pytest.raises(NoJobContext):
        current_job.raise_if_cancelled()


def test_admin_asks_a_running_job_to_stop(control_app: Flask) -> None:
    app = control_app
    app.secret_key = "test"
    app.register_blueprint(c.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    client = app.test_client()
    with app.app_context():
        job = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        page = client.get(f"/q/jobs/{job.id}").get_data(as_text=True)
        assert "Ask to stop" in page
        token = c.csrf_token(page)
        response = client.post(f"/q/jobs/{job.id}/cancel", data={"csrf_token": token})
        assert response.status_code == 303
        wait_for(lambda: c.row(app, job.id).status == "cancelled")
    page = client.get(f"/q/jobs/{job.id}").get_data(as_text=True)
    assert "Cancel requested" in page
    assert "Ask to stop" not in page

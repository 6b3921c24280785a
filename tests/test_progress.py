"""``current_job.set_progress``: validated, throttled, fenced, shown; on every backend."""

from __future__ import annotations

import math
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import current_job
from flask_sqlqueue.exceptions import NoJobContext
from tests import control_app as c
from tests.waiting import wait_for


def test_the_last_value_lands_despite_the_throttle(control_app: Flask) -> None:
    app = control_app
    steps = [[i / 500, f"step {i}"] for i in range(501)]
    with app.app_context():
        job = c.progress.enqueue(steps)
    with c.statements(app) as seen:
        c.burst(app)
    row = c.row(app, job.id)
    assert row.status == JobStatus.COMPLETED
    assert (row.progress, row.progress_message) == (1.0, "step 500")
    writes = [s for s in seen if s.lstrip().upper().startswith("UPDATE") and "progress" in s]
    # 501 reports in a tight loop: the first is written, the rest are coalesced into
    # the one written when the task returns (a slow machine may add one per second).
    assert 2 <= len(writes) <= 5, len(writes)


def test_a_waiting_task_shows_its_latest_value(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.progress.enqueue([[0.1, "first"], [0.3, "second"]], wait=True)
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        # The second value came within the throttle; it is written when the second ends,
        # while the task is still running.
        wait_for(lambda: c.row(app, job.id).progress == 0.3)
        assert c.row(app, job.id).status == "running"
        assert c.row(app, job.id).progress_message == "second"
        shown = app.test_cli_runner().invoke(args=["queue", "show", str(job.id)]).output
        assert "progress         [######--------------]  30%  second\n" in shown
        c.go.set()
        wait_for(lambda: c.row(app, job.id).status == "completed")


@pytest.mark.parametrize(
    ("fraction", "message", "error"),
    [
        (1.5, None, "ValueError: progress must be a fraction from 0 to 1, got 1.5."),
        (-0.01, None, "ValueError: progress must be a fraction from 0 to 1, got -0.01."),
        (math.nan, None, "ValueError: progress must be a fraction from 0 to 1, got nan."),
        ("0.5", None, "TypeError: progress must be a number from 0 to 1, got '0.5'."),
        (True, None, "TypeError: progress must be a number from 0 to 1, got True."),
        (None, None, "TypeError: progress must be a number from 0 to 1, got None."),
        (0.5, 7, "TypeError: progress message must be a string or None, got 7."),
    ],
)
def test_bad_values_are_refused_and_change_nothing(
    control_app: Flask,
    fraction: object,
    message: object,
    error: str,
) -> None:
    app = control_app
    with app.app_context():
        # NaN cannot be a job argument (not JSON): the task gets it by name.
        job = c.bad_progress.enqueue("nan" if fraction is math.nan else fraction, message)
    if fraction is math.nan:
        c.update(app, job.id, payload='{"args": [NaN, null], "kwargs": {}}')
    c.burst(app)
    row = c.row(app, job.id)
    assert row.status == JobStatus.COMPLETED
    assert row.result == f'"{error}"'
    assert row.progress is None and row.progress_message is None


def test_bounds_and_long_messages_are_accepted(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        zero = c.bad_progress.enqueue(0, "start")
        whole = c.bad_progress.enqueue(1, "x" * 5000)
    c.burst(app)
    assert c.row(app, zero.id).progress == 0.0
    assert c.row(app, whole.id).progress == 1.0
    assert c.row(app, whole.id).progress_message == "x" * 1000


def test_a_lost_claim_writes_no_progress(control_app: Flask) -> None:
    from flask_sqlqueue import ClaimLost
    from tests.test_cancel import lifecycle_context

    app = control_app
    with app.app_context():
        job = c.waits.enqueue()
    worker = c.queue.worker(app=app)
    (claimed,) = worker._claim(1)
    ctx = lifecycle_context(worker, claimed)
    ctx.set_progress(0.2, "mine")
    assert c.row(app, job.id).progress == 0.2
    c.update(app, job.id, claim_token="someone-else")  # rescued and claimed again
    ctx._live.progress_written_at = -1e9  # as if the throttle's second went by
    with pytest.raises(ClaimLost):
        ctx.set_progress(0.9, "stale")
    assert (c.row(app, job.id).progress, c.row(app, job.id).progress_message) == (0.2, "mine")


def test_admin_shows_a_progress_bar(control_app: Flask) -> None:
    app = control_app
    app.secret_key = "test"
    app.register_blueprint(c.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    client = app.test_client()
    with app.app_context():
        job = c.progress.enqueue([[0.42, "<b>page 42</b>"]], wait=True)
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        wait_for(lambda: c.row(app, job.id).progress == 0.42)
        page = client.get(f"/q/jobs/{job.id}").get_data(as_text=True)
        listing = client.get("/q/jobs").get_data(as_text=True)
        for body in (page, listing):
            assert f'<progress max="1" value="0.42" aria-label="Job {job.id} progress">' in body
            assert "&lt;b&gt;page 42&lt;/b&gt;" in body and "<b>page 42" not in body
            assert "style=" not in body  # the CSP forbids inline styles
        c.go.set()


def test_outside_a_task_there_is_no_progress() -> None:
    with pytest.raises(NoJobContext):
        current_job.set_progress(0.5)


@pytest.mark.parametrize(
    ("end", "status", "kept"),
    [
        ("retry", JobStatus.PENDING, (None, None)),
        ("snooze", JobStatus.PENDING, (None, None)),
        ("dead", JobStatus.DEAD, (1.0, "all rows read")),
    ],
)
def test_an_attempt_that_does_not_complete_leaves_no_progress_for_the_next(
    control_app: Flask,
    end: str,
    status: JobStatus,
    kept: tuple[Any, Any],
) -> None:
    app = control_app
    with app.app_context():
        job = c.progress_then.enqueue(end)
    c.burst(app)
    row = c.row(app, job.id)
    assert row.status == status
    # Waiting for another attempt: no 100% from the last one. Ended: how far it got.
    assert (row.progress, row.progress_message) == kept
    with app.app_context():
        assert job.refresh().progress == kept[0]

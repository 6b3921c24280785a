"""The retry preview: when a job's remaining attempts run if each fails, and then what.

``retry_plan`` is checked on its own, then against what a real worker does after a
failure, and as ``flask queue show`` and the admin's job page show it.
"""

from __future__ import annotations

import re
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue.core.failures import Backoff
from flask_sqlqueue.core.jobs import Job
from flask_sqlqueue.core.models import JobStatus
from flask_sqlqueue.core.retry_preview import PlannedAttempt
from flask_sqlqueue.core.retry_preview import retry_plan
from tests import sample_app

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
BACKOFF = Backoff(base=2.0, cap=10.0, jitter=1.0)


def _job(status: JobStatus, attempts: int, max_attempts: int = 4) -> Job:
    return Job(
        id=7,
        queue="default",
        task="t",
        args=[],
        kwargs={},
        status=status,
        attempts=attempts,
        max_attempts=max_attempts,
        priority=0,
        run_at=NOW + timedelta(seconds=30),
        created_at=NOW,
        updated_at=NOW,
    )


def test_a_pending_retry_is_due_at_its_run_at_and_the_rest_follow_the_backoff() -> None:
    assert retry_plan(_job(JobStatus.PENDING, 1), BACKOFF, None) == [
        PlannedAttempt(2, due=NOW + timedelta(seconds=30)),
        PlannedAttempt(3, wait=(8.0, 9.0)),  # after attempt 2: 2 * 2**2, up to 1 s of jitter
        PlannedAttempt(4, wait=(10.0, 11.0)),  # 2 * 2**3 capped at 10
    ]


def test_a_running_job_plans_from_the_failure_of_its_running_attempt() -> None:
    assert retry_plan(_job(JobStatus.RUNNING, 3, max_attempts=6), BACKOFF, None) == [
        PlannedAttempt(4, wait=(10.0, 11.0)),  # 2 * 2**3 capped at 10
        PlannedAttempt(5, wait=(10.0, 11.0)),
        PlannedAttempt(6, wait=(10.0, 11.0)),
    ]
    assert retry_plan(_job(JobStatus.RUNNING, 4), BACKOFF, None) == []  # its last attempt


@pytest.mark.parametrize("status", [JobStatus.COMPLETED, JobStatus.DEAD, JobStatus.CANCELLED])
def test_an_ended_job_has_no_attempts_to_come(status: JobStatus) -> None:
    assert retry_plan(_job(status, 1), BACKOFF, None) == []


def test_a_tasks_own_backoff_is_exact_and_falls_back_where_the_worker_does() -> None:
    def own(attempt: int) -> Any:
        return {2: timedelta(minutes=1), 3: -1.0}.get(attempt, 60.0 * attempt)

    planned = retry_plan(_job(JobStatus.RUNNING, 1, max_attempts=5), BACKOFF, own)
    assert [step.wait for step in planned] == [
        (60.0, 60.0),  # after attempt 1
        (60.0, 60.0),  # a timedelta
        (10.0, 11.0),  # -1 is no delay: the queue's backoff, as the worker uses then
        (240.0, 240.0),
    ]

    def broken(attempt: int) -> float:
        raise ZeroDivisionError

    assert retry_plan(_job(JobStatus.RUNNING, 1, 2), BACKOFF, broken) == [
        PlannedAttempt(2, wait=(4.0, 5.0))  # after attempt 1: 2 * 2**1
    ]


def _failed_once(make_app: Any) -> tuple[Flask, int]:
    """An app whose queue backs off 20 s (+ up to 10 s), and a job whose first attempt
    a real worker ran and failed."""
    app = make_app({"SQLQUEUE_BACKOFF_BASE": 10, "SQLQUEUE_BACKOFF_JITTER": 10})
    with app.app_context():
        job = sample_app.always_fails.using(max_attempts=3).enqueue("down")
    sample_app.queue.worker(app=app).run(burst=True)
    return app, job.id


def test_the_workers_delay_is_within_what_the_preview_said(make_app: Any) -> None:
    app, job_id = _failed_once(make_app)
    with app.app_context():
        job = sample_app.queue.get_job(job_id)
        assert job is not None and job.status == JobStatus.PENDING and job.attempts == 1
        store = app.extensions["sqlqueue"].store
        before = retry_plan(job, store.backoff, None)
    # The plan of the same job one attempt earlier (running attempt 1) gave its wait.
    failed_at = datetime.fromisoformat(job.errors[-1]["at"])
    running = _job(JobStatus.RUNNING, 1, max_attempts=3)
    (least, most) = retry_plan(running, store.backoff, None)[0].wait or (0, 0)
    assert (least, most) == (20.0, 30.0)
    assert least <= (job.run_at - failed_at).total_seconds() <= most
    assert before == [PlannedAttempt(2, due=job.run_at), PlannedAttempt(3, wait=(40.0, 50.0))]


def test_flask_queue_show_previews_the_retries(make_app: Any) -> None:
    app, job_id = _failed_once(make_app)
    result = app.test_cli_runner().invoke(args=["queue", "show", str(job_id)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index(
        "next attempts (each if the one before fails; a task's Retry(delay) differs):"
    )
    assert re.fullmatch(r"  attempt 2 of 3  due \S+ \S+ \(in \d+s\)", lines[start + 1])
    assert lines[start + 2 : start + 4] == [
        "  attempt 3 of 3  40s-50s after attempt 2 fails",
        f"  after attempt 3 fails: dead (replay with `flask queue retry {job_id}`)",
    ]


def test_the_admin_job_page_previews_the_retries(make_app: Any) -> None:
    app, job_id = _failed_once(make_app)
    app.secret_key = "test secret"
    app.register_blueprint(sample_app.queue.admin_blueprint(authorize=lambda: True))
    page = app.test_client().get(f"/jobs/{job_id}").get_data(as_text=True)
    section = page[page.index('id="sqlqueue-next-attempts"') :]
    section = section[: section.index("</section>")]
    cells = [
        " ".join(re.sub(r"<[^>]+>", " ", c).split())
        for c in re.findall(r"<td>(.*?)</td>", section, re.S)
    ]
    assert cells[0] == "2 of 3" and cells[1].startswith("due ")
    assert cells[2:] == [
        "3 of 3",
        "40 s to 50 s after attempt 2 fails",
        "then",
        "dead if attempt 3 fails too: a dead job can be retried from here",
    ]
    completed = sample_app.queue.worker(app=app)
    with app.app_context():
        done = sample_app.add.enqueue(1, 2)
    completed.run(burst=True)
    assert "sqlqueue-next-attempts" not in app.test_client().get(f"/jobs/{done.id}").get_data(
        as_text=True
    )

"""Snooze and expiry, on every backend, with real workers (docs/expiry.md).

``raise Snooze(delay)`` runs a job again later without spending an attempt or growing
the backoff; ``using(expires=...)`` ends a job that has not started by then,
``cancelled``, without running it. The tasks are in ``tests/expiry_app.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import Snooze
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import operations
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.processes import AppLoader
from tests import expiry_app as tasks
from tests.stores import burst
from tests.stores import store_of
from tests.waiting import WAIT
from tests.waiting import wait_for
from tests.workers import run_burst
from tests.workers import running

APP = "tests.expiry_app:create_app"


@pytest.fixture
def eapp(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The expiry app on the test's database (the schema put there by ``make_app``)."""
    make_app()
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def runs(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def pass_expiry(app: Flask, expires_at: datetime | None) -> None:
    """Wait until the queue's clock is past ``expires_at``."""
    assert expires_at is not None
    wait_for(lambda: store_of(app).now() > expires_at, "the job's expiry to pass")


def job_count(app: Flask) -> int:
    with store_of(app).read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


# -- snooze ----------------------------------------------------------------------------------


def test_a_snoozed_job_runs_again_without_spending_an_attempt(eapp: Flask, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        # max_attempts=1: any attempt a snooze spent would leave none to complete with.
        job = tasks.scripted.using(max_attempts=1).enqueue(
            str(path), ["snooze", "snooze", "snooze", "ok"]
        )
    burst(eapp)
    job.refresh()
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert (job.attempts, job.snoozes) == (1, 3)
    assert job.result == {"attempts": 1, "snoozes": 3}
    assert (job.last_error, job.errors) == (None, [])
    assert runs(path) == [
        "snooze attempts=1 snoozes=0",
        "snooze attempts=1 snoozes=1",
        "snooze attempts=1 snoozes=2",
        "ok attempts=1 snoozes=3",
    ]


def test_a_snooze_leaves_the_backoff_and_the_last_error_alone(eapp: Flask, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        job = tasks.scripted.enqueue(str(path), ["retry", "snooze", "snooze", "fail"])
    burst(eapp)  # retry and the snoozes are due at once; the failure waits its backoff
    job.refresh()
    assert job.status is JobStatus.PENDING
    assert (job.attempts, job.snoozes) == (2, 2)
    assert [e["attempt"] for e in job.errors] == [1, 2]  # the snoozes are no failures
    assert job.last_error == "ValueError: it broke"
    # The task's backoff waits 1000 s per attempt: the failure was attempt 2, not 4.
    wait = (job.run_at - job.updated_at).total_seconds()
    assert 1990 <= wait <= 2010, wait
    assert runs(path)[1:3] == ["snooze attempts=2 snoozes=0", "snooze attempts=2 snoozes=1"]


def test_a_snooze_keeps_the_last_error_of_the_attempt_before(eapp: Flask, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        job = tasks.scripted.enqueue(str(path), ["retry", "snooze-hour"])
    burst(eapp)  # the retry is due at once; the snooze is for an hour
    job.refresh()
    assert job.status is JobStatus.PENDING
    assert (job.attempts, job.snoozes) == (1, 1)
    assert job.last_error == "flask_sqlqueue.exceptions.Retry: not ready"
    assert len(job.errors) == 1
    assert job.run_at > store_of(eapp).now() + timedelta(minutes=50)


def test_an_async_task_snoozes(eapp: Flask, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        job = tasks.async_scripted.enqueue(str(path), ["snooze", "snooze", "ok"])
    burst(eapp)
    job.refresh()
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert (job.attempts, job.snoozes, job.result) == (1, 2, {"attempts": 1, "snoozes": 2})


@pytest.mark.slow
def test_a_process_worker_snoozes_jobs_in_its_children(
    eapp: Flask, database_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    path, async_path = tmp_path / "runs", tmp_path / "async-runs"
    with eapp.app_context():
        job = tasks.scripted.using(max_attempts=1).enqueue(str(path), ["snooze", "ok"])
        async_job = tasks.async_scripted.enqueue(str(async_path), ["snooze", "snooze", "ok"])
        expired = tasks.leave_mark.using(expires=0.2).enqueue(str(tmp_path / "mark"))
    pass_expiry(eapp, expired.expires_at)
    worker = tasks.queue.worker(WorkerOptions(processes=1, grace=1.0), eapp, loader=AppLoader(APP))
    run_burst(worker, timeout=180)
    assert expired.refresh().status is JobStatus.CANCELLED
    assert not (tmp_path / "mark").exists()
    for found, snoozes in ((job, 1), (async_job, 2)):
        found.refresh()
        assert found.status is JobStatus.COMPLETED, found.last_error
        assert (found.attempts, found.snoozes) == (1, snoozes)
        assert found.result == {"attempts": 1, "snoozes": snoozes}


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, 10**400, timedelta(days=10**7)])
def test_a_snooze_the_queue_cannot_store_is_refused_where_it_is_raised(delay: Any) -> None:
    with pytest.raises(ValueError, match="Snooze delay"):
        Snooze(delay)


def test_snooze_takes_seconds_or_a_timedelta() -> None:
    assert Snooze(timedelta(minutes=2)).delay == 120.0
    assert str(Snooze(5)) == "snoozed for 5s"
    assert str(Snooze(5, "rate limited")) == "rate limited"


def test_a_snooze_of_a_job_whose_cancellation_was_asked_for_cancels_it(
    eapp: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        job = tasks.scripted.enqueue(str(path), ["snooze"])
    store = store_of(eapp)
    original = tasks._next_step

    def asked_then_step(p: str, steps: list[str]) -> str:
        # Asked for while the job runs, between its claim and its snooze.
        operations.cancel(store, [job.id])
        return original(p, steps)

    monkeypatch.setattr(tasks, "_next_step", asked_then_step)
    assert tasks.queue.worker(WorkerOptions(grace=1.0), eapp).run_once()
    job.refresh()
    assert job.status is JobStatus.CANCELLED
    assert (job.attempts, job.snoozes) == (0, 1)
    assert job.finished_at is not None


# -- expiry ----------------------------------------------------------------------------------


def test_an_expired_job_never_runs_and_ends_cancelled(eapp: Flask, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    with eapp.app_context():
        job = tasks.leave_mark.using(expires=0.2).enqueue(str(mark))
        dependent = tasks.leave_mark.using(depends_on=[job]).enqueue(str(tmp_path / "dep"))
        fresh = tasks.leave_mark.using(expires=timedelta(hours=1)).enqueue(str(tmp_path / "f"))
    assert job.expires_at is not None
    assert job.expires_at - job.created_at == timedelta(seconds=0.2)
    pass_expiry(eapp, job.expires_at)
    burst(eapp)

    assert not mark.exists()  # the function never ran
    assert job.wait(timeout=WAIT) is job  # its waiters are told
    assert job.status is JobStatus.CANCELLED
    expected = (
        f"Expired: expired at {job.expires_at.isoformat(timespec='seconds')} before it started"
    )
    assert job.last_error == expected
    assert (job.attempts, job.started_at, job.errors) == (0, None, [])
    assert job.finished_at is not None
    dependent.refresh()
    assert dependent.status is JobStatus.CANCELLED
    assert dependent.last_error == f"DependencyFailed: dependency {job.id} was cancelled"
    assert not (tmp_path / "dep").exists()
    fresh.refresh()  # not expired yet: it ran
    assert (fresh.status, fresh.attempts) == (JobStatus.COMPLETED, 1)


def test_the_callbacks_of_a_batch_with_an_expired_member_run_as_for_a_cancelled_one(
    eapp: Flask, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()

    def mark(name: str) -> str:
        return str(marks / name)

    with eapp.app_context():
        made = tasks.queue.batch(
            [
                tasks.leave_mark.using(expires=0.2).step(mark("expired")),
                tasks.leave_mark.step(mark("member")),
            ],
            on_success=tasks.leave_mark.step(mark("success")),
            on_failure=tasks.leave_mark.step(mark("failure")),
            on_complete=tasks.leave_mark.step(mark("complete")),
        )
        expired = made.jobs[0]
    pass_expiry(eapp, expired.expires_at)
    burst(eapp)
    assert expired.refresh().status is JobStatus.CANCELLED
    ran = sorted(p.name for p in marks.iterdir())
    assert ran == ["complete", "failure", "member"]  # on_success is cancelled


def test_a_retry_due_after_the_expiry_is_not_run(eapp: Flask, tmp_path: Path) -> None:
    path = tmp_path / "runs"
    with eapp.app_context():
        job = tasks.scripted.using(expires=3600).enqueue(str(path), ["retry", "ok"])
        assert tasks.queue.worker(WorkerOptions(), eapp).run_once()
    assert job.refresh().status is JobStatus.PENDING
    past = store_of(eapp).now() - timedelta(seconds=1)
    store_of(eapp).run_write(
        lambda conn: conn.execute(
            sa.update(jobs).where(jobs.c.id == job.id).values(expires_at=past)
        )
    )
    burst(eapp)
    job.refresh()
    assert job.status is JobStatus.CANCELLED
    assert job.last_error == (
        f"Expired: expired at {past.isoformat(timespec='seconds')} before attempt 2 started"
    )
    assert job.attempts == 1  # the first attempt ran; the second never started
    assert job.started_at is not None  # it did start once
    assert [line.split()[0] for line in runs(path)] == ["retry"]


def test_a_job_started_before_its_expiry_is_not_interrupted(eapp: Flask, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    with eapp.app_context():
        job = tasks.outlive_expiry.using(expires=1).enqueue(str(mark))
    burst(eapp)
    job.refresh()
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert job.result == "finished after its expiry"
    assert job.finished_at is not None and job.expires_at is not None
    assert job.finished_at > job.expires_at


def test_a_worker_ends_expired_jobs_that_no_worker_serves(eapp: Flask, tmp_path: Path) -> None:
    with eapp.app_context():
        lost = tasks.unserved_mark.using(expires=0.2).enqueue(str(tmp_path / "lost"))
        later = tasks.unserved_mark.using(expires=3600).enqueue(str(tmp_path / "later"))
        forever = tasks.unserved_mark.enqueue(str(tmp_path / "forever"))
    pass_expiry(eapp, lost.expires_at)
    # A worker of the default queue only: nobody serves "nobody"; its upkeep (on its
    # first heartbeat) ends the expired job there all the same.
    options = WorkerOptions(queues=("default",), stale_after=2.0, grace=1.0)
    with running(tasks.queue.worker(options, eapp)):
        assert lost.wait(timeout=WAIT).status is JobStatus.CANCELLED
    assert lost.last_error is not None and lost.last_error.startswith("Expired: expired at ")
    assert (later.refresh().status, forever.refresh().status) == (JobStatus.PENDING,) * 2
    assert not (tmp_path / "lost").exists()


def test_a_replayed_expired_job_runs(eapp: Flask, tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    with eapp.app_context():
        job = tasks.leave_mark.using(expires=0.2).enqueue(str(mark))
        pass_expiry(eapp, job.expires_at)
        burst(eapp)
        assert job.refresh().status is JobStatus.CANCELLED
        operations.retry(store_of(eapp), [job.id])
    burst(eapp)
    job.refresh()
    assert (job.status, job.expires_at) == (JobStatus.COMPLETED, None)
    assert mark.read_text() == "ran"


def test_expiry_is_a_task_default_and_an_option_of_enqueue_by_name(eapp: Flask) -> None:
    with eapp.app_context():
        hour = tasks.expires_in_an_hour.enqueue()
        assert hour.expires_at is not None
        assert hour.expires_at - hour.created_at == timedelta(hours=1)
        own = tasks.expires_in_an_hour.using(expires=60).enqueue()
        assert own.expires_at is not None
        assert own.expires_at - own.created_at == timedelta(minutes=1)
        at = datetime.now(UTC) + timedelta(days=1)
        by_name = tasks.queue.enqueue(tasks.leave_mark.name, args=["x"], expires=at)
        assert by_name.expires_at == at
        many = tasks.queue.enqueue_many(tasks.leave_mark.name, [(["a"], {})], expires=at)
        assert many[0].refresh().expires_at == at
        plain = tasks.leave_mark.enqueue("p")
        assert plain.refresh().expires_at is None


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"expires": datetime(2030, 1, 1)}, ValueError, "has no timezone"),
        ({"expires": -1}, ValueError, "must be zero or more seconds"),
        ({"expires": math.nan}, ValueError, "must be zero or more seconds"),
        ({"expires": math.inf}, ValueError, "latest time the queue stores"),
        ({"expires": 0}, ValueError, "could never start"),
        ({"expires": 30, "delay": 60}, ValueError, "could never start"),
        ({"expires": datetime(2000, 1, 1, tzinfo=UTC)}, ValueError, "could never start"),
        ({"expires": "1h"}, TypeError, "must be seconds after the enqueue"),
        ({"expires": True}, TypeError, "must be seconds after the enqueue"),
    ],
)
def test_bad_expiry_is_refused_and_nothing_is_written(
    eapp: Flask, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with eapp.app_context():
        before = job_count(eapp)
        with pytest.raises(error, match=message):
            tasks.leave_mark.using(**options).enqueue("x")
        with pytest.raises(error, match=message):
            tasks.queue.enqueue(tasks.leave_mark.name, args=["x"], **options)
        assert job_count(eapp) == before


def test_a_task_default_expiry_is_checked_when_the_task_is_declared() -> None:
    queue = SQLQueue()
    with pytest.raises(ValueError, match="must be zero or more seconds"):
        queue.task(expires=-5)
    with pytest.raises(TypeError, match="span after each enqueue"):
        queue.task(expires=datetime.now(UTC))


# -- where it shows --------------------------------------------------------------------------


def test_show_and_the_admin_job_page_show_the_expiry_and_the_snoozes(
    eapp: Flask, tmp_path: Path
) -> None:
    at = datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC)
    with eapp.app_context():
        job = tasks.scripted.using(expires=at).enqueue(str(tmp_path / "runs"), ["snooze-hour"])
        plain = tasks.leave_mark.using(delay=3600).enqueue("x")
    burst(eapp)
    assert job.refresh().snoozes == 1

    shown = eapp.test_cli_runner().invoke(args=["queue", "show", str(job.id)])
    assert shown.exit_code == 0, shown.output
    assert "expires          2100-01-02 03:04:05" in shown.output
    assert "snoozes          1" in shown.output
    other = eapp.test_cli_runner().invoke(args=["queue", "show", str(plain.id)])
    assert "expires          -" in other.output and "snoozes          0" in other.output

    eapp.secret_key = "test"
    eapp.register_blueprint(
        tasks.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    client = eapp.test_client()
    page = client.get(f"/queue/jobs/{job.id}").get_data(as_text=True)
    assert 'id="sqlqueue-expires"' in page and "2100-01-02" in page
    assert 'id="sqlqueue-snoozes">1 ' in page
    page = client.get(f"/queue/jobs/{plain.id}").get_data(as_text=True)
    assert 'id="sqlqueue-expires"' not in page and 'id="sqlqueue-snoozes"' not in page

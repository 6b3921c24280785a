"""Claiming ahead (core/worker/dispatch.py): short jobs are claimed beyond the free
threads and recorded many to a commit; a buffer never waits behind long jobs, and a
stop hands it back without counting an attempt."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.core.models import workers
from flask_sqlqueue.core.worker import dispatch
from tests import sample_app
from tests.waiting import wait_for
from tests.workers import running


@pytest.fixture(autouse=True)
def ahead_whatever_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide window: on a loaded machine even a no-op job can take more than the 20 ms
    that turn claiming ahead off, and these tests are about what happens when it is on."""
    monkeypatch.setattr(dispatch, "AHEAD_WINDOW", 60.0)


def started(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[1] for line in lines if line.startswith("start ")]


def test_short_jobs_are_claimed_ahead_and_recorded_many_to_a_commit(ctx: Flask) -> None:
    """One thread, 300 no-op jobs: one commit per job without claiming ahead. A batch
    of successes shares one ``finished_at``, so the distinct ones count the commits."""
    made = sample_app.add.enqueue_many([([i, 1], {}) for i in range(300)])
    sample_app.queue.worker(WorkerOptions(concurrency=1), ctx).run(burst=True)
    refreshed = [job.refresh() for job in made]
    assert [job.result for job in refreshed] == [i + 1 for i in range(300)]
    assert all(job.attempts == 1 for job in refreshed)
    commits = len({job.finished_at for job in refreshed})
    assert commits < 60, commits


def test_claimed_ahead_jobs_start_in_the_contracts_order(ctx: Flask, tmp_path: Path) -> None:
    """Jobs claimed in one batch start one after another, in priority, run_at, id order."""
    log = tmp_path / "order.log"
    warm = [sample_app.record.using(priority=9).enqueue(str(log), f"w{i}") for i in range(3)]
    later = sample_app.record.using(run_at=utcnow() - timedelta(minutes=1))  # before the others
    tags = ["a", "b", "c", "d"]
    for tag in tags:
        sample_app.record.enqueue(str(log), tag)
    later.enqueue(str(log), "early")
    sample_app.record.using(priority=5).enqueue(str(log), "urgent")
    sample_app.queue.worker(WorkerOptions(concurrency=1), ctx).run(burst=True)
    assert all(job.refresh().status is JobStatus.COMPLETED for job in warm)
    assert started(log)[3:] == ["urgent", "early", *tags]


def _buffer_behind_a_long_job(log: Path, *, quick: int) -> tuple[Any, list[Any]]:
    """Warm-up jobs that make the worker claim ahead, then a long job, then quick ones
    that its claim takes into the buffer behind it."""
    for i in range(3):
        sample_app.record.using(priority=9).enqueue(str(log), f"warm{i}")
    long = sample_app.record.using(priority=5).enqueue(str(log), "long", 3.0)
    quick_jobs = [sample_app.record.enqueue(str(log), f"q{i}") for i in range(quick)]
    return long, quick_jobs


def test_a_buffer_behind_long_jobs_goes_to_an_idle_worker(ctx: Flask, tmp_path: Path) -> None:
    """Worker A claims the quick jobs ahead, behind its long one; they go back to
    pending, uncounted, and idle worker B runs them while A's long job still runs."""
    log = tmp_path / "jobs.log"
    long, quick = _buffer_behind_a_long_job(log, quick=5)
    a = sample_app.queue.worker(WorkerOptions(concurrency=1, poll_interval=0.05), ctx)
    with running(a):
        wait_for(lambda: "long" in started(log), "the long job to start")
        b = sample_app.queue.worker(WorkerOptions(concurrency=1, poll_interval=0.05), ctx)
        with running(b):
            wait_for(
                lambda: all(job.refresh().status is JobStatus.COMPLETED for job in quick),
                "the quick jobs to complete",
            )
            assert long.refresh().status is JobStatus.RUNNING, "they waited for the long job"
    finished = [job.refresh() for job in quick]
    assert {job.worker_id for job in finished} == {b.id}
    assert all(job.attempts == 1 for job in finished)
    assert long.refresh().status is JobStatus.COMPLETED


def test_a_stop_hands_back_the_buffer_without_counting_an_attempt(
    ctx: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "jobs.log"
    monkeypatch.setattr(dispatch, "STALL_AFTER", 3600.0)  # the buffer stays behind the long job
    long, quick = _buffer_behind_a_long_job(log, quick=5)
    worker = sample_app.queue.worker(WorkerOptions(concurrency=1), ctx)
    with running(worker):
        wait_for(lambda: "long" in started(log), "the long job to start")
        # Claimed, not started: running in the database until handed back.
        assert all(job.refresh().status is JobStatus.RUNNING for job in quick)
    assert long.refresh().status is JobStatus.COMPLETED  # within the grace period
    for job in quick:
        job.refresh()
        assert (job.status, job.attempts, job.releases) == (JobStatus.PENDING, 0, 1)
    assert not any(tag.startswith("q") for tag in started(log))


def test_long_jobs_are_shared_by_the_workers(ctx: Flask, tmp_path: Path) -> None:
    """Long jobs only: two workers of one thread each share them, neither hoards."""
    log = tmp_path / "jobs.log"
    jobs = [sample_app.record.enqueue(str(log), f"j{i}", 0.3) for i in range(4)]
    options = WorkerOptions(concurrency=1, poll_interval=0.05)
    a = sample_app.queue.worker(options, ctx)
    b = sample_app.queue.worker(WorkerOptions(concurrency=1, claim_ahead=0), ctx)
    with running(a), running(b):
        wait_for(lambda: all(job.refresh().status is JobStatus.COMPLETED for job in jobs))
    by = [job.refresh().worker_id for job in jobs]
    assert by.count(a.id) >= 1 and by.count(b.id) >= 1, by


def test_claim_ahead_must_be_zero_or_more() -> None:
    from flask_sqlqueue import ConfigurationError

    with pytest.raises(ConfigurationError, match="claim_ahead"):
        WorkerOptions(claim_ahead=-1)


def test_jobs_claimed_ahead_show_as_such_in_status_and_the_admin(
    make_app: Callable[..., Flask], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's heartbeat records the jobs it claimed ahead and has not started;
    ``flask queue status`` counts them and the admin marks them among the running."""
    monkeypatch.setattr(dispatch, "STALL_AFTER", 3600.0)  # the buffer stays behind the long job
    app = make_app()
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    log = tmp_path / "jobs.log"
    with app.app_context():
        long, quick = _buffer_behind_a_long_job(log, quick=3)
        # A heartbeat every 0.25 s (a quarter of stale_after).
        worker = sample_app.queue.worker(WorkerOptions(concurrency=1, stale_after=1.0), app)
        with running(worker):
            wait_for(lambda: "long" in started(log), "the long job to start")
            ids = {job.id for job in quick}

            def recorded() -> set[int]:
                with sample_app.queue.state().store.read() as conn:
                    row = conn.execute(
                        sa.select(workers.c.claimed_ahead).where(workers.c.id == worker.id)
                    ).one()
                return set(json.loads(row.claimed_ahead or "[]"))

            wait_for(lambda: recorded() == ids, "a heartbeat that records the buffer")
            status = app.test_cli_runner().invoke(args=["queue", "status"])
            assert "running: 3 of them claimed ahead" in status.output, status.output
            page = app.test_client().get("/q/workers").get_data(as_text=True)
            assert page.count("(claimed ahead, not started)") == 3, page
            assert f"#{long.id} " in page

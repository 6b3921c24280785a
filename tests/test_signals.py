"""Signals, Prometheus metrics and the log context, on every backend."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from flask import current_app
from sqlalchemy.orm import Session

from flask_sqlqueue import JobStatus
from flask_sqlqueue import signals
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import queries
from flask_sqlqueue.core.logcontext import LOG_DEFAULTS
from flask_sqlqueue.metrics import QueueMetrics
from tests import control_app as c
from tests.conftest import ROOT
from tests.waiting import wait_for


class Recorder:
    """Connects to every signal from one sender and keeps what each sent."""

    def __init__(self, sender: Any) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.sender = sender
        for signal in signals.ALL:
            signal.connect(self.receive(signal.name), sender=sender, weak=False)

    def receive(self, name: str) -> Any:
        def receiver(sender: Any, **data: Any) -> None:
            assert sender is self.sender
            # Receivers run in an app context: they may use the app.
            data["app_name"] = current_app.name if name != "sqlqueue.job-enqueued" else None
            self.events.append((name.removeprefix("sqlqueue.job-"), data))

        receiver.__name__ = f"record_{name}"
        return receiver

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def close(self) -> None:
        for signal in signals.ALL:
            for receiver in list(signal.receivers_for(self.sender)):
                if getattr(receiver, "__name__", "").startswith("record_"):
                    signal.disconnect(receiver, sender=self.sender)


@pytest.fixture
def recorder(control_app: Flask) -> Iterator[Recorder]:
    found = Recorder(control_app)
    yield found
    found.close()


def test_a_success(control_app: Flask, recorder: Recorder) -> None:
    with control_app.app_context():
        job = c.add.enqueue(2, 3)
    c.burst(control_app)
    assert recorder.names() == ["enqueued", "started", "succeeded"]
    enqueued, started, succeeded = (data for _, data in recorder.events)
    assert enqueued["job"].id == job.id and enqueued["job"].status is JobStatus.PENDING
    assert (started["job"].id, started["job"].task, started["job"].attempts) == (
        job.id,
        "control.add",
        1,
    )
    assert started["app_name"] == succeeded["app_name"] == control_app.name
    assert succeeded["result"] == 5 and succeeded["duration"] >= 0


def test_failures_retries_and_dead(control_app: Flask, recorder: Recorder) -> None:
    with control_app.app_context():
        job = c.fails.enqueue("nope")  # max_attempts=2, no backoff
    c.burst(control_app)
    assert job.refresh().status is JobStatus.DEAD
    names = recorder.names()
    assert names == ["enqueued", "started", "failed", "retried", "started", "failed", "dead"]
    events = dict(recorder.events[2:4])
    assert isinstance(events["failed"]["error"], RuntimeError)
    assert str(events["failed"]["error"]) == "nope"
    assert events["retried"]["retry_at"] is not None
    dead = recorder.events[-1][1]
    assert dead["job"].attempts == 2 and str(dead["error"]) == "nope"


def test_a_failure_after_a_cancel_request_is_cancelled_not_retried(
    control_app: Flask,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = control_app
    with app.app_context():
        job = c.waits_then_fails.enqueue()
    with caplog.at_level(logging.INFO, logger="flask_sqlqueue"), c.running_worker(app):
        assert c.started.wait(c.WAIT)
        store = c.store_of(app)
        store.run_write(lambda conn: actions.cancel_jobs(conn, [job.id], store.now()))
        c.go.set()
        wait_for(lambda: "cancelled" in recorder.names())
    assert job.refresh().status is JobStatus.CANCELLED
    assert recorder.names() == ["enqueued", "started", "failed", "cancelled"]
    logged = [r.getMessage() for r in caplog.records if f"job={job.id}" in r.getMessage()]
    assert not [line for line in logged if "retry in" in line], logged
    assert any("job is cancelled" in line for line in logged), logged


def test_cancelled_and_rescued(control_app: Flask, recorder: Recorder) -> None:
    app = control_app
    with app.app_context():
        cancelled = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(c.WAIT)
        store = c.store_of(app)
        store.run_write(lambda conn: actions.cancel_jobs(conn, [cancelled.id], store.now()))
        wait_for(lambda: "cancelled" in recorder.names())
    assert recorder.names()[-1] == "cancelled"

    with app.app_context():
        lost = c.add.enqueue(1, 1)
    long_ago = store.now() - timedelta(hours=1)
    c.update(app, lost.id, status="running", attempts=1, worker_id="gone:1:x", started_at=long_ago)
    rescued = c.queue.worker(app=app).rescue()
    assert [job_id for job_id, _, _ in rescued] == [lost.id]
    name, data = recorder.events[-1]
    assert name == "rescued"
    assert (data["job"].id, data["job"].status, data["lost_worker"]) == (
        lost.id,
        JobStatus.PENDING,
        "gone:1:x",
    )


def test_a_raising_receiver_breaks_nothing(
    control_app: Flask,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def explode(sender: Any, **data: Any) -> None:
        raise RuntimeError("receiver bug")

    hooked = (signals.job_enqueued, signals.job_started, signals.job_succeeded, signals.job_failed)
    for signal in hooked:
        signal.connect(explode, sender=control_app)
    try:
        with caplog.at_level(logging.ERROR, logger="flask_sqlqueue.signals"):
            with control_app.app_context():
                ok = c.add.enqueue(1, 2)
                bad = c.fails.enqueue()
            c.burst(control_app)
    finally:
        for signal in hooked:
            signal.disconnect(explode, sender=control_app)
    assert ok.refresh().status is JobStatus.COMPLETED and ok.result == 3
    assert bad.refresh().status is JobStatus.DEAD and bad.attempts == 2
    # The other receivers still ran, and every failure was logged.
    assert recorder.names().count("succeeded") == 1
    assert recorder.names().count("dead") == 1
    failures = [r for r in caplog.records if "receiver bug" in (r.exc_text or "")]
    assert len(failures) >= 2 + 3 + 1 + 2  # enqueued x2, started x3, succeeded, failed x2


def test_enqueued_only_for_new_committed_jobs(control_app: Flask, recorder: Recorder) -> None:
    app = control_app
    store = c.store_of(app)
    with app.app_context():
        first = c.add.using(idempotency_key="k").enqueue(1, 2)
        again = c.add.using(idempotency_key="k").enqueue(1, 2)
        assert again.id == first.id
        with Session(store.engine) as session:
            c.add.using(session=session).enqueue(5, 5)
            assert recorder.names() == ["enqueued"]  # not before the commit
            session.rollback()
        with Session(store.engine) as session:
            kept = c.add.using(session=session).enqueue(6, 6)
            session.commit()
    assert [data["job"].id for _, data in recorder.events] == [first.id, kept.id]


def test_prometheus_metrics(control_app: Flask) -> None:
    app = control_app
    metrics = QueueMetrics(app)
    try:
        with app.app_context():
            c.add.enqueue(1, 2)
            c.fails.enqueue()
            waiting = c.add.using(queue="slow", delay=3600).enqueue(3, 4)
            overdue = c.add.using(queue="late").enqueue(5, 6)
        c.update(app, overdue.id, run_at=c.store_of(app).now() - timedelta(hours=1))
        c.burst(app, queues=("default",))
        value = metrics.registry.get_sample_value

        assert value("sqlqueue_jobs", {"queue": "default", "status": "completed"}) == 1
        assert value("sqlqueue_jobs", {"queue": "default", "status": "dead"}) == 1
        assert value("sqlqueue_jobs", {"queue": "slow", "status": "pending"}) == 1
        assert value("sqlqueue_queue_depth", {"queue": "slow"}) == 0  # not due yet
        assert value("sqlqueue_queue_depth", {"queue": "late"}) == 1
        assert value("sqlqueue_oldest_eligible_age_seconds", {"queue": "late"}) >= 3600
        assert value("sqlqueue_oldest_eligible_age_seconds", {"queue": "slow"}) == 0

        task = {"queue": "default", "task": "control.add"}
        failing = {"queue": "default", "task": "control.fails"}
        assert value("sqlqueue_jobs_enqueued_total", task) == 1
        assert value("sqlqueue_jobs_enqueued_total", {**task, "queue": "slow"}) == 1
        assert value("sqlqueue_attempts_total", {**task, "outcome": "succeeded"}) == 1
        assert value("sqlqueue_attempts_total", {**failing, "outcome": "failed"}) == 2
        assert value("sqlqueue_jobs_retried_total", failing) == 1
        assert value("sqlqueue_jobs_dead_total", failing) == 1
        count = "sqlqueue_attempt_duration_seconds_count"
        assert value(count, {**task, "outcome": "succeeded"}) == 1
        assert value(count, {**failing, "outcome": "failed"}) == 2
        assert waiting.refresh().status is JobStatus.PENDING
    finally:
        metrics.close()


def test_queue_depth_is_the_eligible_count_status_reads(control_app: Flask) -> None:
    """The depth gauge and ``flask queue status`` (``queries.status``) count the jobs due
    now in one place: for each queue, due, not yet due, overdue or none due, the same."""
    app = control_app
    metrics = QueueMetrics(app)
    try:
        with app.app_context():
            c.add.enqueue(1, 2)
            c.add.enqueue(3, 4)
            c.add.using(queue="slow", delay=3600).enqueue(5, 6)
            overdue = c.add.using(queue="late").enqueue(7, 8)
            c.add.using(queue="late", delay=3600).enqueue(9, 10)
        store = c.store_of(app)
        c.update(app, overdue.id, run_at=store.now() - timedelta(hours=1))
        with store.read() as conn:
            status = {row.queue: row.eligible for row in queries.status(conn, store.now())}
        value = metrics.registry.get_sample_value
        depth = {queue: value("sqlqueue_queue_depth", {"queue": queue}) for queue in status}
        assert status == {"default": 2, "late": 1, "slow": 0}
        assert depth == status
    finally:
        metrics.close()


def test_metrics_blueprint(control_app: Flask) -> None:
    app = control_app
    app.register_blueprint(c.queue.metrics_blueprint(), url_prefix="/closed")
    app.register_blueprint(
        c.queue.metrics_blueprint(authorize=lambda: True), url_prefix="/open", name="open"
    )
    with app.app_context():
        c.add.enqueue(1, 2)
    client = app.test_client()
    assert client.get("/closed/metrics").status_code == 403
    response = client.get("/open/metrics")
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain")
    body = response.get_data(as_text=True)
    assert 'sqlqueue_jobs{queue="default",status="pending"} 1.0' in body
    assert 'sqlqueue_jobs_enqueued_total{queue="default",task="control.add"} 1.0' in body
    app.extensions["sqlqueue_metrics"].close()


def test_the_metrics_blueprint_opens_only_for_true(control_app: Flask) -> None:
    from flask import Response
    from flask import redirect

    class User:
        is_authenticated = False

    app = control_app
    answers: dict[str, Any] = {
        "false": False,
        "none": None,
        "one": 1,
        "text": "yes",
        "user": User(),
        "redirect": redirect("/login"),
        "response": Response("no", status=401),
    }
    for name, answer in answers.items():
        app.register_blueprint(
            c.queue.metrics_blueprint(authorize=lambda answer=answer: answer),
            url_prefix=f"/{name}",
            name=name,
        )
    app.register_blueprint(c.queue.metrics_blueprint(), url_prefix="/closed", name="closed")
    with app.app_context():
        c.add.enqueue(1, 2)
    client = app.test_client()
    try:
        for name in ("false", "none", "one", "text", "user"):
            response = client.get(f"/{name}/metrics")
            assert response.status_code == 403, name
            body = response.get_data(as_text=True)
            assert "You are not allowed to use the queue metrics endpoint." in body
            assert "sqlqueue_jobs" not in body
        redirected = client.get("/redirect/metrics")
        assert (redirected.status_code, redirected.headers["Location"]) == (302, "/login")
        refused = client.get("/response/metrics")
        assert (refused.status_code, refused.get_data(as_text=True)) == (401, "no")
        closed = client.get("/closed/metrics")
        assert closed.status_code == 403
        assert "metrics_blueprint(authorize=" in closed.get_data(as_text=True)
    finally:
        app.extensions["sqlqueue_metrics"].close()


def test_metrics_without_prometheus_client_says_how_to_install() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "try:\n"
        "    import flask_sqlqueue.metrics\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'flask-sqlqueue[prometheus]'" in out


def test_log_records_inside_a_task_name_the_job(control_app: Flask) -> None:
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    c.app_log.addHandler(handler)
    try:
        with control_app.app_context():
            job = c.logs.using(idempotency_key="order-7").enqueue("hello")
        c.burst(control_app)
        c.app_log.warning("outside")
    finally:
        c.app_log.removeHandler(handler)
    inside, outside = seen
    assert (
        inside.sqlqueue_job_id,  # type: ignore[attr-defined]
        inside.sqlqueue_task,  # type: ignore[attr-defined]
        inside.sqlqueue_attempt,  # type: ignore[attr-defined]
        inside.sqlqueue_idempotency_key,  # type: ignore[attr-defined]
    ) == (job.id, "control.logs", 1, "order-7")
    assert outside.sqlqueue_job_id is None  # type: ignore[attr-defined]
    fmt = logging.Formatter("[job %(sqlqueue_job_id)s %(sqlqueue_task)s] %(message)s")
    assert fmt.format(inside) == f"[job {job.id} control.logs] inside: hello"
    assert fmt.format(outside) == "[job None None] outside"
    # The queue's own lines keep their fields, and a formatter with the defaults
    # handles the ones that have none.
    own = logging.getLogger("flask_sqlqueue.worker").makeRecord(
        "flask_sqlqueue.worker", logging.INFO, __file__, 1, "plain", (), None
    )
    assert "sqlqueue_job_id" not in own.__dict__
    safe = logging.Formatter("[%(sqlqueue_job_id)s] %(message)s", defaults=LOG_DEFAULTS)
    assert safe.format(own) == "[None] plain"
    assert job.refresh().status is JobStatus.COMPLETED

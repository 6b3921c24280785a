"""flask_sqlqueue.testing: eager mode, drain (with a movable clock), periodic slots,
assert_enqueued / assert_not_enqueued, and the pytest fixtures, on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from datetime import timedelta

import pytest
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from flask_sqlqueue.testing import Clock
from flask_sqlqueue.testing import QueueTester
from flask_sqlqueue.testing import assert_enqueued
from flask_sqlqueue.testing import assert_not_enqueued
from flask_sqlqueue.testing import drain
from flask_sqlqueue.testing import eager
from flask_sqlqueue.testing import enqueue_periodic
from flask_sqlqueue.testing import enqueued

# The plugin's fixtures, imported here; tests/test_example_app_with_helpers.py loads the
# plugin with pytest_plugins instead.
from flask_sqlqueue.testing import sqlqueue as sqlqueue
from flask_sqlqueue.testing import sqlqueue_eager as sqlqueue_eager
from tests.conftest import install_schema
from tests.conftest import query

queue = SQLQueue()


@queue.task
def add(a: int, b: int) -> int:
    return a + b


@queue.task(queue="mail")
def send(to: str, subject: str = "hi") -> str:
    return f"{to}:{subject}"


@queue.task
def fan_out(n: int) -> int:
    """Enqueues ``n`` more jobs from inside a job."""
    for i in range(n):
        add.enqueue(i, i)
    return n


@queue.task(max_attempts=3)
def fails_twice() -> int:
    if current_job.attempts < 3:
        raise RuntimeError(f"attempt {current_job.attempts}")
    return current_job.attempts


@queue.task
def forever() -> None:
    forever.enqueue()


@queue.periodic("0 * * * *", name="hourly")
def hourly() -> None:
    pass


@pytest.fixture
def happ(database_uri: str) -> Iterator[Flask]:
    """An app of this module's queue on the test's database; retries come at once."""
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = Flask(__name__)
    app.config.update(
        SQLQUEUE_DATABASE_URI=database_uri, SQLQUEUE_BACKOFF_BASE=0, SQLQUEUE_BACKOFF_JITTER=0
    )
    queue.init_app(app)
    queue.upgrade_database(app=app)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


@pytest.fixture
def sqlqueue_app(happ: Flask) -> Flask:
    """What the plugin's fixtures test: overridden here, as a user would."""
    return happ


def statuses(database_uri: str) -> list[tuple[str, str]]:
    return [
        (row[0], row[1])
        for row in query(database_uri, "SELECT task, status FROM sqlqueue_jobs ORDER BY id")
    ]


# -- eager -----------------------------------------------------------------------------------


def test_eager_runs_enqueues_inline_only_inside_the_block(happ: Flask) -> None:
    with happ.app_context():
        with eager():
            job = add.enqueue(2, 3)
            assert (job.status, job.result, job.attempts) == (JobStatus.COMPLETED, 5, 1)
        later = add.enqueue(1, 1)
        assert later.status == JobStatus.PENDING
        assert happ.extensions["sqlqueue"].settings.eager is False


def test_eager_fixture(sqlqueue_eager: QueueTester, happ: Flask) -> None:
    with happ.app_context():
        assert send.enqueue("a@example.com").result == "a@example.com:hi"


# -- drain -----------------------------------------------------------------------------------


def test_drain_runs_everything_eligible_through_the_claim(happ: Flask, database_uri: str) -> None:
    with happ.app_context():
        first = add.enqueue(1, 2)
        fan_out.enqueue(2)
        failing = fails_twice.enqueue()
        ran = drain()
    # Jobs enqueued by jobs and retries that come due run too, each listed once.
    assert [job.task for job in ran] == [
        add.name,
        fan_out.name,
        fails_twice.name,
        add.name,
        add.name,
    ]
    assert ran[0].id == first.id and ran[0].result == 3 and ran[0].worker_id is not None
    retried = next(job for job in ran if job.id == failing.id)
    assert (retried.status, retried.attempts, retried.result) == (JobStatus.COMPLETED, 3, 3)
    assert {status for _, status in statuses(database_uri)} == {"completed"}
    with happ.app_context():
        assert drain() == []


def test_drain_leaves_future_jobs_unless_asked(happ: Flask, database_uri: str) -> None:
    with happ.app_context():
        soon = add.using(delay=60).enqueue(1, 1)
        later = add.using(delay=timedelta(hours=2)).enqueue(2, 2)
        assert drain() == []
        clock = Clock()
        clock.advance(120)
        assert [job.id for job in drain(clock=clock)] == [soon.id]
        ran = drain(clock=clock, include_scheduled=True)
    assert [job.id for job in ran] == [later.id]
    # The clock was moved to the job's run_at.
    assert clock.now() >= later.run_at
    assert statuses(database_uri) == [(add.name, "completed")] * 2


def test_drain_as_of_a_time_and_by_queue(happ: Flask) -> None:
    with happ.app_context():
        mail = send.enqueue("b@example.com")
        other = add.enqueue(1, 2)
        assert drain(now=datetime.now(UTC) - timedelta(hours=1)) == []  # not yet due then
        assert [job.id for job in drain(queues=["mail"])] == [mail.id]
        assert [job.id for job in queue.drain()] == [other.id]
    assert queue.drain(app=happ) == []


def test_drain_stops_a_task_that_enqueues_itself(happ: Flask) -> None:
    with happ.app_context():
        forever.enqueue()
        with pytest.raises(RuntimeError, match="does a task enqueue itself"):
            drain(max_jobs=5)


def test_drain_needs_an_app() -> None:
    with pytest.raises(RuntimeError, match="need an app"):
        drain()


def test_clock_moves_forward_only() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    clock = Clock(start, source=lambda: datetime(2024, 1, 1, tzinfo=UTC))
    assert clock.now() == start
    assert clock.advance(90) == start + timedelta(seconds=90)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="no timezone"):
        clock.set(datetime(2030, 1, 1))


# -- periodic ----------------------------------------------------------------------------------


def test_enqueue_periodic_and_advance(happ: Flask, database_uri: str) -> None:
    since = datetime(2024, 6, 3, 9, 30, tzinfo=UTC)
    with happ.app_context():
        jobs = enqueue_periodic(since=since, until=since + timedelta(hours=3))
        again = enqueue_periodic(since=since, until=since + timedelta(hours=3))
    assert [job.run_at.hour for job in jobs] == [10, 11, 12]
    assert [job.id for job in again] == [job.id for job in jobs]  # once per slot
    tester = QueueTester(happ, Clock(since + timedelta(hours=3)))
    made = tester.advance(timedelta(hours=2))
    assert [job.run_at.hour for job in made] == [13, 14]
    assert len(tester.drain()) == 5
    assert statuses(database_uri) == [("hourly", "completed")] * 5


# -- assertions ----------------------------------------------------------------------------------


def test_assert_enqueued_matches_task_args_kwargs_and_queue(happ: Flask) -> None:
    with happ.app_context():
        job = send.enqueue("a@example.com", subject="welcome")
        add.enqueue(1, 2)
        assert assert_enqueued(send).id == job.id
        assert assert_enqueued(send, args=["a@example.com"]).id == job.id
        assert assert_enqueued(send, args=("a@example.com",), kwargs={"subject": "welcome"})
        assert assert_enqueued(send.name, queue="mail").id == job.id
        assert_not_enqueued(send, args=["b@example.com"])
        assert_not_enqueued(send, kwargs={})
        assert_not_enqueued(send, queue="default")
        assert_not_enqueued(fan_out)
        assert [j.task for j in enqueued()] == [send.name, add.name]


def test_assert_enqueued_failure_lists_what_is_enqueued(happ: Flask) -> None:
    with happ.app_context():
        add.enqueue(1, 2)
        send.enqueue("a@example.com")
        with pytest.raises(AssertionError) as info:
            assert_enqueued(send, args=["b@example.com"])
    text = str(info.value)
    assert f"Expected a job {send.name}(args=['b@example.com']) to be enqueued" in text
    assert f"{add.name}(args=[1, 2], kwargs={{}}) queue='default'" in text
    assert f"{send.name}(args=['a@example.com'], kwargs={{}}) queue='mail'" in text


def test_assert_not_enqueued_failure_names_the_jobs(happ: Flask) -> None:
    with happ.app_context():
        job = add.enqueue(1, 2)
        with pytest.raises(AssertionError, match=rf"found job\(s\) {job.id}\."):
            assert_not_enqueued(add, args=[1, 2])
        drain()
        assert_not_enqueued(add)  # completed jobs are no longer enqueued
        with pytest.raises(AssertionError, match="No job is enqueued"):
            assert_enqueued(add)


def test_assertions_refuse_a_non_task() -> None:
    with pytest.raises(TypeError, match="task must be a task or a task name"):
        assert_enqueued(42)  # type: ignore[arg-type]


# -- the fixtures ----------------------------------------------------------------------------------


def test_sqlqueue_fixture(sqlqueue: QueueTester, happ: Flask) -> None:
    with happ.app_context():
        add.enqueue(20, 22)
    job = sqlqueue.assert_enqueued(add, args=[20, 22])
    sqlqueue.assert_not_enqueued(send)
    [ran] = sqlqueue.drain()
    assert (ran.id, ran.result) == (job.id, 42)
    sqlqueue.assert_not_enqueued(add)
    assert sqlqueue.enqueued() == []
    with sqlqueue.eager(), happ.app_context():
        assert add.enqueue(1, 1).result == 2

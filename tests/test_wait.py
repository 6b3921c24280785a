"""``job.wait()`` and ``await job.async_wait()``, and ``aenqueue``, on every backend.

A wait returns once its job is completed, dead or cancelled. Every write that finishes
a job wakes its waiters at once (PostgreSQL: NOTIFY; SQLite and MariaDB: a datagram to
the waiting processes of this host), so the tests of those writes wait with a poll
interval no test waits out (:data:`NEVER`): only a wake-up returns the wait in time.
Each such job is held back (its queue paused, or its task waiting for ``go``) until the
waiter listens, so the wait's first read cannot find it finished already.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import Job
from flask_sqlqueue import JobStatus
from flask_sqlqueue import QueueNotSetUp
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.config import Settings
from flask_sqlqueue.core import operations
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core import wakeup
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim
from flask_sqlqueue.core.enqueue import enqueue
from flask_sqlqueue.core.store import Store
from tests import control_app as c
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import install_schema
from tests.stores import store_of
from tests.waiting import WAIT
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import queue_work
from tests.workers import running
from tests.workers import stop

#: A waiter's poll interval that no test waits out: only a wake-up returns it in time.
NEVER = 10 * WAIT


class Waiter:
    """``job.wait(**options)`` on a thread of its own, and how it ended."""

    def __init__(self, job: Job, **options: Any) -> None:
        self.job = job
        self.result: Job | None = None
        self.error: BaseException | None = None
        self.returned_at: float | None = None
        self._thread = threading.Thread(target=self._wait, args=(options,), name="test-waiter")
        self._thread.start()

    def _wait(self, options: dict[str, Any]) -> None:
        try:
            self.result = self.job.wait(**options)
        except BaseException as exc:
            self.error = exc
        finally:
            self.returned_at = time.monotonic()

    def ended(self, within: float) -> bool:
        self._thread.join(within)
        return not self._thread.is_alive()


@contextmanager
def waiting(app: Flask, job: Job, **options: Any) -> Iterator[Waiter]:
    """A :class:`Waiter` of ``job``, listening for wake-ups when the block starts."""
    options.setdefault("poll_interval", NEVER)
    options.setdefault("timeout", scaled(30))
    waiter = Waiter(job, **options)
    try:
        wait_for(store_of(app).waiters.listening.is_set, "the waiter to listen")
        yield waiter
    finally:
        # Fails the test, not the next one, if it never returned (a lost wake-up).
        assert waiter.ended(options["timeout"] + WAIT), "the wait never returned"


def woken(waiter: Waiter, since: float) -> Job:
    """The job the wait returned, promptly after ``since`` (not at a poll: none comes)."""
    assert waiter.ended(scaled(10)), "the wait did not return: no wake-up"
    assert waiter.error is None, repr(waiter.error)
    assert waiter.returned_at is not None and waiter.returned_at - since < scaled(5)
    assert waiter.result is waiter.job  # the caller's own Job, refreshed in place
    return waiter.result


# -- a job finished already, timeouts, bad arguments -----------------------------------------


def test_wait_returns_a_finished_job_refreshed(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        done = c.add.enqueue(2, 3)
        dead = c.fails.enqueue("no luck")
        cancelled = c.add.using(delay=3600).enqueue(1, 1)
    c.burst(app)
    operations.cancel(store_of(app), [cancelled.id])

    assert done.status is JobStatus.PENDING  # a snapshot, until waited for
    assert done.wait(timeout=scaled(10)) is done
    assert (done.status, done.result, done.attempts) == (JobStatus.COMPLETED, 5, 1)
    assert dead.wait(timeout=scaled(10)).status is JobStatus.DEAD
    assert dead.last_error == "RuntimeError: no luck"
    assert cancelled.wait(timeout=0).status is JobStatus.CANCELLED
    # Read through queue.get_job, a job waits the same way, without an app context.
    with app.app_context():
        again = c.queue.get_job(done.id)
    assert again is not None and again.wait().result == 5


def test_wait_times_out(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.add.using(delay=3600).enqueue(1, 2)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"Job {job.id} did not finish within 0.3 seconds"):
        job.wait(timeout=0.3, poll_interval=0.05)
    assert 0.3 <= time.monotonic() - started < scaled(5)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="it is pending"):
        job.wait(timeout=0)  # one look, no waiting
    assert time.monotonic() - started < scaled(5)
    assert job.status is JobStatus.PENDING
    # No waiter is left behind, and the listener stops.
    assert not store_of(app).waiters._events


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"timeout": -1}, ValueError, "timeout must be 0 or more seconds"),
        ({"timeout": math.nan}, ValueError, "timeout must be 0 or more seconds"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds or None"),
        ({"timeout": True}, TypeError, "timeout must be a number of seconds or None"),
        ({"poll_interval": 0}, ValueError, "poll_interval must be a positive number"),
        ({"poll_interval": math.inf}, ValueError, "poll_interval must be a positive number"),
    ],
)
def test_wait_refuses_bad_arguments(
    control_app: Flask,
    options: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    with control_app.app_context():
        job = c.add.enqueue(1, 2)
    with pytest.raises(error, match=message):
        job.wait(**options)
    with pytest.raises(error, match=message):
        asyncio.run(job.async_wait(**options))
    assert not store_of(control_app).waiters._events  # refused before waiting


def test_a_job_deleted_while_waited_for_raises_lookup_error(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.add.using(delay=3600).enqueue(1, 2)
    with waiting(app, job) as waiter:
        deleted_at = time.monotonic()
        operations.delete(store_of(app), [job.id])
        assert waiter.ended(scaled(10)) and waiter.returned_at is not None
        assert waiter.returned_at - deleted_at < scaled(5)
    assert isinstance(waiter.error, LookupError)
    assert str(waiter.error) == f"Job {job.id} no longer exists."


def test_a_wait_rechecks_the_database_if_no_wake_up_comes(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.add.using(delay=3600).enqueue(1, 2)
    # Finished behind the queue's back: no write of the queue's, so no wake-up.
    with waiting(app, job, poll_interval=0.1) as waiter:
        c.update(app, job.id, status="completed", result="3")
        finished_at = time.monotonic()
    assert woken(waiter, finished_at).result == 3


# -- every write that finishes a job wakes its waiters ------------------------------------------


def _held(app: Flask, task: Any, *args: Any) -> Job:
    """A job of ``task`` in the paused default queue: no worker takes it until resumed."""
    with app.app_context():
        c.queue.pause("default")
        return task.enqueue(*args)  # type: ignore[no-any-return]


def _resume(app: Flask) -> None:
    with app.app_context():
        c.queue.resume("default")


def test_a_worker_completing_the_job_wakes_the_waiter(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.waits.enqueue("finished")
    with c.running_worker(app):
        assert c.started.wait(WAIT)
        with waiting(app, job) as waiter:
            let_go = time.monotonic()
            c.go.set()
    assert woken(waiter, let_go).result == "finished"
    assert job.status is JobStatus.COMPLETED


def test_a_batch_of_completions_wakes_every_waiter(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        c.queue.pause("default")
        made = c.add.enqueue_many([((n, n), {}) for n in range(40)])
    waiters = []
    with c.running_worker(app, concurrency=4):
        with waiting(app, made[0]) as first, waiting(app, made[-1]) as last:
            waiters = [first, last]
            resumed = time.monotonic()
            _resume(app)
    assert [woken(w, resumed).result for w in waiters] == [0, 78]


def _cancel(app: Flask, job: Job) -> None:
    operations.cancel(store_of(app), [job.id])


def _rescue(app: Flask, job: Job) -> None:
    # The job as a worker that vanished an hour ago left it, its attempts spent.
    store = store_of(app)
    lost = store.now() - timedelta(hours=1)
    c.update(app, job.id, status="running", worker_id="lost", started_at=lost, attempts=2)
    assert [status for _, status, _ in operations.rescue(store, 60)] == ["dead"]


def _resume_it(app: Flask, _job: Job) -> None:
    _resume(app)


#: What holds the job back, what ends it then, how it ends, and whether a worker runs
#: meanwhile (one that could rescue the job itself would spoil the rescue's test).
DOORS: dict[str, tuple[Callable[[Flask], Job], Callable[[Flask, Job], None], JobStatus, bool]] = {
    "a worker's success": (
        lambda app: _held(app, c.add, 1, 2), _resume_it, JobStatus.COMPLETED, True
    ),
    "a worker's last failure": (lambda app: _held(app, c.fails), _resume_it, JobStatus.DEAD, True),
    "cancelling a pending job": (
        lambda app: _held(app, c.add, 1, 2), _cancel, JobStatus.CANCELLED, False
    ),
    "a rescue": (lambda app: _held(app, c.fails), _rescue, JobStatus.DEAD, False),
}  # fmt: skip


@pytest.mark.parametrize("door", list(DOORS))
def test_every_write_that_ends_a_job_wakes_its_waiter(control_app: Flask, door: str) -> None:
    app = control_app
    make, finish, status, worker = DOORS[door]
    job = make(app)
    # The worker never polls either: the resume wakes it, as every resume does.
    working = c.running_worker(app, poll_interval=NEVER) if worker else nullcontext()
    with working, waiting(app, job) as waiter:
        finishing = time.monotonic()
        finish(app, job)
    assert woken(waiter, finishing).status is status


def test_a_running_job_stopped_by_its_cancellation_wakes_the_waiter(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.until_cancelled.enqueue()
    with c.running_worker(app):
        assert c.started.wait(WAIT)
        with waiting(app, job) as waiter:
            asked = time.monotonic()
            _cancel(app, job)  # asked to stop; it stops when it next checks
    assert woken(waiter, asked).status is JobStatus.CANCELLED


def test_a_job_handed_back_at_shutdown_after_its_cancellation_wakes_the_waiter(
    control_app: Flask,
) -> None:
    app = control_app
    with app.app_context():
        job = c.waits.enqueue()  # runs until the test lets it go: past the grace period
    worker = c.queue.worker(WorkerOptions(grace=0.2, poll_interval=0.05), app)
    with waiting(app, job) as waiter:
        with running(worker):
            assert c.started.wait(WAIT)
            _cancel(app, job)  # asked to stop; this task never checks
            stopping = time.monotonic()
        # Stopped: the job is handed back after the grace period, and ends cancelled.
        assert woken(waiter, stopping).status is JobStatus.CANCELLED
    # The task returns at last; its late outcome finds its claim gone and changes nothing.
    c.go.set()
    wait_for(
        lambda: not any(t.name.startswith("sqlqueue-job") for t in threading.enumerate()),
        "the task's thread to end",
    )
    assert job.refresh().status is JobStatus.CANCELLED


def test_a_worker_in_another_process_wakes_the_waiter(make_app: Any, database_uri: str) -> None:
    app = make_app()
    with app.app_context():
        sample_app.queue.pause("default")
        job = sample_app.add.enqueue(20, 22)
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    with queue_work(database_uri, "--poll-interval", "0.05", **quiet) as worker:
        with waiting(app, job) as waiter:
            wait_for(lambda: _worker_listed(app), "the worker process to start")
            resumed = time.monotonic()
            with app.app_context():
                sample_app.queue.resume("default")
            # That process completes the job; the wake-up crosses to this one.
            assert woken(waiter, resumed).result == 42
        err = stop(worker)
    assert worker.returncode == 0, err


def _worker_listed(app: Flask) -> bool:
    from flask_sqlqueue.core.models import workers

    with store_of(app).read() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(workers)).scalar_one() > 0


# -- the cost when nobody waits ---------------------------------------------------------------

_audited: list[str] = []
_auditing = threading.local()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not getattr(_auditing, "on", False):
        return
    # Unix sockets only: a MariaDB driver's own connection is a TCP socket.
    if (event == "socket.__new__" and args[1] == socket.AF_UNIX) or (
        event == "socket.sendto" and isinstance(args[1], str)
    ):
        _audited.append(event)


sys.addaudithook(_audit)


@contextmanager
def socket_calls() -> Iterator[list[str]]:
    """The sockets this thread makes and the datagrams it sends inside the block."""
    _audited.clear()
    _auditing.on = True
    try:
        yield _audited
    finally:
        _auditing.on = False


def _claimed(store: Store, count: int) -> list[tuple[int, str, str | None]]:
    """``count`` jobs of ``add`` enqueued and claimed: ``(id, claim token, result)``."""
    enqueue(store, "add", [([1, 1], {})] * count, many=True, unregistered=True)
    with store.write() as conn:
        request = ClaimRequest("w", "token", store.now(), count, (), ("add",))
        rows = claim(conn, store.ops, request, {})
    assert len(rows) == count
    return [(row.id, row.claim_token, "2") for row in rows]


def _complete(store: Store, done: list[tuple[int, str, str | None]]) -> set[int]:
    """What a worker does: complete a batch, then tell this host's waiters."""
    with store.write() as conn:
        completed = transitions.complete_many(conn, store.ops, done, store.now())
    store.finished(completed)
    return completed


def test_a_completion_makes_no_socket_when_nobody_waits(core_store: Store) -> None:
    done = _claimed(core_store, 3)
    with socket_calls() as calls:
        assert _complete(core_store, done[:2]) == {done[0][0], done[1][0]}
    assert calls == []
    job = core_store.get_job(done[2][0])
    assert job is not None
    waiter = Waiter(job, poll_interval=NEVER, timeout=scaled(30))
    wait_for(core_store.waiters.listening.is_set, "the waiter to listen")
    with socket_calls() as calls:
        completing = time.monotonic()
        _complete(core_store, done[2:])
    assert woken(waiter, completing).status is JobStatus.COMPLETED
    if core_store.ops.wake_dir(core_store.engine.url) is not None:  # SQLite, MariaDB
        assert calls == ["socket.__new__", "socket.sendto"]
    else:  # PostgreSQL: the completing statement told the waiter
        assert calls == []


def test_a_large_batch_of_completions_wakes_its_waiters(core_store: Store) -> None:
    # More ids than one message carries: the batch is told in two.
    done = _claimed(core_store, wakeup.IDS_PER_MESSAGE + 50)
    first, last = (core_store.get_job(done[i][0]) for i in (0, -1))
    assert first is not None and last is not None
    waiters = [Waiter(job, poll_interval=NEVER, timeout=scaled(30)) for job in (first, last)]
    wait_for(core_store.waiters.listening.is_set, "the waiters to listen")
    completing = time.monotonic()
    assert len(_complete(core_store, done)) == len(done)
    for waiter in waiters:
        assert woken(waiter, completing).status is JobStatus.COMPLETED


@pytest.fixture
def own_database_store(other_database_uri: str, backend: str) -> Iterator[Store]:
    """A store on a database of its own: PostgreSQL's notifications are per database,
    and other tests' schemas share the one ``database_uri`` names."""
    if backend != "postgresql":
        pytest.skip("only PostgreSQL carries the news itself")
    install_schema(other_database_uri)
    store = Store.from_settings(Settings(database_uri=other_database_uri))
    yield store
    store.engine.dispose()


@pytest.mark.parametrize("size", [1, 3, wakeup.IDS_PER_MESSAGE + 1])
def test_postgresql_tells_a_batch_in_its_completing_statement(
    own_database_store: Store, size: int
) -> None:
    store = own_database_store
    done = _claimed(store, size)
    expected = math.ceil(size / wakeup.IDS_PER_MESSAGE)
    listener = store.engine.raw_connection()
    try:
        driver: Any = listener.driver_connection
        driver.autocommit = True
        driver.execute("LISTEN sqlqueue_finished")
        now = store.now()
        with c_statements(store) as seen, store.write() as conn:
            transitions.complete_many(conn, store.ops, done, now)
        assert len(seen) == 1  # the notifications cost no statement of their own
        told = [
            wakeup.decode_ids(notice.payload)
            for notice in driver.notifies(timeout=scaled(5), stop_after=expected)
        ]
    finally:
        listener.invalidate()
    assert len(told) == expected
    assert sorted(i for ids in told for i in ids or []) == sorted(i for i, _, _ in done)


@contextmanager
def c_statements(store: Store) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith(("BEGIN", "COMMIT")):
            seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)


# -- asyncio ---------------------------------------------------------------------------------


def test_aenqueue_and_async_wait(control_app: Flask) -> None:
    app = control_app

    async def produce_and_wait() -> list[Any]:
        jobs_ = [
            await c.add.aenqueue(2, 3),
            await c.add.using(priority=5).aenqueue(1, 1),
            await c.queue.aenqueue("control.add", args=[4], kwargs={"b": 4}),
        ]
        done = await asyncio.gather(*(job.async_wait(timeout=scaled(30)) for job in jobs_))
        assert done == jobs_  # each the caller's Job, refreshed in place
        return [(job.status, job.result, job.priority) for job in done]

    with c.running_worker(app), app.app_context():
        assert asyncio.run(produce_and_wait()) == [
            (JobStatus.COMPLETED, 5, 0),
            (JobStatus.COMPLETED, 2, 5),
            (JobStatus.COMPLETED, 8, 0),
        ]


def test_aenqueue_runs_in_the_callers_app_context(control_app: Flask) -> None:
    # As enqueue: without an app context there is no queue to write to.
    with pytest.raises(QueueNotSetUp):
        asyncio.run(c.add.aenqueue(1, 2))
    with control_app.app_context():
        job = asyncio.run(c.add.aenqueue(1, 2))
    assert job.refresh().status is JobStatus.PENDING


def test_async_wait_is_woken_without_polling(control_app: Flask) -> None:
    app = control_app
    job = _held(app, c.add, 20, 22)
    resumed: list[float] = []

    async def wait() -> Job:
        waiter = asyncio.ensure_future(job.async_wait(timeout=scaled(30), poll_interval=NEVER))
        while not store_of(app).waiters.listening.is_set():
            await asyncio.sleep(0.01)
        resumed.append(time.monotonic())
        await asyncio.to_thread(_resume, app)
        return await waiter

    with c.running_worker(app, poll_interval=NEVER):
        assert asyncio.run(wait()).result == 42
    assert time.monotonic() - resumed[0] < scaled(10)


def test_an_async_wait_times_out_or_is_cancelled_and_leaves_nothing(control_app: Flask) -> None:
    app = control_app
    with app.app_context():
        job = c.add.using(delay=3600).enqueue(1, 2)

    with pytest.raises(TimeoutError, match=f"Job {job.id} did not finish"):
        asyncio.run(job.async_wait(timeout=0.2, poll_interval=0.05))

    async def give_up() -> None:
        await asyncio.wait_for(job.async_wait(poll_interval=NEVER), 0.3)

    with pytest.raises(TimeoutError):
        asyncio.run(give_up())
    # The cancelled wait's thread stops at once (it would else wait for good), and with
    # it the listener.
    wait_for(
        lambda: not any(t.name.startswith("sqlqueue-wait") for t in threading.enumerate()),
        "the abandoned wait's thread to stop",
        timeout=scaled(10),
    )
    assert not store_of(app).waiters._events


def test_a_job_not_read_from_a_queue_cannot_be_waited_for() -> None:
    job = Job(
        id=1, queue="default", task="add", args=[], kwargs={}, status=JobStatus.PENDING,
        attempts=0, max_attempts=1, priority=0, run_at=None, created_at=None, updated_at=None,  # type: ignore[arg-type]
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="not read from a queue"):
        job.wait(timeout=1)


def test_the_example_of_docs_workflows_runs(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "workflows.md").read_text()
    section = text[text.index("## Waiting for a result") :]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "completed 5",
        "Job 2 did not finish within 0.5 seconds; it is pending.",
    ]

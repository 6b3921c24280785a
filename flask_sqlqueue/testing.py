"""Helpers for testing an app that uses flask_sqlqueue, and a pytest plugin.

Everything works on the app's real queue database and through the real claim, so a
test sees what a worker would do::

    from flask_sqlqueue.testing import assert_enqueued, drain

    def test_signup_sends_welcome(app, client):
        client.post("/signup", data={"email": "a@example.com"})
        with app.app_context():
            assert_enqueued(send_welcome, args=["a@example.com"])
            [job] = drain()
        assert job.status == "completed"

With pytest, load the plugin (in the root ``conftest.py``) for the ``sqlqueue`` and
``sqlqueue_eager`` fixtures; they use your ``app`` fixture, or override
``sqlqueue_app``::

    pytest_plugins = ["flask_sqlqueue.testing"]

    def test_report(sqlqueue, client):
        client.post("/reports", json={"report_id": 7})
        sqlqueue.assert_enqueued(build_report, args=[7])
        sqlqueue.drain()

See ``docs/testing.md``.

PYTEST_DONT_REWRITE: its failures are raised with full messages, so pytest need not
rewrite it, and it may be imported before pytest loads it as a plugin.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from flask import Flask

from .core import periodic
from .core.jobs import Job
from .core.models import JobStatus
from .core.models import jobs
from .core.tasks import Task
from .core.worker import Worker
from .extension import QueueState
from .extension import queue_state
from .extension import resolve_app

__all__ = [
    "Clock",
    "QueueTester",
    "assert_enqueued",
    "assert_not_enqueued",
    "drain",
    "eager",
    "enqueue_periodic",
    "enqueued",
]

#: :func:`drain` stops with an error after running this many jobs (a task that keeps
#: enqueueing itself would otherwise never let it return).
DEFAULT_MAX_JOBS = 10_000


class Clock:
    """A clock for tests that can be moved forward: the real time plus an offset.

    :func:`drain` claims jobs as of ``clock.now()`` (so ``clock.advance(3600)`` makes
    jobs delayed by up to an hour eligible) and :func:`enqueue_periodic` enqueues the
    slots of periodic tasks up to it. Jobs enqueued by the app still take their
    ``run_at`` from the real time.

    :param start: where the clock starts (an aware datetime); default: now.
    :param source: the real clock (default: ``datetime.now(UTC)``).
    """

    def __init__(
        self,
        start: datetime | None = None,
        *,
        source: Callable[[], datetime] | None = None,
    ) -> None:
        self._source = source or (lambda: datetime.now(UTC))
        self._offset = timedelta(0)
        if start is not None:
            self.set(start)

    def now(self) -> datetime:
        """The clock's current time (aware, UTC)."""
        return self._source() + self._offset

    def advance(self, seconds: float | timedelta) -> datetime:
        """Move the clock forward; returns the new time."""
        step = seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds)
        if step < timedelta(0):
            raise ValueError(f"A clock only moves forward; got {seconds!r}.")
        self._offset += step
        return self.now()

    def set(self, moment: datetime) -> datetime:
        """Move the clock to ``moment`` (an aware datetime); returns it."""
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise ValueError(f"{moment!r} has no timezone; pass an aware datetime.")
        self._offset = moment.astimezone(UTC) - self._source()
        return self.now()

    def __repr__(self) -> str:
        return f"<Clock {self.now().isoformat()}>"


def _state(app: Flask | None) -> QueueState:
    state = queue_state(app)
    state.ensure_schema()
    return state


# -- eager mode ------------------------------------------------------------------------------


@contextmanager
def eager(app: Flask | None = None) -> Iterator[None]:
    """Within the block, ``.enqueue()`` runs the job at once in this thread (as
    ``SQLQUEUE_EAGER = True`` does for the whole app), through the real claim: the job
    is written, run and recorded, and ``.enqueue()`` returns it finished."""
    state = _state(app)
    before = state.settings
    state.settings = dataclasses.replace(before, eager=True)
    try:
        yield
    finally:
        state.settings = before


# -- running jobs ----------------------------------------------------------------------------


class _DrainWorker(Worker):
    """A worker that remembers which jobs it claimed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.claimed: list[int] = []

    def _claim(self, limit: int) -> list[Any]:
        attempts = super()._claim(limit)
        self.claimed.extend(attempt.job.id for attempt in attempts)
        return attempts


def drain(
    app: Flask | None = None,
    *,
    include_scheduled: bool = False,
    clock: Clock | None = None,
    now: datetime | None = None,
    queues: Sequence[str] = (),
    max_jobs: int = DEFAULT_MAX_JOBS,
) -> list[Job]:
    """Run every job that is eligible now, one by one in this thread, through the real
    claim; jobs they enqueue run too, and so do retries that are due.

    :param include_scheduled: also run jobs due later (delayed jobs, retries waiting for
        their backoff): the clock jumps to each one's ``run_at`` in turn, and stays there.
    :param clock: the :class:`Clock` to claim by (it is moved by ``include_scheduled``).
    :param now: claim as of this time instead (an aware datetime).
    :param queues: only these queues (default: every queue).
    :returns: each job that ran, in the order it first ran, as it is now.
    :raises RuntimeError: more than ``max_jobs`` attempts ran.
    """
    if clock is not None and now is not None:
        raise ValueError("Pass clock or now, not both.")
    the_app = resolve_app(app)
    state = _state(the_app)
    clock = clock or Clock(now, source=state.store.now)
    worker = _DrainWorker(
        state.store,
        state.registry,
        state.worker_options(queues=tuple(queues)),
        job_context=the_app.app_context,
        clock=clock.now,
    )
    try:
        while True:
            while worker.run_once():
                if len(worker.claimed) > max_jobs:
                    raise RuntimeError(
                        f"drain() ran {max_jobs} jobs and more keep coming; does a task "
                        "enqueue itself? Pass max_jobs= to allow more."
                    )
            if not include_scheduled:
                break
            upcoming = _next_run_at(state, clock.now(), tuple(queues))
            if upcoming is None:
                break
            clock.set(upcoming)
    finally:
        worker.close()
    ran = list(dict.fromkeys(worker.claimed))
    found = {job.id: job for job in _jobs(state, jobs.c.id.in_(ran))} if ran else {}
    return [found[job_id] for job_id in ran if job_id in found]


def _next_run_at(state: QueueState, after: datetime, queues: tuple[str, ...]) -> datetime | None:
    """When the next pending job that this app can run is due, if after ``after``."""
    condition = sa.and_(
        jobs.c.status == JobStatus.PENDING.value,
        jobs.c.run_at > after,
        jobs.c.task.in_(sorted(state.registry)),
    )
    if queues:
        condition = sa.and_(condition, jobs.c.queue.in_(queues))
    with state.store.read() as conn:
        rows = conn.execute(
            sa.select(jobs.c.run_at).where(condition).order_by(jobs.c.run_at).limit(1)
        ).scalars()
        return next(iter(rows), None)


# -- periodic tasks ---------------------------------------------------------------------------


def enqueue_periodic(
    app: Flask | None = None, *, since: datetime, until: datetime | None = None
) -> list[Job]:
    """Enqueue the slots of every periodic task with ``since < slot <= until`` (default:
    now), as the workers' schedulers would: once per slot, under the same keys, and none
    of a schedule disabled now (``queue.disable_schedule()``).

    :returns: the jobs of those slots (new or already enqueued), oldest slot first.
    """
    state = _state(app)
    until = until or state.store.now()
    made: list[Job] = []
    with state.store.read() as conn:
        disabled = periodic.disabled_schedules(conn)
    for task in periodic.scheduled_tasks(state.registry):
        schedule = task.schedule
        assert schedule is not None
        if task.name in disabled:
            continue
        for slot in schedule.slots(since, until):
            made.append(periodic.enqueue_slot(state.store, task, schedule, slot))
    return sorted(made, key=lambda job: (job.run_at, job.id))


# -- assertions --------------------------------------------------------------------------------


def _jobs(state: QueueState, condition: Any, limit: int | None = None) -> list[Job]:
    query = sa.select(jobs).where(condition).order_by(jobs.c.id)
    if limit is not None:
        query = query.limit(limit)
    with state.store.read() as conn:
        return state.store.read_jobs(conn, query)


def _task_name(task: Task[Any, Any] | str) -> str:
    if isinstance(task, Task):
        return task.name
    if isinstance(task, str):
        return task
    raise TypeError(f"task must be a task or a task name, got {task!r}.")


#: What "enqueued" means here: a job yet to run, due or not, or waiting for dependencies.
_ENQUEUED = jobs.c.status.in_((JobStatus.WAITING.value, JobStatus.PENDING.value))


def enqueued(
    task: Task[Any, Any] | str | None = None,
    *,
    queue: str | None = None,
    app: Flask | None = None,
) -> list[Job]:
    """The pending jobs (due now or later) and those waiting for their dependencies,
    oldest first; only ``task``'s or ``queue``'s if given."""
    state = _state(app)
    condition: sa.ColumnElement[bool] = _ENQUEUED
    if task is not None:
        condition = sa.and_(condition, jobs.c.task == _task_name(task))
    if queue is not None:
        condition = sa.and_(condition, jobs.c.queue == queue)
    return _jobs(state, condition)


def _stored_forms(
    task: Task[Any, Any] | None, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[Sequence[Any] | None, Mapping[str, Any] | None]:
    """What a test expects, as a typed task's job stores it: values (a ``datetime``) are
    encoded by the task's annotations; stored forms (its ISO string) are kept as given."""
    codec = None if task is None else task.codec
    if codec is None:
        return args, kwargs
    with contextlib.suppress(TypeError):
        args = None if args is None else codec.encode(args, {})[0]
    with contextlib.suppress(TypeError):
        kwargs = None if kwargs is None else codec.encode((), kwargs)[1]
    return args, kwargs


def _matches(job: Job, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> bool:
    # Compare as JSON, as the job stores them: a tuple argument comes back a list.
    if args is not None and job.args != json.loads(json.dumps(list(args))):
        return False
    return kwargs is None or job.kwargs == json.loads(json.dumps(dict(kwargs)))


def _describe(state: QueueState) -> str:
    pending = _jobs(state, _ENQUEUED, limit=51)
    if not pending:
        return "No job is enqueued."
    lines = [
        f"  job {job.id}: {job.task}(args={job.args!r}, kwargs={job.kwargs!r}) "
        f"queue={job.queue!r} run_at={job.run_at.isoformat()}"
        + (" (waiting for its dependencies)" if job.status == JobStatus.WAITING else "")
        for job in pending[:50]
    ]
    more = "\n  ..." if len(pending) > 50 else ""
    return "Enqueued (pending) jobs:\n" + "\n".join(lines) + more


def _wanted(
    name: str, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, queue: str | None
) -> str:
    parts = [f"args={list(args)!r}"] if args is not None else []
    parts += [f"kwargs={dict(kwargs)!r}"] if kwargs is not None else []
    parts += [f"queue={queue!r}"] if queue is not None else []
    return f"{name}({', '.join(parts)})"


def assert_enqueued(
    task: Task[Any, Any] | str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    app: Flask | None = None,
) -> Job:
    """Fail unless an enqueued job of ``task`` (pending, or waiting for its dependencies)
    exists with these ``args``, ``kwargs`` and ``queue`` (each left out matches anything).
    Returns the oldest such job. Arguments of typed parameters may be given as values or
    in their stored forms (docs/arguments.md).

    :raises AssertionError: listing every job that is enqueued.
    """
    name = _task_name(task)
    state = _state(app)
    stored = _stored_forms(state.registry.get(name), args, kwargs)
    matching = [job for job in enqueued(name, queue=queue, app=app) if _matches(job, *stored)]
    if not matching:
        raise AssertionError(
            f"Expected a job {_wanted(name, args, kwargs, queue)} to be enqueued; "
            f"there is none.\n{_describe(state)}"
        )
    return matching[0]


def assert_not_enqueued(
    task: Task[Any, Any] | str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    app: Flask | None = None,
) -> None:
    """Fail if an enqueued job of ``task`` (pending, or waiting for its dependencies)
    exists with these ``args``, ``kwargs`` and ``queue`` (each left out matches anything),
    compared as :func:`assert_enqueued` does.

    :raises AssertionError: naming the jobs that match.
    """
    name = _task_name(task)
    state = _state(app)
    stored = _stored_forms(state.registry.get(name), args, kwargs)
    matching = [job for job in enqueued(name, queue=queue, app=app) if _matches(job, *stored)]
    if matching:
        ids = ", ".join(str(job.id) for job in matching)
        raise AssertionError(
            f"Expected no job {_wanted(name, args, kwargs, queue)} to be enqueued; "
            f"found job(s) {ids}.\n{_describe(state)}"
        )


# -- one object for a test ----------------------------------------------------------------------


class QueueTester:
    """The helpers bound to one app and one :class:`Clock`: what the ``sqlqueue``
    fixture gives a test. No app context is needed to use it."""

    def __init__(self, app: Flask, clock: Clock | None = None) -> None:
        self.app = app
        state = _state(app)
        #: Moved by :meth:`advance` and by ``drain(include_scheduled=True)``.
        self.clock = clock or Clock(source=state.store.now)

    @contextmanager
    def eager(self) -> Iterator[None]:
        """See :func:`eager`."""
        with eager(self.app):
            yield

    def drain(self, *, include_scheduled: bool = False, queues: Sequence[str] = ()) -> list[Job]:
        """See :func:`drain`; claims by this tester's clock."""
        return drain(self.app, include_scheduled=include_scheduled, clock=self.clock, queues=queues)

    def advance(self, seconds: float | timedelta) -> list[Job]:
        """Move the clock forward and enqueue the periodic slots it passed; returns
        their jobs (run them with :meth:`drain`)."""
        since = self.clock.now()
        until = self.clock.advance(seconds)
        return enqueue_periodic(self.app, since=since, until=until)

    def enqueued(
        self, task: Task[Any, Any] | str | None = None, *, queue: str | None = None
    ) -> list[Job]:
        """See :func:`enqueued`."""
        return enqueued(task, queue=queue, app=self.app)

    def assert_enqueued(
        self,
        task: Task[Any, Any] | str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
    ) -> Job:
        """See :func:`assert_enqueued`."""
        return assert_enqueued(task, args, kwargs, queue=queue, app=self.app)

    def assert_not_enqueued(
        self,
        task: Task[Any, Any] | str,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
    ) -> None:
        """See :func:`assert_not_enqueued`."""
        assert_not_enqueued(task, args, kwargs, queue=queue, app=self.app)


# -- pytest plugin ---------------------------------------------------------------------------

# The helpers above work without pytest; only the fixtures need it.
if importlib.util.find_spec("pytest") is not None:
    import pytest

    @pytest.fixture
    def sqlqueue_app(request: pytest.FixtureRequest) -> Flask:
        """The app under test: your ``app`` fixture by default. Override this fixture
        to name another one."""
        try:
            app = request.getfixturevalue("app")
        except pytest.FixtureLookupError:
            raise pytest.UsageError(
                "flask_sqlqueue.testing needs your app: define an `app` fixture, or a "
                "`sqlqueue_app` fixture that returns it."
            ) from None
        if not isinstance(app, Flask):
            raise pytest.UsageError(f"The `app` fixture must return a Flask app, got {app!r}.")
        return app

    @pytest.fixture
    def sqlqueue(sqlqueue_app: Flask) -> QueueTester:
        """A :class:`QueueTester` on the app: ``drain()``, ``advance()``,
        ``assert_enqueued()``, ``assert_not_enqueued()``, ``eager()``, ``clock``."""
        return QueueTester(sqlqueue_app)

    @pytest.fixture
    def sqlqueue_eager(sqlqueue: QueueTester) -> Iterator[QueueTester]:
        """Eager mode for the whole test: every ``.enqueue()`` runs its job at once."""
        with sqlqueue.eager():
            yield sqlqueue

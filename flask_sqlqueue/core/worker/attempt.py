"""One attempt of a claimed job: the :class:`Attempt` made at its claim, and the
:class:`Runner` that runs its task and says how it ended.

The runner runs a task on the calling job thread, or in a child process when the task is
isolated (core/isolation.py); it keeps the attempt's ``current_job``, app context,
timeout and cancellation. It writes nothing about the outcome: it returns it as a value
(:data:`Outcome`), and core/worker/outcomes.py records it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa

from ...exceptions import NewerVersion
from ...exceptions import Snooze
from ...exceptions import UpcastError
from .. import signals
from .. import transitions
from ..aio import run_to_end
from ..context import JobContext
from ..context import _current
from ..isolation import Isolation
from ..isolation import RuntimeLoader
from ..jobs import ClaimedJob
from ..payload import decode_call
from ..tasks import Task
from .settings import WorkerOptions

if TYPE_CHECKING:
    from ..store import Store

#: Seconds a job written for a later version of its task than this worker's waits
#: before a worker looks at it again (docs/versions.md).
NEWER_VERSION_WAIT = 30.0

log = logging.getLogger("flask_sqlqueue.worker")


def job_label(job_id: int, task: str, attempt: int, max_attempts: int, key: str | None) -> str:
    """The prefix of every log line about a job."""
    text = f"job={job_id} task={task} attempt={attempt}/{max_attempts}"
    return text if key is None else f"{text} key={key}"


@dataclass(frozen=True, slots=True, eq=False)
class Attempt:
    """One attempt of a claimed job, made once per claim: what each step from the claim
    to the recorded outcome needs, and the same for all of them."""

    #: The claim's row; its ``claim_token`` fences every write about this attempt.
    job: ClaimedJob

    @property
    def label(self) -> str:
        """The prefix of every log line about the attempt. Built when a line is: most
        attempts of a worker logging at INFO write one line, at WARNING none."""
        job = self.job
        return job_label(job.id, job.task, job.attempts, job.max_attempts, job.idempotency_key)

    @property
    def extra(self) -> dict[str, Any]:
        """The ``extra`` of those log records (what :mod:`.logcontext` puts on the app's
        own), built with each line as :attr:`label` is."""
        job = self.job
        return {
            "sqlqueue_job_id": job.id,
            "sqlqueue_task": job.task,
            "sqlqueue_attempt": job.attempts,
            "sqlqueue_idempotency_key": job.idempotency_key,
            "sqlqueue_queue": job.queue,
        }

    @property
    def token(self) -> str:
        """The claim token of this attempt."""
        return self.job.claim_token

    def context(self, store: Store, worker_id: str) -> JobContext:
        """A fresh ``current_job`` for this attempt (a task's, or a signal's ``job``)."""
        job = self.job
        return JobContext(
            id=job.id,
            task=job.task,
            queue=job.queue,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            idempotency_key=job.idempotency_key,
            worker_id=worker_id,
            claim_token=job.claim_token,
            store=store,
            snoozes=job.snoozes,
        )


# -- how an attempt ended -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Returned:
    """The task returned ``value``, ``elapsed`` seconds after it started."""

    value: Any
    elapsed: float


@dataclass(frozen=True, slots=True)
class Raised:
    """The task of ``task`` raised ``error`` (in a child: an ``AttemptFailed`` form)."""

    error: BaseException
    task: Task[Any, Any]


@dataclass(frozen=True, slots=True)
class NotRun:
    """The task never started: its payload does not decode, or it is unknown here."""

    kind: str
    message: str
    dead: bool


@dataclass(frozen=True, slots=True)
class Expired:
    """The job's expiry (``expires_at``) passed before this attempt could start: the task
    is not run, and the job ends ``cancelled`` (docs/expiry.md)."""

    expires_at: datetime


#: How an attempt ended, as :meth:`Runner.run` returns it.
Outcome = Returned | Raised | NotRun | Expired


class Runner:
    """Runs attempts: on the calling job thread, or in a child process when isolated.

    Holds no lock of its own: each attempt runs on one thread, and the child processes
    (:class:`~flask_sqlqueue.core.isolation.Isolation`) guard their own pool.
    """

    def __init__(
        self,
        store: Store,
        registry: Mapping[str, Task[Any, Any]],
        options: WorkerOptions,
        job_context: Callable[[], AbstractContextManager[Any]],
        loader: RuntimeLoader | None,
        *,
        worker_id: Callable[[], str],
        log_db_error: Callable[[str, Exception], None],
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._registry = registry
        self._options = options
        self._job_context = job_context
        self._worker_id = worker_id
        self._log_db_error = log_db_error
        # Child processes for isolated attempts (see isolation.py); started when needed.
        self._isolation = (
            None
            if loader is None
            else Isolation(
                loader,
                max_jobs=options.max_jobs_per_child or None,
                max_memory=options.max_memory_per_child or None,
                spares=options.spare_children,
            )
        )

    def run(self, attempt: Attempt) -> Outcome:
        """Run ``attempt``'s task in its own app context and ``current_job``; say how it
        ended. Never raises for what the task does, not even ``SystemExit``."""
        job = attempt.job
        # Checked as the attempt starts, not at the claim: a job claimed ahead may wait.
        expires_at = job.expires_at
        if expires_at is not None and (self._clock or self._store.now)() >= expires_at:
            return Expired(expires_at)
        task = self._registry.get(job.task)
        try:
            args, kwargs, version = decode_call(job.payload)
        except ValueError as exc:
            log.error(
                "%s: malformed payload, job is dead: %s", attempt.label, exc, extra=attempt.extra
            )
            return NotRun("MalformedPayload", str(exc), dead=True)
        if task is None:  # cannot happen for claimed rows; never drop the job if it does
            return NotRun("UnknownTask", job.task, dead=False)
        try:
            args, kwargs = task.upcast(version, args, kwargs)
        except NewerVersion as exc:
            # A producer deployed ahead of this worker: the job waits for a newer worker,
            # spending no attempt (a snooze, never started here).
            log.warning("%s: not run: %s", attempt.label, exc, extra=attempt.extra)
            return Raised(Snooze(NEWER_VERSION_WAIT, str(exc)), task)
        except UpcastError as exc:
            # Replayable once the upcaster is fixed: the stored row is never rewritten.
            log.error("%s: job is dead: %s", attempt.label, exc, extra=attempt.extra)
            return NotRun("UpcastError", str(exc), dead=True)
        try:
            values = task.decode(args, kwargs)
        except Exception as exc:  # a typed argument edited into nonsense, say
            log.error(
                "%s: malformed arguments, job is dead: %s", attempt.label, exc, extra=attempt.extra
            )
            return NotRun("MalformedPayload", str(exc), dead=True)
        ctx = attempt.context(self._store, self._worker_id())
        # At DEBUG: the outcome's line says the rest, and with a line per start a
        # worker of short jobs spent a quarter of its time logging (docs/workers.md).
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: started", attempt.label, extra=attempt.extra)
        started = time.monotonic()
        ended: tuple[bool, Any] | None = None  # (returned, its value or the error)
        try:
            with self._job_context():
                reset = _current.set(ctx)
                try:
                    # The hooks (core/hooks.py) see the task's error, if any, as it leaves.
                    with self._store.hooks.around_attempt(ctx):
                        signals.send(signals.job_started, self._store.signal_sender, job=ctx)
                        ended = (True, self._call(task, ctx, attempt.label, (args, kwargs), values))
                except BaseException as exc:  # a task's SystemExit must not end the worker
                    ended = (False, exc)
                finally:
                    _current.reset(reset)
                    ctx.close()  # its last progress report lands before the outcome
        except Exception as exc:
            if ended is None:
                ended = (False, exc)
            else:
                log.warning(
                    "%s: job context failed on exit: %r", attempt.label, exc, extra=attempt.extra
                )
        elapsed = time.monotonic() - started
        assert ended is not None
        returned, value = ended
        return Returned(value, elapsed) if returned else Raised(value, task)

    # -- threads and child processes (isolation.py) ---------------------------------------------

    def isolated(self, task: Task[Any, Any]) -> bool:
        return self._isolation is not None and (task.isolate or self._options.processes > 0)

    def mode(self) -> str:
        """How this worker runs jobs, for its start-up log line."""
        if self._options.processes:
            return f"processes ({self._options.processes} children)"
        isolated = sorted(name for name, task in self._registry.items() if self.isolated(task))
        return f"threads, isolated: {','.join(isolated)}" if isolated else "threads"

    def start(self) -> None:
        """Start the children of a process-mode worker up front (a child that cannot load
        the app stops the worker here, with the child's error), and say which timeouts
        this worker cannot enforce."""
        if self._isolation is not None:
            self._isolation.reopen()
            if self._options.processes:
                self._isolation.prestart(self._options.processes + self._options.spare_children)
        soft = sorted(
            name
            for name, task in self._registry.items()
            if task.timeout is not None and not self.isolated(task)
        )
        if soft:
            log.warning(
                "tasks %s have a timeout but run on threads here, which cannot be stopped: "
                "an overrun is only logged. Use isolate=True or `flask queue work --processes N` "
                "to enforce it.",
                ", ".join(soft),
            )
        for name, task in self._registry.items():
            if task.isolate and self._isolation is None:
                log.warning(
                    "task %s: isolate=True, but this worker has no loader; it runs on a thread",
                    name,
                )

    def close(self) -> None:
        """Stop the child processes (their jobs were handed back first)."""
        if self._isolation is not None:
            self._isolation.close()

    def _call(
        self,
        task: Task[Any, Any],
        ctx: JobContext,
        label: str,
        stored: tuple[list[Any], dict[str, Any]],
        values: tuple[list[Any], dict[str, Any]],
    ) -> Any:
        """Run one attempt: in a child process when isolated, else on this thread. A child
        gets the ``stored`` arguments, plain JSON, and decodes them itself; a thread calls
        the task with their ``values``."""
        if self.isolated(task):
            assert self._isolation is not None
            return self._isolation.run(
                ctx, *stored, task.timeout, functools.partial(self._cancel_asked, ctx.id)
            )
        args, kwargs = values
        if task.timeout is None:
            return run_to_end(task.fn, args, kwargs)
        # A thread cannot be stopped: an overrun is reported, and the outcome recorded
        # when the task returns (see docs/timeouts.md).
        timer = threading.Timer(
            task.timeout,
            log.error,
            (
                "%s: still running after its timeout of %gs; a thread worker cannot stop it",
                label,
                task.timeout,
            ),
        )
        timer.name = f"sqlqueue-timeout-{ctx.id}"
        timer.daemon = True
        timer.start()
        try:
            return run_to_end(task.fn, args, kwargs)
        finally:
            timer.cancel()

    def _cancel_asked(self, job_id: int) -> bool:
        try:
            with self._store.read() as conn:
                return bool(transitions.cancel_requests(conn, [job_id]))
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("cancel check", exc)
            return False

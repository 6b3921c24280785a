"""The worker: claims jobs, runs them on threads, records how each attempt ended.

One dispatcher loop claims as many jobs as there are free threads, in one statement,
and hands them to job threads. The successes that finished since its last claim are
recorded in the same transaction as its next one, so one commit (one fsync on SQLite)
serves both. Every transaction is short: a claim with its completions, a failure; none
is open while a task runs. A heartbeat thread keeps the worker's row
alive and takes back jobs of workers that stopped heartbeating.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import queue as queue_module
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from dataclasses import replace
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from ..bounds import time_after
from ..config import default
from ..exceptions import ClaimLost
from ..exceptions import ConfigurationError
from ..exceptions import DatabaseFileChanged
from ..exceptions import JobCancelled
from ..exceptions import PayloadError
from ..exceptions import PermanentFailure
from ..exceptions import ResultTooLarge
from ..exceptions import Retry
from . import lifecycle
from . import logcontext
from . import periodic
from . import queries
from . import retention
from . import signals
from .aio import run_to_end
from .claim import ClaimRequest
from .claim import claim
from .claim import claim_job
from .context import JobContext
from .context import _current
from .isolation import AttemptFailed
from .isolation import Isolation
from .isolation import RuntimeLoader
from .liveness import HeartbeatWatch
from .models import JobStatus
from .payload import decode_payload
from .payload import encode_value
from .store import Store
from .store import error_reason
from .tasks import Task

log = logging.getLogger("flask_sqlqueue.worker")

#: How long a claim waits for jobs claimed less than this long ago to finish, so that
#: their outcomes share its commit. Short jobs then finish in batches of the worker's
#: concurrency instead of one commit per job or two; a job running longer than this is
#: not waited for.
LINGER = 0.001
#: Seconds between two checks for pending jobs that no live worker claims.
COVERAGE_INTERVAL = 300.0

#: An outcome's write that still fails after this many heartbeats went through is taken
#: as refused, and replaced by a short error (the database answers, so the statement is
#: at fault: MariaDB drops the connection of one over ``max_allowed_packet``, which looks
#: like a lost connection).
REFUSED_AFTER = 3
#: The error type recorded when the database refuses to store an attempt's outcome.
REFUSED_KIND = "OutcomeNotStored"
#: The error type recorded when a task returns more JSON than the database stores.
TOO_LARGE_KIND = "ResultTooLarge"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs. Every field has the CLI flag of the same name, whose default
    is the field's (``stale_after``'s is ``SQLQUEUE_STALE_AFTER``'s)."""

    #: Queues to serve; empty means every queue.
    queues: tuple[str, ...] = ()
    #: Job threads in this process.
    concurrency: int = 1
    #: Seconds between polls when idle (an enqueue in this process wakes it at once).
    poll_interval: float = 1.0
    #: Seconds without a heartbeat after which a worker's running jobs are rescued.
    stale_after: float = default("SQLQUEUE_STALE_AFTER")
    #: Seconds to let running jobs finish after a stop is asked for.
    grace: float = 30.0
    #: Run every job in a child process, this many at once (0: jobs run on threads).
    #: Needs a worker given a ``loader``; ``concurrency`` then follows it.
    processes: int = 0

    def __post_init__(self) -> None:
        if type(self.processes) is not int or self.processes < 0:
            raise ConfigurationError(f"processes must be 0 or more, got {self.processes!r}.")
        if self.processes:
            if self.concurrency not in (1, self.processes):
                raise ConfigurationError(
                    "Give processes or concurrency, not both: with processes=N the worker "
                    "runs N jobs at once, each in a child process."
                )
            object.__setattr__(self, "concurrency", self.processes)
        if type(self.concurrency) is not int or self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be 1 or more, got {self.concurrency!r}.")
        for name in ("poll_interval", "stale_after", "grace"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be zero or more seconds, got {value!r}.")
        if self.poll_interval <= 0:
            raise ConfigurationError("poll_interval must be more than zero seconds.")

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, min(self.stale_after / 4, 15.0))


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class _Success:
    """A finished attempt whose outcome waits to be recorded."""

    row: Any
    label: str
    extra: dict[str, Any]
    value: Any
    result: str | None  # ``value`` as stored JSON
    elapsed: float


def _nothing(_result: Any) -> None:
    return None


@dataclass(eq=False, slots=True)
class _Write:
    """The fenced write that records an attempt's outcome, and what follows it."""

    label: str
    extra: dict[str, Any]
    #: The write; what it returns is falsy when the claim was lost (nothing written).
    apply: Callable[[Any], Any]
    #: Called with what ``apply`` returned once it is recorded: the log line, signals.
    recorded: Callable[[Any], None] = _nothing
    #: The short write that ends the job instead if the database refuses this one;
    #: ``None`` on a write that is one already.
    fallback: Callable[[BaseException], _Write] | None = None
    #: Times it failed for a fault that may pass; it is retried after each heartbeat.
    failures: int = 0


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Successes just recorded (``done``: the ids completed), for a job thread to report."""

    batch: list[_Success]
    done: set[int]


def job_label(job_id: int, task: str, attempt: int, max_attempts: int, key: str | None) -> str:
    """The prefix of every log line about a job."""
    text = f"job={job_id} task={task} attempt={attempt}/{max_attempts}"
    return text if key is None else f"{text} key={key}"


def _job_extra(row: Any) -> dict[str, Any]:
    return {
        "sqlqueue_job_id": row.id,
        "sqlqueue_task": row.task,
        "sqlqueue_attempt": row.attempts,
        "sqlqueue_idempotency_key": row.idempotency_key,
    }


class Worker:
    """Runs the jobs of the tasks in ``registry`` from ``store``.

    :param job_context: called once per job; the job runs inside what it returns
        (the Flask extension passes ``app.app_context``).
    :param clock: returns the current aware UTC time (default: the database's clock).
    :param rng: the source of backoff jitter; injected for tests.
    """

    def __init__(
        self,
        store: Store,
        registry: Mapping[str, Task[Any, Any]],
        options: WorkerOptions | None = None,
        *,
        job_context: Callable[[], AbstractContextManager[Any]] | None = None,
        clock: Callable[[], datetime] | None = None,
        rng: random.Random | None = None,
        loader: RuntimeLoader | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        # The claim filters on these on every poll: sort them once, not per claim.
        self._task_names = tuple(sorted(registry))
        # Concurrency and rate limits, enforced by the claim (see claim.py).
        self._limits = {
            name: task.limits for name, task in registry.items() if task.limits is not None
        }
        self.options = options or WorkerOptions(stale_after=store.settings.stale_after)
        self.job_context = job_context or nullcontext
        if self.options.processes and loader is None:
            raise ConfigurationError(
                "processes=N runs jobs in child processes, which need a loader to build the "
                "app in each child; use `flask queue work --processes N`."
            )
        # Child processes for isolated attempts (see isolation.py); started when needed.
        self._isolation = None if loader is None else Isolation(loader)
        self.clock = clock or store.now
        self.rng = rng or random.Random()
        self.retention = retention.RetentionPolicy.from_settings(store.settings)
        logcontext.install()  # the app's log lines inside a task name the job
        # The first round comes a random part of the interval in, so workers started
        # together do not all prune at once.
        self._next_prune = time.monotonic() + random.uniform(0, store.settings.prune_interval)
        self.id = _worker_id()
        self._stopping = threading.Event()
        self._exited = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[int, str] = {}  # job id -> claim token
        self._last_claim: tuple[float, list[int]] = (0.0, [])  # (time.monotonic(), its ids)
        self._writer = store.writer()  # the claims' own connection
        self._registered = False
        self._last_heartbeat_ok = time.monotonic()
        # Other machines' heartbeats as this worker saw them (see rescue()).
        self._watch = HeartbeatWatch()
        # Why run() must fail once it returns: nothing can be written any more.
        self._fatal: DatabaseFileChanged | None = None
        self._paused = False
        self._db_error_logged = 0.0
        self._next_coverage = 0.0
        self._warned_unserved: set[str] = set()
        # Successful outcomes waiting for the next claim's transaction; only while run()
        # runs (``_batching``). Their ids stay running, holding a thread's slot, until
        # recorded, so a worker never has more running jobs than threads.
        self._batching = False
        self._done: list[_Success] = []
        self._recording: set[int] = set()
        # Outcomes a database fault kept from being recorded, retried after each heartbeat.
        self._unrecorded: list[_Write] = []

    # -- public API -----------------------------------------------------------------------

    def run_once(self) -> bool:
        """Claim one eligible job and run it in this thread; ``False`` if there was none."""
        self._register()
        rows = self._claim(1)
        for row in rows:
            self._execute(row)
        return bool(rows)

    def run(self, *, burst: bool = False) -> None:
        """Work until :meth:`stop` is called, or with ``burst`` until nothing is eligible."""
        self._check_tasks()
        self._start_children()
        self._fatal = None
        self._register()
        inbox: queue_module.SimpleQueue[Any] = queue_module.SimpleQueue()
        threads = [
            threading.Thread(
                target=self._job_thread, args=(inbox,), name=f"sqlqueue-job-{n}", daemon=True
            )
            for n in range(self.options.concurrency)
        ]
        # Heartbeats go on through the grace period, until run() is done with every job.
        self._exited.clear()
        heart = threading.Thread(
            target=self._heartbeat_loop, name="sqlqueue-heartbeat", daemon=True
        )
        listener = threading.Thread(
            target=self.store.ops.listen,
            args=(self.store.engine, self._wake, self._stopping),
            name="sqlqueue-listen",
            daemon=True,
        )
        for thread in (*threads, heart, listener):
            thread.start()
        with self._lock:
            self._batching = True
        # Every (non-burst) worker schedules periodic tasks; the database keeps each slot
        # to one job, so there is no leader to lose.
        scheduler = None if burst else self._scheduler().start(self._stopping)
        self.store.add_waiter(self._wake)
        log.info(
            "worker %s started: queues=%s concurrency=%d mode=%s tasks=%s",
            self.id,
            ",".join(self.options.queues) or "*",
            self.options.concurrency,
            self._mode(),
            ",".join(self._task_names),
        )
        self._warn_unserved()
        try:
            self._dispatch(inbox, burst)
        finally:
            self.store.remove_waiter(self._wake)
            self._stopping.set()
            for _ in threads:
                inbox.put(None)
            if self._fatal is None:  # else nothing can be written: running jobs are lost
                self._finish_running()
                self._flush_done(last=True)  # every finished job's outcome is written
            if self._isolation is not None:  # after the hand-back: their jobs are released
                self._isolation.close()
            self._exited.set()
            heart.join(timeout=5)
            listener.join(timeout=5)
            if scheduler is not None:
                scheduler.join(timeout=5)
            if self._fatal is None:
                self._record_late()
            self.close()
        if self._fatal is not None:
            raise self._fatal

    def stop(self) -> None:
        """Claim nothing more; :meth:`run` returns once running jobs finish or the grace ends."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def close(self) -> None:
        """Mark this worker's row stopped: it is no longer alive."""
        self._writer.close()
        if self._registered and self._fatal is None:
            try:
                self.store.run_write(
                    lambda conn: lifecycle.unregister_worker(conn, self.id, self.clock())
                )
            except sa.exc.SQLAlchemyError:
                log.warning("worker %s could not remove its row; it will expire", self.id)
            self._registered = False

    # -- dispatching ------------------------------------------------------------------------

    def _check_tasks(self) -> None:
        if not self.registry:
            raise ConfigurationError(
                "No tasks are registered, so this worker could never run a job; "
                "import the modules that define your tasks in the app factory."
            )

    def _register(self) -> None:
        if self._registered:
            return
        now = self.clock()
        self.store.run_write(
            lambda conn: lifecycle.register_worker(
                conn,
                self.id,
                socket.gethostname(),
                os.getpid(),
                self.options.queues,
                self.options.concurrency,
                now,
                boot=self.store.boot,
                tasks=self._task_names,
            )
        )
        self._registered = True
        self._last_heartbeat_ok = time.monotonic()

    def _warn_unserved(self) -> None:
        """Log pending jobs that no live worker, this one included, would claim; each
        (queue, task) once per worker, checked at start and then every few minutes."""
        self._next_coverage = time.monotonic() + COVERAGE_INTERVAL
        try:
            fresh = self.store.heartbeat_fresh(self.options.stale_after, self.clock())
            with self.store.read() as conn:
                cover = queries.coverage(conn, fresh)
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("the check for unserved jobs", exc)
            return
        for what, fix in cover.warnings(self.registry):
            if what not in self._warned_unserved:
                self._warned_unserved.add(what)
                log.warning("%s; %s", what, fix)

    def _scheduler(self) -> periodic.Scheduler:
        return periodic.Scheduler(self.store, self.registry, clock=self.clock)

    def _dispatch(self, inbox: queue_module.SimpleQueue[Any], burst: bool) -> None:
        poll = self.options.poll_interval
        while not self._stopping.is_set():
            claiming = self._may_claim()
            self._wake.clear()
            with self._lock:
                batch, self._done = self._done, []
                # The slots of the jobs recorded now are free once the claim commits.
                free = self.options.concurrency - len(self._running) + len(batch)
                # Read before claiming (and after clearing the wake-up): a job that ends
                # after an empty claim may have gone back to pending, eligible now, so a
                # burst must claim once more.
                idle = not self._running
            if not claiming:
                self._record_successes(batch)
                self._stopping.wait(min(poll, 1.0))
                continue
            if free <= 0:
                self._wake.wait(poll)
                continue
            if self._linger():
                with self._lock:
                    more, self._done = self._done, []
                batch += more
                free += len(more)
            try:
                rows, done = self._cycle(batch, free)
            except Exception as exc:
                # Never let a database fault (or a row it cannot read) end the worker:
                # the claim rolled back, so log, back off and try again.
                self._log_db_error("claim", exc)
                self._stopping.wait(min(poll, 1.0))
                continue
            for row in rows:
                inbox.put(row)
            if batch:
                # Logged and signalled by a job thread, while this one claims again.
                inbox.put(_Recorded(batch, done))
            if rows or batch:
                continue
            if burst and idle:
                return
            self._wake.wait(poll)

    def _linger(self) -> bool:
        """Wait up to :data:`LINGER` for the jobs claimed just now to finish too; ``True``
        if any did."""
        waited = False
        claimed_at, ids = self._last_claim
        while True:
            remaining = claimed_at + LINGER - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return waited
            with self._lock:
                if all(i in self._recording or i not in self._running for i in ids):
                    return waited
            self._wake.clear()
            self._wake.wait(remaining)
            waited = True

    def _may_claim(self) -> bool:
        if time.monotonic() - self._last_heartbeat_ok > self.options.stale_after:
            # Others may have declared us dead and rescued our jobs: claim nothing
            # until the heartbeat is back (under a new id if our row was removed).
            if not self._paused:
                log.error("worker %s cannot heartbeat; it stops claiming", self.id)
                self._paused = True
            return False
        if self._paused:
            log.warning("worker %s heartbeats again; it resumes claiming", self.id)
            self._paused = False
        return True

    def _claim(self, limit: int) -> list[Any]:
        """One claim outside :meth:`run`'s loop, which alone keeps its connection."""
        try:
            rows, _ = self._cycle([], limit)
        finally:
            self._writer.close()
        return rows

    def _cycle(self, batch: list[_Success], limit: int) -> tuple[list[Any], set[int]]:
        """Record the successes in ``batch`` and claim up to ``limit`` jobs, in one
        transaction. Returns the claimed rows and the ids of the jobs recorded completed
        (the others had lost their claim)."""
        token = uuid.uuid4().hex
        items = [(s.row.id, s.row.claim_token, s.result) for s in batch]
        try:
            for attempt in range(3):
                now = self.clock()
                try:
                    with self._writer.begin() as conn:
                        done = lifecycle.complete_many(conn, items, now) if items else set()
                        request = ClaimRequest(
                            self.id, token, now, limit, self.options.queues, self._task_names
                        )
                        rows = claim(conn, self.store.ops, request, self._limits)
                    break
                except sa.exc.DBAPIError as exc:
                    # The database rolled the whole transaction back; nothing was taken.
                    # Claims lock limit rows in one order, so this is rare: retry at once.
                    if attempt == 2 or not self.store.ops.is_deadlock(exc):
                        raise
        except Exception:
            # Nothing was written: record the outcomes on their own (that retries while
            # the database is away), and let the caller deal with the failed claim.
            self._record_successes(batch)
            raise
        with self._lock:
            self._release_slots(batch)
            for row in rows:
                self._running[row.id] = token
        self._last_claim = (time.monotonic(), [row.id for row in rows])
        return rows, done

    def _job_thread(self, inbox: queue_module.SimpleQueue[Any]) -> None:
        while True:
            row = inbox.get()
            if row is None:
                return
            if isinstance(row, _Recorded):
                self._report(row.batch, row.done)
                continue
            try:
                self._execute(row)
            except Exception:
                # Never lose a job thread, nor strand the job as running while this worker
                # heartbeats (no one would rescue it): hand it back to run again.
                log.exception("job=%s: unexpected error while recording its outcome", row.id)
                self._hand_back(row, sys.exc_info()[1])
            finally:
                self._wake.set()

    def _hand_back(self, row: Any, error: BaseException | None) -> None:
        """Count the attempt of a job whose outcome could not be recorded as failed, so it
        runs again (or goes dead when its attempts are spent, so a bug cannot loop)."""
        now = self.clock()
        text = f"outcome not recorded: {error!r}"
        record = lifecycle.error_record(row.attempts, "OutcomeNotRecorded", text, "", self.id, now)
        retry_at = None if row.attempts >= row.max_attempts else now

        def apply(conn: Any) -> str | None:
            return lifecycle.fail(
                conn, row.id, row.claim_token, record, retry_at, now, fits=self._fits
            )

        def recorded(status: str) -> None:
            log.warning("job=%s: outcome not recorded; the job is now %s", row.id, status)

        label = job_label(row.id, row.task, row.attempts, row.max_attempts, row.idempotency_key)
        try:
            self._finish(_Write(label, _job_extra(row), apply, recorded))
        except Exception:
            log.exception("job=%s could not be handed back; it stays running", row.id)

    def _finish_running(self) -> None:
        """Wait up to the grace period for running jobs, then hand back the rest."""
        deadline = time.monotonic() + self.options.grace
        while time.monotonic() < deadline:
            self._flush_done()
            with self._lock:
                if not self._running:
                    return
            time.sleep(0.05)
        with self._lock:
            unfinished = {i: t for i, t in self._running.items() if i not in self._recording}
        for job_id, token in unfinished.items():
            now = self.clock()
            try:
                released = self.store.run_write(
                    functools.partial(lifecycle.release, job_id=job_id, token=token, now=now)
                )
            except sa.exc.SQLAlchemyError as exc:
                log.error("job=%s could not be released (%s); it will be rescued", job_id, exc)
                continue
            if released:
                log.warning("job=%s released unfinished at shutdown; it will run again", job_id)

    # -- running one job ----------------------------------------------------------------------

    def _execute(self, row: Any) -> None:
        label = job_label(row.id, row.task, row.attempts, row.max_attempts, row.idempotency_key)
        extra = _job_extra(row)
        try:
            self._run_and_record(row, label, extra)
        finally:
            with self._lock:
                if row.id not in self._recording:  # else popped once recorded
                    self._running.pop(row.id, None)

    def _run_and_record(self, row: Any, label: str, extra: dict[str, Any]) -> None:
        task = self.registry.get(row.task)
        try:
            args, kwargs = decode_payload(row.payload)
        except ValueError as exc:
            log.error("%s: malformed payload, job is dead: %s", label, exc, extra=extra)
            self._finish(
                self._failure(row, label, extra, "MalformedPayload", str(exc), "", dead=True)
            )
            return
        if task is None:  # cannot happen for claimed rows; never drop the job if it does
            self._finish(self._failure(row, label, extra, "UnknownTask", row.task, "", dead=False))
            return
        ctx = self._context(row)
        log.info("%s: started", label, extra=extra)
        started = time.monotonic()
        outcome: tuple[str, Any] | None = None
        try:
            with self.job_context():
                reset = _current.set(ctx)
                try:
                    signals.send(signals.job_started, self.store.signal_sender, job=ctx)
                    outcome = ("ok", self._call(task, ctx, label, args, kwargs))
                except BaseException as exc:  # a task's SystemExit must not end the worker
                    outcome = ("error", exc)
                finally:
                    _current.reset(reset)
                    ctx.close()  # its last progress report lands before the outcome
        except Exception as exc:
            if outcome is None:
                outcome = ("error", exc)
            else:
                log.warning("%s: job context failed on exit: %r", label, exc, extra=extra)
        elapsed = time.monotonic() - started
        assert outcome is not None
        kind, value = outcome
        if kind == "ok":
            self._record_success(row, label, extra, value, elapsed)
            return
        error: BaseException = value
        if isinstance(error, ClaimLost):
            log.warning("%s: lost its claim while running; nothing recorded", label, extra=extra)
            return
        if isinstance(error, JobCancelled):
            self._record_cancelled(row, label, extra)
            return
        text = lifecycle.format_error(error)
        kind_name = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
        if isinstance(error, AttemptFailed):  # it failed in a child: record the child's error
            text, kind_name = error.text, error.kind
        if isinstance(error, PermanentFailure):
            dead, delay = True, 0.0
        elif isinstance(error, Retry):
            dead, delay = False, error.delay
        else:
            dead, delay = False, self._backoff(row, task)
        write = self._failure(
            row, label, extra, kind_name, str(error), text, dead=dead, delay=delay, error=error
        )
        self._finish(write)

    def _backoff(self, row: Any, task: Task[Any, Any]) -> float:
        if task.backoff is not None:
            try:
                delay = task.backoff(row.attempts)
                seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
                if math.isfinite(seconds) and seconds >= 0:
                    return seconds
                raise ValueError(f"backoff returned {delay!r}")
            except Exception as exc:
                log.error("task %s: backoff failed (%r); using the default", row.task, exc)
        return self.store.backoff.delay(row.attempts, self.rng)

    def _record_success(
        self, row: Any, label: str, extra: dict[str, Any], value: Any, elapsed: float
    ) -> None:
        try:
            result = None if value is None else encode_value(value)
        except PayloadError as exc:
            # The work is done: re-running it to store a result would repeat its effects.
            log.warning("%s: result not stored: %s", label, exc, extra=extra)
            result = None
        size = None if result is None else self.store.value_size(result)
        if size is not None:
            # Its write could never succeed. The work is done, and another attempt would
            # repeat it and most likely return as much: the job is dead (docs/outcomes.md).
            error = ResultTooLarge(row.task, size, self.store.value_limit)
            self._finish(
                self._failure(
                    row, label, extra, TOO_LARGE_KIND, str(error), "", dead=True, error=error
                )
            )
            return
        success = _Success(row, label, extra, value, result, elapsed)
        with self._lock:
            if self._batching:
                # Recorded with the next claim, together with the others that finish
                # meanwhile; until then the job stays running in the database (a crash
                # re-runs it: at least once).
                self._recording.add(row.id)
                self._done.append(success)
                return
        self._finish(self._success_write(success))

    def _success_write(self, success: _Success) -> _Write:
        row = success.row
        write = functools.partial(
            lifecycle.complete,
            job_id=row.id,
            token=row.claim_token,
            result=success.result,
            now=self.clock(),
        )

        def refused(exc: BaseException) -> _Write:
            reason = f"the database refused to store the result: {error_reason(exc)}"
            # The work is done, as with a result too large: the job is dead.
            short = self._failure(
                row, success.label, success.extra, REFUSED_KIND, reason, "", dead=True, error=exc
            )
            return replace(short, fallback=None)

        return _Write(
            success.label, success.extra, write, lambda _: self._succeeded(success), refused
        )

    def _succeeded(self, success: _Success) -> None:
        log.info("%s: completed in %.3fs", success.label, success.elapsed, extra=success.extra)
        self._emit(
            signals.job_succeeded, success.row, result=success.value, duration=success.elapsed
        )

    def _record_successes(self, batch: list[_Success]) -> None:
        """Record successful outcomes in one transaction, each fenced by its own claim."""
        if not batch:
            return
        try:
            self._write_successes(batch)
        except Exception:
            log.exception("recording %d outcome(s) failed unexpectedly", len(batch))
            for s in batch:
                self._hand_back(s.row, sys.exc_info()[1])
        finally:
            with self._lock:
                self._release_slots(batch)
            self._wake.set()

    def _flush_done(self, *, last: bool = False) -> None:
        """Record the successes waiting for a claim (at shutdown, when none comes);
        with ``last``, later ones are recorded one by one as they finish."""
        with self._lock:
            batch, self._done = self._done, []
            if last:
                self._batching = False
        self._record_successes(batch)

    def _release_slots(self, batch: list[_Success]) -> None:
        # Their threads' slots are free only once recorded, so the worker never holds
        # more running jobs than it has threads. Called with the lock held.
        for s in batch:
            self._recording.discard(s.row.id)
            self._running.pop(s.row.id, None)

    def _write_successes(self, batch: list[_Success]) -> None:
        now = self.clock()
        items = [(s.row.id, s.row.claim_token, s.result) for s in batch]
        try:
            done = self.store.run_write(
                lambda conn: lifecycle.complete_many(conn, items, now),
                within=self.options.stale_after,
            )
        except sa.exc.SQLAlchemyError as exc:
            retry = self.store.may_retry(exc)
            for s in batch:
                if retry:
                    self._retry_later(self._success_write(s), exc)
                else:
                    # Refused: one by one, each of the others is recorded and the
                    # refused one ends with a short error.
                    self._finish(self._success_write(s))
            return
        self._report(batch, done)

    def _report(self, batch: list[_Success], done: set[int]) -> None:
        for s in batch:
            if s.row.id in done:
                self._succeeded(s)
            else:
                _log_claim_lost(s.label, s.extra)

    def _failure(
        self,
        row: Any,
        label: str,
        extra: dict[str, Any],
        kind: str,
        message: str,
        text: str,
        *,
        dead: bool = False,
        delay: float = 0.0,
        error: BaseException | None = None,
    ) -> _Write:
        """The write of a failed attempt: the job goes back to pending after ``delay``
        (dead once its attempts are spent, or with ``dead``)."""
        now = self.clock()
        record = lifecycle.error_record(row.attempts, kind, message, text, self.id, now)
        spent = row.attempts >= row.max_attempts
        # time_after: a delay past the latest storable time (a task's backoff= said so)
        # waits until that time instead of failing to record.
        retry_at = None if dead or spent else time_after(now, delay)

        def apply(conn: Any) -> str | None:
            return lifecycle.fail(
                conn, row.id, row.claim_token, record, retry_at, now, fits=self._fits
            )

        def recorded(status: str) -> None:
            # The stored, escaped message: a lone surrogate would break UTF-8 log handlers.
            shown = record["message"]
            if status == JobStatus.CANCELLED.value:
                log.info(
                    "%s: failed after its cancellation was asked for; job is cancelled: %s: %s",
                    label,
                    record["type"],
                    shown,
                    extra=extra,
                )
                self._emit(signals.job_failed, row, error=error)
                self._emit(signals.job_cancelled, row)
                return
            if retry_at is None:
                log.error(
                    "%s: failed, job is dead: %s: %s", label, record["type"], shown, extra=extra
                )
            else:
                log.warning(
                    "%s: failed, retry in %.1fs: %s: %s",
                    label,
                    delay,
                    record["type"],
                    shown,
                    extra=extra,
                )
            self._emit(signals.job_failed, row, error=error)
            if retry_at is None:
                self._emit(signals.job_dead, row, error=error)
            else:
                self._emit(signals.job_retried, row, error=error, retry_at=retry_at)

        def refused(exc: BaseException) -> _Write:
            what = lifecycle.cut_text(f"{record['type']}: {record['message']}", 300)
            reason = f"the database refused to store the error ({what}): {error_reason(exc)}"
            short = self._failure(
                row, label, extra, REFUSED_KIND, reason, "", dead=dead, delay=delay
            )
            return replace(short, fallback=None)

        return _Write(label, extra, apply, recorded, refused)

    def _fits(self, text: str) -> bool:
        return self.store.value_size(text) is None

    def _record_cancelled(self, row: Any, label: str, extra: dict[str, Any]) -> bool:
        now = self.clock()

        def recorded(_done: bool) -> None:
            log.info("%s: stopped for a cancellation; job is cancelled", label, extra=extra)
            self._emit(signals.job_cancelled, row)

        return self._finish(
            _Write(
                label,
                extra,
                lambda conn: lifecycle.finish_cancelled(conn, row.id, row.claim_token, now),
                recorded,
            )
        )

    def _emit(self, signal: Any, row: Any, **data: Any) -> None:
        """Send ``signal`` about the claimed ``row``, in an app context of its own (a
        receiver may use the app); its failures are logged, the outcome is recorded."""
        if not signal.receivers:
            return
        try:
            with self.job_context():
                signals.send(signal, self.store.signal_sender, job=self._context(row), **data)
        except Exception:
            log.exception("job=%s: sending %s failed", row.id, signal.name)

    def _context(self, row: Any) -> JobContext:
        return JobContext(
            id=row.id,
            task=row.task,
            queue=row.queue,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            idempotency_key=row.idempotency_key,
            worker_id=self.id,
            claim_token=row.claim_token,
            store=self.store,
        )

    def _finish(self, write: _Write, *, within: float | None = None) -> bool:
        """Make an outcome's write; ``True`` once it is recorded. A write that a fault
        which may pass keeps from the database is retried after each heartbeat; one the
        database refuses (see :data:`REFUSED_AFTER`) is replaced by its short fallback,
        so the job ends either way."""
        try:
            # Keep trying while we may still own the claim; past that it will be rescued.
            result = self.store.run_write(
                write.apply, within=self.options.stale_after if within is None else within
            )
        except sa.exc.SQLAlchemyError as exc:
            fallback = write.fallback
            if fallback is None or (self.store.may_retry(exc) and write.failures < REFUSED_AFTER):
                self._retry_later(write, exc)
                return False
            log.error(
                "%s: the database refused to record the outcome (%s); "
                "a short error is recorded instead",
                write.label,
                error_reason(exc),
                extra=write.extra,
            )
            return self._finish(fallback(exc), within=within)
        if not result:
            _log_claim_lost(write.label, write.extra)
            return False
        if write.failures:
            log.warning(
                "%s: outcome recorded once the database was back", write.label, extra=write.extra
            )
        write.recorded(result)
        return True

    def _retry_later(self, write: _Write, exc: Exception) -> None:
        """Keep an outcome's (fenced) write for the heartbeat to retry: giving up would
        strand the row as running, and nobody rescues a job whose worker heartbeats."""
        if not write.failures:
            log.error(
                "%s: could not record the outcome yet (%s); it is retried after each heartbeat",
                write.label,
                exc,
                extra=write.extra,
            )
        write.failures += 1
        with self._lock:
            self._unrecorded.append(write)

    # -- heartbeat and rescue -------------------------------------------------------------------

    def _record_late(self) -> None:
        """Retry the outcomes a database fault kept from being recorded. Each write is
        still fenced by its claim: one whose job was rescued meanwhile changes nothing."""
        with self._lock:
            waiting, self._unrecorded = self._unrecorded, []
        for write in waiting:
            self._finish(write, within=self.options.heartbeat_interval)

    def _heartbeat_loop(self) -> None:
        interval = self.options.heartbeat_interval
        # After a gap in our own heartbeats (an outage), rescue only once they have gone
        # through for STALE_AFTER again: every worker's heartbeat looks stale then, and the
        # live ones need that long to show it before anyone is declared dead (and their
        # attempts burned). A new worker may rescue from its second heartbeat.
        healthy_since = time.monotonic() - self.options.stale_after + 2 * interval
        while not self._exited.wait(interval):
            if self._database_file_changed():
                return  # nothing more to write: the file at the path is not ours
            last_ok = self._last_heartbeat_ok
            try:
                alive = self.store.run_write(
                    lambda conn: lifecycle.heartbeat(conn, self.id, self.clock(), self.store.boot),
                    within=interval,
                )
                if not alive:
                    # Declared dead while cut off: our running jobs were (or will be)
                    # rescued and their late outcomes are fenced. Carry on as a new worker.
                    old = self.id
                    self.id = _worker_id()
                    self._registered = False
                    self._register()
                    log.error("worker %s was declared dead; continuing as %s", old, self.id)
            except sa.exc.SQLAlchemyError as exc:
                self._log_db_error("heartbeat", exc)
                continue
            now = time.monotonic()
            if now - last_ok > 2 * interval:  # failed, blocked or declared dead meanwhile
                healthy_since = now
            self._last_heartbeat_ok = now
            self._record_late()
            if now - healthy_since >= self.options.stale_after:
                self.rescue()
            else:
                self._watch_heartbeats()
            self._prune_if_due()
            if now >= self._next_coverage:
                self._warn_unserved()

    def _watch_heartbeats(self) -> None:
        # From the first heartbeat on, so the first rescue need not watch STALE_AFTER more.
        try:
            self.store.watch_heartbeats(self._watch)
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("heartbeat watch", exc)

    def _database_file_changed(self) -> bool:
        """Whether the SQLite file was deleted or replaced under this worker; if so, log
        it with the jobs running and stop: every claim would go on with the old file."""
        try:
            self.store.check_file()
        except DatabaseFileChanged as exc:
            with self._lock:
                running = sorted(self._running)
            self._fatal = DatabaseFileChanged(exc.path, deleted=exc.deleted, running=running)
            log.error("worker %s: %s", self.id, self._fatal)
            self.stop()
            return True
        return False

    def rescue(self) -> list[tuple[int, str, str]]:
        """Take back the running jobs of workers that stopped heartbeating.

        A worker on this machine's boot is judged by the boot clock; one elsewhere by
        the queue's time, and only once this worker has itself seen its heartbeat
        unchanged for ``stale_after`` seconds (core/liveness.py): no wall-clock step on
        any host makes a live worker look lost.
        """
        try:
            rescued = self.store.rescue_stale(
                self.options.stale_after,
                now=self.clock(),
                watch=self._watch,
                within=self.options.heartbeat_interval,
            )
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("rescue", exc)
            return []
        for job_id, status, lost in rescued:
            log.warning("job=%s rescued from lost worker %s: now %s", job_id, lost, status)
            if signals.job_rescued.receivers:
                try:
                    job = self.store.get_job(job_id)
                    with self.job_context():
                        signals.send(
                            signals.job_rescued, self.store.signal_sender, job=job, lost_worker=lost
                        )
                except Exception:
                    log.exception("job=%s: sending the rescue signal failed", job_id)
        if rescued:
            self._wake.set()
        return rescued

    def prune(self) -> retention.Pruned:
        """One retention round now: delete finished jobs (and effect keys) older than
        ``SQLQUEUE_KEEP_*``, in batches of short transactions. Workers call it from their
        heartbeat every ``SQLQUEUE_PRUNE_INTERVAL`` seconds."""
        within = self.options.heartbeat_interval
        return retention.prune(
            lambda fn: self.store.run_write(fn, within=within), self.retention, self.clock()
        )

    def _prune_if_due(self) -> None:
        if not self.retention.prunes_anything or time.monotonic() < self._next_prune:
            return
        interval = self.store.settings.prune_interval
        try:
            pruned = self.prune()
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("retention", exc)
            self._next_prune = time.monotonic() + interval
            return
        # More due: carry on at the next heartbeat, giving claims the database between.
        pause = self.options.heartbeat_interval if pruned.more else interval
        self._next_prune = time.monotonic() + pause * random.uniform(0.9, 1.1)
        if pruned.total:
            log.info(
                "worker %s pruned %d completed, %d cancelled, %d dead job(s), %d effect key(s)",
                self.id,
                pruned.completed,
                pruned.cancelled,
                pruned.dead,
                pruned.effects,
            )

    def _log_db_error(self, what: str, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._db_error_logged > 10:  # at most one line per 10 s while it lasts
            self._db_error_logged = now
            log.error("worker %s: database error during %s (will retry): %s", self.id, what, exc)

    # -- timeouts and child processes (isolation.py) -----------------------------------------------

    def _isolated(self, task: Task[Any, Any]) -> bool:
        return self._isolation is not None and (task.isolate or self.options.processes > 0)

    def _mode(self) -> str:
        if self.options.processes:
            return f"processes ({self.options.processes} children)"
        isolated = sorted(name for name, task in self.registry.items() if self._isolated(task))
        return f"threads, isolated: {','.join(isolated)}" if isolated else "threads"

    def _start_children(self) -> None:
        """Start the children of a process-mode worker up front (a child that cannot load
        the app stops the worker here, with the child's error), and say which timeouts
        this worker cannot enforce."""
        if self._isolation is not None:
            self._isolation.reopen()
            if self.options.processes:
                self._isolation.prestart(self.options.processes)
        soft = sorted(
            name
            for name, task in self.registry.items()
            if task.timeout is not None and not self._isolated(task)
        )
        if soft:
            log.warning(
                "tasks %s have a timeout but run on threads here, which cannot be stopped: "
                "an overrun is only logged. Use isolate=True or `flask queue work --processes N` "
                "to enforce it.",
                ", ".join(soft),
            )
        for name, task in self.registry.items():
            if task.isolate and self._isolation is None:
                log.warning(
                    "task %s: isolate=True, but this worker has no loader; it runs on a thread",
                    name,
                )

    def _call(
        self,
        task: Task[Any, Any],
        ctx: JobContext,
        label: str,
        args: Any,
        kwargs: Any,
    ) -> Any:
        """Run one attempt: in a child process when isolated, else on this thread."""
        if self._isolated(task):
            assert self._isolation is not None
            return self._isolation.run(
                ctx, args, kwargs, task.timeout, functools.partial(self._cancel_asked, ctx.id)
            )
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
            with self.store.read() as conn:
                return bool(lifecycle.cancel_requests(conn, [job_id]))
        except sa.exc.SQLAlchemyError as exc:
            self._log_db_error("cancel check", exc)
            return False

    # -- eager mode -------------------------------------------------------------------------------

    def run_job(self, job_id: int) -> bool:
        """Claim one specific pending job and run it now, in this thread (eager mode)."""
        token = uuid.uuid4().hex
        now = self.clock()

        row = self.store.run_write(
            lambda conn: claim_job(
                conn, self.store.ops, job_id, worker_id=self.id, token=token, now=now
            )
        )
        if row is None:
            return False
        with self._lock:
            self._running[row.id] = token
        self._execute(row)
        return True


def _log_claim_lost(label: str, extra: dict[str, Any]) -> None:
    log.warning(
        "%s: lost its claim (rescued or released meanwhile); outcome dropped", label, extra=extra
    )

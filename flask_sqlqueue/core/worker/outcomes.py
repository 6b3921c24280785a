"""Recording how attempts ended: each a fenced write, logged and signalled once it is in.

A success waits for the next claim, whose transaction records it together with the
others that finished meanwhile (the group commit, core/worker/dispatch.py); a failure, a
cancellation or a success outside :meth:`Worker.run` is written at once. Every write is
fenced by its attempt's claim token, so one whose job was rescued meanwhile changes
nothing. A write that a passing fault keeps from the database is retried after each
heartbeat; one the database refuses outright is replaced by a short error, so that no
outcome leaves its job running (docs/outcomes.md).
"""

from __future__ import annotations

import functools
import logging
import random
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa
from blinker import NamedSignal
from sqlalchemy.engine import Connection

from ...bounds import time_after
from ...exceptions import ClaimLost
from ...exceptions import JobCancelled
from ...exceptions import PayloadError
from ...exceptions import PermanentFailure
from ...exceptions import ResultTooLarge
from ...exceptions import Retry
from ...exceptions import Snooze
from .. import failures
from .. import logcontext
from .. import signals
from .. import transitions
from ..isolation import AttemptFailed
from ..models import FINISHED
from ..models import JobStatus
from ..payload import encode_value
from ..store import error_reason
from ..tasks import Task
from .attempt import Attempt
from .attempt import Expired
from .attempt import NotRun
from .attempt import Outcome
from .attempt import Returned
from .settings import WorkerOptions
from .slots import Slots

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("flask_sqlqueue.worker")

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
class Success:
    """A finished attempt whose outcome waits to be recorded."""

    attempt: Attempt
    value: Any
    result: str | None  # ``value`` as stored JSON
    elapsed: float


@dataclass(frozen=True, slots=True)
class Failure:
    """How a failed attempt is recorded."""

    #: The error type recorded (``ValueError``, ``mymodule.MyError``, ``JobTimeout``).
    kind: str
    message: str
    #: The traceback.
    text: str
    #: No retry, whatever attempts are left.
    dead: bool
    #: Seconds until the retry.
    delay: float


def failure_of(error: BaseException, backoff: Callable[[], float]) -> Failure:
    """How an attempt that raised ``error`` is recorded. ``PermanentFailure`` ends the
    job, ``Retry`` gives its own delay, anything else retries after ``backoff()``."""
    text = failures.format_error(error)
    kind = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
    if isinstance(error, AttemptFailed):  # it failed in a child: record the child's error
        text, kind = error.text, error.kind
    if isinstance(error, PermanentFailure):
        return Failure(kind, str(error), text, dead=True, delay=0.0)
    if isinstance(error, Retry):
        return Failure(kind, str(error), text, dead=False, delay=error.delay)
    return Failure(kind, str(error), text, dead=False, delay=backoff())


def _nothing(_result: Any) -> None:
    pass


@dataclass(eq=False, slots=True)
class _Write:
    """The fenced write that records an attempt's outcome, and what follows it."""

    attempt: Attempt
    #: The write; what it returns is falsy when the claim was lost (nothing written).
    apply: Callable[[Connection], Any]
    #: Called with what ``apply`` returned once it is recorded: the log line, signals.
    recorded: Callable[[Any], None] = _nothing
    #: The short write that ends the job instead if the database refuses this one;
    #: ``None`` on a write that is one already.
    fallback: Callable[[BaseException], _Write] | None = None
    #: Whether what ``apply`` returned ended the job (completed, dead or cancelled):
    #: its waiters are told (``Store.run_finishing``). Default: whenever it is recorded.
    ends: Callable[[Any], bool] = bool
    #: Times it failed for a fault that may pass; it is retried after each heartbeat.
    failures: int = 0


class Outcomes:
    """Records the outcomes of a worker's attempts.

    :param slots: a held success keeps its job's slot until recorded (:class:`Slots`).
    :param wake: set once successes are recorded, to let the dispatcher claim again.
    :param worker_id: the worker's current id, named in error records and signals.
    """

    def __init__(
        self,
        store: Store,
        options: WorkerOptions,
        *,
        clock: Callable[[], datetime],
        rng: random.Random,
        job_context: Callable[[], AbstractContextManager[Any]],
        slots: Slots,
        wake: threading.Event,
        worker_id: Callable[[], str],
    ) -> None:
        self._store = store
        self._options = options
        self._clock = clock
        self._rng = rng
        self._job_context = job_context
        self._slots = slots
        self._wake = wake
        self._worker_id = worker_id
        # Guards _batching, _done and _unrecorded (job threads add, the dispatcher and
        # the heartbeat take). Slots' lock may be taken inside it, never the reverse.
        self._lock = threading.Lock()
        # Successful outcomes waiting for the next claim's transaction; only while
        # Worker.run() runs (``_batching``). Their jobs stay running, held in their slots,
        # until recorded, so a worker never has more running jobs than threads.
        self._batching = False
        self._done: list[Success] = []
        # Outcomes a database fault kept from being recorded, retried after each heartbeat.
        self._unrecorded: list[_Write] = []

    def record(self, attempt: Attempt, outcome: Outcome) -> None:
        """Record how ``attempt`` ended: one branch per outcome."""
        if isinstance(outcome, Returned):
            self._record_success(attempt, outcome.value, outcome.elapsed)
        elif isinstance(outcome, NotRun):
            self._finish(
                self._failure_write(attempt, outcome.kind, outcome.message, "", dead=outcome.dead)
            )
        elif isinstance(outcome, Expired):
            self._record_expired(attempt, outcome.expires_at)
        elif isinstance(outcome.error, ClaimLost):
            log.warning(
                "%s: lost its claim while running; nothing recorded",
                attempt.label,
                extra=attempt.extra,
            )
        elif isinstance(outcome.error, JobCancelled):
            self._record_cancelled(attempt)
        elif isinstance(outcome.error, Snooze):
            self._record_snoozed(attempt, outcome.error)
        else:
            error, task = outcome.error, outcome.task
            failed = failure_of(error, functools.partial(self._backoff, attempt, task))
            write = self._failure_write(
                attempt,
                failed.kind,
                failed.message,
                failed.text,
                dead=failed.dead,
                delay=failed.delay,
                error=error,
            )
            self._finish(write)

    def hand_back(self, attempt: Attempt, error: BaseException | None) -> None:
        """Count the attempt of a job whose outcome could not be recorded as failed, so it
        runs again (or goes dead when its attempts are spent, so a bug cannot loop)."""
        job = attempt.job
        now = self._clock()
        text = f"outcome not recorded: {error!r}"
        record = failures.error_record(
            job.attempts, "OutcomeNotRecorded", text, "", self._worker_id(), now
        )
        retry_at = None if job.attempts >= job.max_attempts else now

        def apply(conn: Connection) -> str | None:
            return transitions.fail(
                conn, job.id, job.claim_token, record, retry_at, now, fits=self._fits
            )

        def recorded(status: str) -> None:
            log.warning("job=%s: outcome not recorded; the job is now %s", job.id, status)

        try:
            self._finish(_Write(attempt, apply, recorded, ends=_ended))
        except Exception:
            log.exception("job=%s could not be handed back; it stays running", job.id)

    # -- successes and the group commit ----------------------------------------------------------

    def _record_success(self, attempt: Attempt, value: Any, elapsed: float) -> None:
        try:
            result = None if value is None else encode_value(value)
        except PayloadError as exc:
            # The work is done: re-running it to store a result would repeat its effects.
            log.warning("%s: result not stored: %s", attempt.label, exc, extra=attempt.extra)
            result = None
        size = None if result is None else self._store.value_size(result)
        if size is not None:
            # Its write could never succeed. The work is done, and another attempt would
            # repeat it and most likely return as much: the job is dead (docs/outcomes.md).
            error = ResultTooLarge(attempt.job.task, size, self._store.value_limit)
            self._finish(
                self._failure_write(attempt, TOO_LARGE_KIND, str(error), "", dead=True, error=error)
            )
            return
        success = Success(attempt, value, result, elapsed)
        with self._lock:
            if self._batching:
                # Recorded with the next claim, together with the others that finish
                # meanwhile; until then the job stays running in the database (a crash
                # re-runs it: at least once).
                self._slots.hold(attempt.job.id, attempt.token)
                self._done.append(success)
                return
        self._finish(self._success_write(success))

    def start_batching(self) -> None:
        """From now on successes wait for the next claim (:meth:`take_batch`)."""
        with self._lock:
            self._batching = True

    def waiting(self) -> int:
        """How many successes wait for the next claim."""
        with self._lock:
            return len(self._done)

    def take_batch(self) -> list[Success]:
        """The successes waiting to be recorded; the caller records them."""
        with self._lock:
            batch, self._done = self._done, []
        return batch

    def complete(self, conn: Connection, batch: list[Success], now: datetime) -> set[int]:
        """Record ``batch`` in the transaction of ``conn`` (a claim's), each fenced by its
        own claim; returns the ids completed. Nothing is logged until :meth:`report`."""
        if not batch:
            return set()
        items = [(s.attempt.job.id, s.attempt.token, s.result) for s in batch]
        return transitions.complete_many(conn, self._store.ops, items, now)

    def report(self, batch: list[Success], done: set[int]) -> None:
        """Log and signal the successes of ``batch`` recorded completed (ids in ``done``),
        and tell this host's waiters (the completing statement told the others)."""
        self._store.finished(done)
        # The lines first, written together (a write per few dozen lines, not one a
        # job); then the signals, whose receivers are the app's: no line waits for them.
        with logcontext.lines_together():
            for s in batch:
                if s.attempt.job.id in done:
                    self._log_success(s)
                else:
                    _log_claim_lost(s.attempt)
        for s in batch:
            if s.attempt.job.id in done:
                self._emit_success(s)

    def record_batch(self, batch: list[Success]) -> None:
        """Record successful outcomes in one transaction of their own, each fenced by its
        own claim (when no claim comes to carry them)."""
        if not batch:
            return
        try:
            self._write_successes(batch)
        except Exception:
            log.exception("recording %d outcome(s) failed unexpectedly", len(batch))
            for s in batch:
                self.hand_back(s.attempt, sys.exc_info()[1])
        finally:
            self._slots.release(s.attempt.job.id for s in batch)
            self._wake.set()

    def flush(self, *, last: bool = False) -> None:
        """Record the successes waiting for a claim (at shutdown, when none comes);
        with ``last``, later ones are recorded one by one as they finish."""
        with self._lock:
            batch, self._done = self._done, []
            if last:
                self._batching = False
        self.record_batch(batch)

    def _write_successes(self, batch: list[Success]) -> None:
        now = self._clock()
        items = [(s.attempt.job.id, s.attempt.token, s.result) for s in batch]
        try:
            done = self._store.run_write(
                lambda conn: transitions.complete_many(conn, self._store.ops, items, now),
                within=self._options.stale_after,
            )
        except sa.exc.SQLAlchemyError as exc:
            retry = self._store.may_retry(exc)
            for s in batch:
                if retry:
                    self._retry_later(self._success_write(s), exc)
                else:
                    # Refused: one by one, each of the others is recorded and the
                    # refused one ends with a short error.
                    self._finish(self._success_write(s))
            return
        self.report(batch, done)

    def _success_write(self, success: Success) -> _Write:
        attempt = success.attempt
        write = functools.partial(
            transitions.complete,
            job_id=attempt.job.id,
            token=attempt.token,
            result=success.result,
            now=self._clock(),
            ops=self._store.ops,
        )

        def refused(exc: BaseException) -> _Write:
            reason = f"the database refused to store the result: {error_reason(exc)}"
            # The work is done, as with a result too large: the job is dead.
            short = self._failure_write(attempt, REFUSED_KIND, reason, "", dead=True, error=exc)
            return replace(short, fallback=None)

        return _Write(attempt, write, lambda _: self._succeeded(success), refused)

    def _succeeded(self, success: Success) -> None:
        self._log_success(success)
        self._emit_success(success)

    def _log_success(self, success: Success) -> None:
        if log.isEnabledFor(logging.INFO):
            attempt = success.attempt
            extra = attempt.extra
            extra["sqlqueue_outcome"] = "completed"
            extra["sqlqueue_duration"] = round(success.elapsed, 6)
            # The line of every job: made and handled as log.info would, without looking
            # up its caller in the stack (a third of what a line cost); the record names
            # this function, which is where it was logged.
            record = log.makeRecord(
                log.name,
                logging.INFO,
                __file__,
                Outcomes._log_success.__code__.co_firstlineno,
                "%s: completed in %.3fs",
                (attempt.label, success.elapsed),
                None,
                "_log_success",
                extra,
            )
            log.handle(record)

    def _emit_success(self, success: Success) -> None:
        self._emit(
            signals.job_succeeded, success.attempt, result=success.value, duration=success.elapsed
        )

    # -- failures and cancellations ------------------------------------------------------------

    def _backoff(self, attempt: Attempt, task: Task[Any, Any]) -> float:
        job = attempt.job
        if task.backoff is not None:
            try:
                return failures.own_delay(task.backoff, job.attempts)
            except Exception as exc:
                log.error("task %s: backoff failed (%r); using the default", job.task, exc)
        return self._store.backoff.delay(job.attempts, self._rng)

    def _failure_write(
        self,
        attempt: Attempt,
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
        job, label = attempt.job, attempt.label
        now = self._clock()
        record = failures.error_record(job.attempts, kind, message, text, self._worker_id(), now)
        spent = job.attempts >= job.max_attempts
        # time_after: a delay past the latest storable time (a task's backoff= said so)
        # waits until that time instead of failing to record.
        retry_at = None if dead or spent else time_after(now, delay)

        def apply(conn: Connection) -> str | None:
            return transitions.fail(
                conn, job.id, job.claim_token, record, retry_at, now, fits=self._fits
            )

        def recorded(status: str) -> None:
            # The stored, escaped message: a lone surrogate would break UTF-8 log handlers.
            shown = record["message"]
            ended = "retry" if status == JobStatus.PENDING.value else status
            extra = {**attempt.extra, "sqlqueue_outcome": ended}
            if status == JobStatus.CANCELLED.value:
                log.info(
                    "%s: failed after its cancellation was asked for; job is cancelled: %s: %s",
                    label,
                    record["type"],
                    shown,
                    extra=extra,
                )
                self._emit(signals.job_failed, attempt, error=error)
                self._emit(signals.job_cancelled, attempt)
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
            self._emit(signals.job_failed, attempt, error=error)
            if retry_at is None:
                self._emit(signals.job_dead, attempt, error=error)
            else:
                self._emit(signals.job_retried, attempt, error=error, retry_at=retry_at)

        def refused(exc: BaseException) -> _Write:
            what = failures.cut_text(f"{record['type']}: {record['message']}", 300)
            reason = f"the database refused to store the error ({what}): {error_reason(exc)}"
            short = self._failure_write(attempt, REFUSED_KIND, reason, "", dead=dead, delay=delay)
            return replace(short, fallback=None)

        return _Write(attempt, apply, recorded, refused, ends=_ended)

    def _fits(self, text: str) -> bool:
        return self._store.value_size(text) is None

    def _record_cancelled(self, attempt: Attempt) -> bool:
        job = attempt.job
        now = self._clock()

        def recorded(_done: bool) -> None:
            log.info(
                "%s: stopped for a cancellation; job is cancelled",
                attempt.label,
                extra={**attempt.extra, "sqlqueue_outcome": "cancelled"},
            )
            self._emit(signals.job_cancelled, attempt)

        return self._finish(
            _Write(
                attempt,
                lambda conn: transitions.finish_cancelled(conn, job.id, job.claim_token, now),
                recorded,
            )
        )

    def _record_snoozed(self, attempt: Attempt, snoozed: Snooze) -> None:
        """The task raised ``Snooze``: back to pending after its delay, the attempt not
        counted and the backoff untouched (``cancelled`` if that was asked for)."""
        job = attempt.job
        now = self._clock()
        # time_after: never past the latest storable time (Snooze refused longer ones).
        run_at = time_after(now, snoozed.delay)

        def apply(conn: Connection) -> str | None:
            return transitions.snooze(conn, job.id, job.claim_token, run_at, now)

        def recorded(status: str) -> None:
            if status == JobStatus.CANCELLED.value:
                log.info(
                    "%s: snoozed after its cancellation was asked for; job is cancelled",
                    attempt.label,
                    extra={**attempt.extra, "sqlqueue_outcome": "cancelled"},
                )
                self._emit(signals.job_cancelled, attempt)
                return
            log.info(
                "%s: snoozed for %gs, attempt not counted%s",
                attempt.label,
                snoozed.delay,
                f": {snoozed.reason}" if snoozed.reason else "",
                extra={**attempt.extra, "sqlqueue_outcome": "snoozed"},
            )

        self._finish(_Write(attempt, apply, recorded, ends=_ended))

    def _record_expired(self, attempt: Attempt, expires_at: datetime) -> None:
        """The job expired before this attempt started: ``cancelled``, the attempt not
        counted, its dependents cancelled (docs/expiry.md)."""
        job = attempt.job
        now = self._clock()
        reason = transitions.expired_reason(expires_at, job.attempts)

        def recorded(_done: bool) -> None:
            log.info(
                "%s: not run, %s; job is cancelled",
                attempt.label,
                reason.removeprefix(f"{transitions.EXPIRED_KIND}: "),
                extra={**attempt.extra, "sqlqueue_outcome": "cancelled"},
            )
            self._emit(signals.job_cancelled, attempt)

        self._finish(
            _Write(
                attempt,
                lambda conn: transitions.expire(
                    conn, job.id, job.claim_token, reason, now, first=job.attempts <= 1
                ),
                recorded,
            )
        )

    def _emit(self, signal: NamedSignal, attempt: Attempt, **data: Any) -> None:
        """Send ``signal`` about ``attempt``, in an app context of its own (a receiver may
        use the app); its failures are logged, the outcome is recorded."""
        if not signal.receivers:
            return
        try:
            with self._job_context():
                job = attempt.context(self._store, self._worker_id())
                signals.send(signal, self._store.signal_sender, job=job, **data)
        except Exception:
            log.exception("job=%s: sending %s failed", attempt.job.id, signal.name)

    # -- writing, and writing again ------------------------------------------------------------

    def _finish(self, write: _Write, *, within: float | None = None) -> bool:
        """Make an outcome's write; ``True`` once it is recorded. A write that a fault
        which may pass keeps from the database is retried after each heartbeat; one the
        database refuses (see :data:`REFUSED_AFTER`) is replaced by its short fallback,
        so the job ends either way."""
        attempt = write.attempt
        try:
            # Keep trying while we may still own the claim; past that it will be rescued.
            result = self._store.run_finishing(
                write.apply,
                lambda result: [attempt.job.id] if result and write.ends(result) else [],
                within=self._options.stale_after if within is None else within,
            )
        except sa.exc.SQLAlchemyError as exc:
            fallback = write.fallback
            if fallback is None or (self._store.may_retry(exc) and write.failures < REFUSED_AFTER):
                self._retry_later(write, exc)
                return False
            log.error(
                "%s: the database refused to record the outcome (%s); "
                "a short error is recorded instead",
                attempt.label,
                error_reason(exc),
                extra=attempt.extra,
            )
            return self._finish(fallback(exc), within=within)
        if not result:
            _log_claim_lost(attempt)
            return False
        if write.failures:
            log.warning(
                "%s: outcome recorded once the database was back",
                attempt.label,
                extra=attempt.extra,
            )
        write.recorded(result)
        return True

    def _retry_later(self, write: _Write, exc: Exception) -> None:
        """Keep an outcome's (fenced) write for the heartbeat to retry: giving up would
        strand the row as running, and nobody rescues a job whose worker heartbeats."""
        if not write.failures:
            log.error(
                "%s: could not record the outcome yet (%s); it is retried after each heartbeat",
                write.attempt.label,
                exc,
                extra=write.attempt.extra,
            )
        write.failures += 1
        with self._lock:
            self._unrecorded.append(write)

    def record_late(self) -> None:
        """Retry the outcomes a database fault kept from being recorded (after each
        heartbeat). Each write is still fenced by its claim: one whose job was rescued
        meanwhile changes nothing."""
        with self._lock:
            waiting, self._unrecorded = self._unrecorded, []
        for write in waiting:
            self._finish(write, within=self._options.heartbeat_interval)


def _ended(status: str | None) -> bool:
    """Whether a failure's write (which returns the job's new status) ended the job."""
    return status in FINISHED


def _log_claim_lost(attempt: Attempt) -> None:
    log.warning(
        "%s: lost its claim (rescued or released meanwhile); outcome dropped",
        attempt.label,
        extra=attempt.extra,
    )

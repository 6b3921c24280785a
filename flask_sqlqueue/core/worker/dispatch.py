"""The dispatcher: the claim loop that keeps a worker's job threads busy.

One loop claims jobs in one statement and hands them to job threads. The successes that
finished since its last claim are recorded in the same transaction as its next one, so
one commit (one fsync on SQLite) serves both. Every transaction is short: a claim with
its completions; none is open while a task runs. With ``burst`` the loop returns once
nothing is eligible. On a stop it claims nothing more, hands back the jobs not started,
lets the running ones finish within the grace period and hands the rest back to
``pending``; no attempt is counted for any job handed back.

How many jobs a claim takes depends on how long recent jobs took:

- Short jobs (a few milliseconds): the claim takes *ahead*, beyond the free threads, up
  to :data:`AHEAD_WINDOW` seconds of work per thread (at most
  ``WorkerOptions.claim_ahead`` jobs). They wait in the worker's buffer, and the next
  claim, with the successes of all that ran meanwhile, comes when half the buffer is
  used: one commit per many jobs instead of one per thread's worth.
- Long jobs, or while a job runs longer than :data:`STALL_AFTER`, or before the first
  job finished: the claim takes the free threads' worth, and only when a thread is free;
  a claim then first waits a moment (:data:`LINGER`) for the jobs of the last one to
  finish too, so short ones finish in batches of the concurrency.
- A buffer never waits behind long jobs: when every thread has run its job for more
  than :data:`STALL_AFTER` while jobs wait, those go back to ``pending`` (no attempt
  counted), free for an idle worker.

Workers with concurrency or rate limits (core/features/limits.py) never claim ahead: a job
claimed counts against its limit as soon as it is claimed.
"""

from __future__ import annotations

import logging
import queue as queue_module
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa

from .. import transitions
from ..claim import ClaimRequest
from ..claim import claim
from ..claim import claim_job
from ..features.limits import TaskLimits
from .attempt import Attempt
from .attempt import Runner
from .outcomes import Outcomes
from .outcomes import Success
from .settings import WorkerOptions
from .slots import Slots
from .upkeep import Upkeep

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("flask_sqlqueue.worker")

#: How long a claim waits for jobs claimed less than this long ago to finish, so that
#: their outcomes share its commit. Short jobs then finish in batches of the worker's
#: concurrency instead of one commit per job or two; a job running longer than this is
#: not waited for.
LINGER = 0.001
#: Seconds of work per thread a claim may take ahead of the free threads (see above).
AHEAD_WINDOW = 0.02
#: A job running longer than this stops claiming ahead, and hands back the buffer when
#: every thread runs one.
STALL_AFTER = 0.1
#: Successes wait at most about this long for a claim to record them with.
FLUSH_AFTER = 0.02


@dataclass(frozen=True, slots=True)
class _Recorded:
    """Successes just recorded (``done``: the ids completed), for a job thread to report."""

    batch: list[Success]
    done: set[int]


class Dispatcher:
    """Claims jobs and runs them on job threads; see the module's docstring.

    No lock of its own: the loop's state (the last claim, the claims' connection) is the
    dispatcher thread's alone. What the job threads share with it is in :class:`Slots`
    and :class:`Outcomes`, each behind its own lock.

    :param stopping: set when the worker is to claim nothing more.
    :param wake: set when there may be jobs to claim (an enqueue, a freed slot).
    """

    def __init__(
        self,
        store: Store,
        options: WorkerOptions,
        *,
        tasks: tuple[str, ...],
        limits: Mapping[str, TaskLimits],
        clock: Callable[[], datetime],
        slots: Slots,
        runner: Runner,
        outcomes: Outcomes,
        upkeep: Upkeep,
        stopping: threading.Event,
        wake: threading.Event,
    ) -> None:
        self._store = store
        self._options = options
        self._tasks = tasks
        self._limits = limits
        self._clock = clock
        self._slots = slots
        self._runner = runner
        self._outcomes = outcomes
        self._upkeep = upkeep
        self._stopping = stopping
        self._wake = wake
        self._limited = bool(limits)
        self._writer = store.writer()  # the claims' own connection
        self._last_claim: tuple[float, list[int]] = (0.0, [])  # (time.monotonic(), its ids)
        self._listener: threading.Thread | None = None
        #: While the loop waits with jobs in its buffer: the fewest waiting jobs at which
        #: the end of a job wakes it (the refill point); ``None``: every end wakes it.
        #: A job thread reads it without a lock: a stale value costs at most a timed wait.
        self._wake_at: int | None = None
        #: Jobs the last :meth:`run` handed back to pending as it stopped (not started,
        #: or unfinished when the grace period ended).
        self.handed_back = 0
        #: Set while the loop waits for a wake-up or its next poll after a claim that
        #: found nothing, with no job running: a job enqueued now runs only if the
        #: enqueue wakes it (or at the next poll). For tests of the wake-ups.
        self.idle = threading.Event()

    def run(self, burst: bool) -> None:
        """Claim and hand out jobs until stopped (with ``burst``, until none is eligible),
        then let the running ones finish within the grace period and hand back the rest."""
        self.handed_back = 0
        inbox: queue_module.SimpleQueue[Attempt | _Recorded | None] = queue_module.SimpleQueue()
        threads = [
            threading.Thread(
                target=self._job_thread, args=(inbox,), name=f"sqlqueue-job-{n}", daemon=True
            )
            for n in range(self._options.concurrency)
        ]
        self._listener = threading.Thread(
            target=self._store.ops.listen,
            args=(self._store.engine, self._wake, self._stopping),
            name="sqlqueue-listen",
            daemon=True,
        )
        for thread in (*threads, self._listener):
            thread.start()
        self._outcomes.start_batching()
        self._store.add_waiter(self._wake)
        try:
            self._dispatch(inbox, burst)
        finally:
            self._store.remove_waiter(self._wake)
            self._stopping.set()
            for _ in threads:
                inbox.put(None)
            if self._upkeep.fatal is None:  # else nothing can be written: running jobs are lost
                self._finish_running()
                self._outcomes.flush(last=True)  # every finished job's outcome is written

    def join(self) -> None:
        """Wait (a little) for the listener thread of the last :meth:`run` to end."""
        if self._listener is not None:
            self._listener.join(timeout=5)
            self._listener = None

    def close(self) -> None:
        self._writer.close()

    def _dispatch(self, inbox: queue_module.SimpleQueue[Any], burst: bool) -> None:
        poll = self._options.poll_interval
        threads = self._options.concurrency
        unrecorded_since: float | None = None  # successes waiting, no claim due
        while not self._stopping.is_set():
            claiming = self._upkeep.may_claim()
            self._wake.clear()
            self.idle.clear()
            if not claiming:
                self._outcomes.record_batch(self._outcomes.take_batch())
                self._stopping.wait(min(poll, 1.0))
                continue
            ahead = self._ahead()
            waiting = self._slots.waiting()
            successes = self._outcomes.waiting()
            # Jobs this worker still holds once the waiting successes are recorded.
            kept = self._slots.count() - successes
            starving = kept < threads  # a thread would have nothing to run
            refill = ahead > 0 and waiting <= ahead // 2 and kept < threads + ahead
            if not (starving or refill):
                if self._slots.stalled(STALL_AFTER, threads):
                    self._hand_back_waiting()
                    continue
                now = time.monotonic()
                if not successes:
                    unrecorded_since = None
                elif unrecorded_since is None:
                    unrecorded_since = now
                elif now - unrecorded_since >= FLUSH_AFTER:
                    unrecorded_since = None
                    self._outcomes.record_batch(self._outcomes.take_batch())
                    continue
                # Nothing to do until the buffer runs down to the refill point, unless a
                # timer says so (a flush, a stall), and the wait has one while jobs wait.
                self._wake_at = ahead // 2 if ahead else None
                self._wake.wait(min(poll, FLUSH_AFTER) if waiting or successes else poll)
                self._wake_at = None
                continue
            unrecorded_since = None
            if not ahead:
                self._linger()
            batch = self._outcomes.take_batch()
            # Read before claiming (and after clearing the wake-up): a job that ends
            # after an empty claim may have gone back to pending, eligible now, so a
            # burst must claim once more. Each success in ``batch`` is still counted.
            held = self._slots.count()
            idle = not held
            try:
                attempts, done = self._cycle(batch, threads + ahead - (held - len(batch)))
            except Exception as exc:
                # Never let a database fault (or a row it cannot read) end the worker:
                # the claim rolled back, so log, back off and try again.
                self._upkeep.log_db_error("claim", exc)
                self._stopping.wait(min(poll, 1.0))
                continue
            for attempt in attempts:
                inbox.put(attempt)
            if batch:
                # Logged and signalled by a job thread, while this one claims again.
                inbox.put(_Recorded(batch, done))
            if attempts or batch:
                continue
            if burst and idle:
                return
            if idle:
                self.idle.set()
            self._wake.wait(poll)

    def _ahead(self) -> int:
        """How many jobs the next claim may take beyond the free threads (see the
        module's docstring)."""
        most = self._options.claim_ahead
        if not most or self._limited:
            return 0
        typical = self._slots.typical()
        if typical is None or self._slots.longest() > STALL_AFTER:
            return 0
        per_thread = AHEAD_WINDOW / max(typical, 1e-6)
        return min(most, int(self._options.concurrency * per_thread))

    def _hand_back_waiting(self) -> int:
        """Hand the jobs waiting in this worker's buffer back to pending, without
        counting an attempt, for any worker to take; returns how many went back."""
        back = self._slots.take_back()
        if not back:
            return 0
        try:
            released = self._release(back)
        except sa.exc.SQLAlchemyError as exc:
            # Still claimed by this live worker: keep them, or no one would run them.
            self._slots.restore(back)
            self._upkeep.log_db_error("hand back", exc)
            return 0
        log.info("handed back %d job(s) claimed ahead and not started", len(released))
        return len(released)

    def _release(self, claims: Mapping[int, str]) -> list[int]:
        """Hand the jobs of ``claims`` (id: claim token) back to pending without counting
        an attempt, in one transaction, and wake the workers; returns the ids released
        (the others had lost their claim). Their waiters are woken too: a job whose
        cancellation was asked for ends ``cancelled`` instead."""
        now = self._clock()

        def release(conn: sa.Connection) -> list[int]:
            done = [i for i, t in claims.items() if transitions.release(conn, i, t, now)]
            if done:
                self._store.ops.notify(conn)
            return done

        released = self._store.run_finishing(release, lambda released: released)
        if released:
            self._store.wake()
        return released

    def _linger(self) -> None:
        """Wait up to :data:`LINGER` for the jobs claimed just now to finish too."""
        claimed_at, ids = self._last_claim
        while True:
            remaining = claimed_at + LINGER - time.monotonic()
            if remaining <= 0 or self._stopping.is_set() or self._slots.over(ids):
                return
            self._wake.clear()
            self._wake.wait(remaining)

    def claim_once(self, limit: int) -> list[Attempt]:
        """One claim outside :meth:`run`'s loop, which alone keeps its connection."""
        try:
            attempts, _ = self._cycle([], limit)
        finally:
            self._writer.close()
        return attempts

    def _cycle(self, batch: list[Success], limit: int) -> tuple[list[Attempt], set[int]]:
        """Record the successes in ``batch`` and claim up to ``limit`` jobs, in one
        transaction. Returns the attempts claimed and the ids of the jobs recorded
        completed (the others had lost their claim)."""
        token = uuid.uuid4().hex
        try:
            for tries in range(3):
                now = self._clock()
                try:
                    with self._writer.begin() as conn:
                        done = self._outcomes.complete(conn, batch, now)
                        request = ClaimRequest(
                            self._upkeep.id, token, now, limit, self._options.queues, self._tasks
                        )
                        rows = claim(conn, self._store.ops, request, self._limits)
                    break
                except sa.exc.DBAPIError as exc:
                    # The database rolled the whole transaction back; nothing was taken.
                    # Claims lock limit rows in one order, so this is rare: retry at once.
                    if tries == 2 or not self._store.ops.is_deadlock(exc):
                        raise
        except Exception:
            # Nothing was written: record the outcomes on their own (that retries while
            # the database is away), and let the caller deal with the failed claim.
            self._outcomes.record_batch(batch)
            raise
        ids = [row.id for row in rows]
        self._slots.claimed(token, ids, recorded=[s.attempt.job.id for s in batch])
        self._last_claim = (time.monotonic(), ids)
        return [Attempt(row) for row in rows], done

    def _job_thread(self, inbox: queue_module.SimpleQueue[Attempt | _Recorded | None]) -> None:
        while True:
            item = inbox.get()
            if item is None:
                return
            if isinstance(item, _Recorded):
                self._outcomes.report(item.batch, item.done)
                continue
            try:
                self.execute(item)
            except Exception:
                # Never lose a job thread, nor strand the job as running while this worker
                # heartbeats (no one would rescue it): hand it back to run again.
                log.exception("job=%s: unexpected error while recording its outcome", item.job.id)
                self._outcomes.hand_back(item, sys.exc_info()[1])
            finally:
                # Not at every job's end: a wake-up the loop would answer only by waiting
                # again took the GIL from this thread once a job.
                at = self._wake_at
                if at is None or self._slots.waiting() <= at:
                    self._wake.set()

    def execute(self, attempt: Attempt) -> None:
        """Run ``attempt`` on this thread and record how it ended; then free its slot,
        unless its success is held for the next claim. Nothing runs if the attempt was
        handed back while it waited."""
        if not self._slots.start(attempt.job.id, attempt.token):
            return
        try:
            self._outcomes.record(attempt, self._runner.run(attempt))
        finally:
            self._slots.finished(attempt.job.id, attempt.token)

    def _finish_running(self) -> None:
        """Hand back the jobs not started; wait up to the grace period for the running
        ones, then hand back the rest. :attr:`handed_back` counts both."""
        self.handed_back = self._hand_back_waiting()
        deadline = time.monotonic() + self._options.grace
        while time.monotonic() < deadline:
            self._outcomes.flush()
            if not self._slots.count():
                return
            time.sleep(0.05)
        unfinished = self._slots.unfinished()
        if not unfinished:
            return
        try:
            released = self._release(unfinished)
        except sa.exc.SQLAlchemyError as exc:
            log.error(
                "jobs %s could not be released (%s); they will be rescued", sorted(unfinished), exc
            )
            return
        self.handed_back += len(released)
        for job_id in released:
            log.warning("job=%s released unfinished at shutdown; it will run again", job_id)

    # -- eager mode -------------------------------------------------------------------------------

    def run_job(self, job_id: int) -> bool:
        """Claim one specific pending job and run it now, in this thread (eager mode)."""
        token = uuid.uuid4().hex
        now = self._clock()

        row = self._store.run_write(
            lambda conn: claim_job(
                conn, self._store.ops, job_id, worker_id=self._upkeep.id, token=token, now=now
            )
        )
        if row is None:
            return False
        self._slots.claimed(token, [row.id])
        self.execute(Attempt(row))
        return True

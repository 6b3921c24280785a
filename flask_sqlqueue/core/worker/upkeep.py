"""Lifecycle upkeep: what keeps a worker known, and the queue tidy, while it runs.

The worker registers a row of its own, and a heartbeat thread stamps it every
``heartbeat_interval``. After each beat that went through, the thread retries the
outcomes a database fault kept back, rescues the jobs of workers that stopped
heartbeating, prunes finished jobs when that is due, and now and then warns of pending
jobs that no live worker would claim and ends those of them that expired. On SQLite it
first checks that the file at the database's path is still the one this worker opened.
The worker stops claiming while its own heartbeats fail (:meth:`Upkeep.may_claim`):
others may be rescuing its jobs. What the heartbeat knows is also the worker's
:class:`Health`, for an orchestrator's probes, read without a database round trip of
their own.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa

from ...exceptions import DatabaseFileChanged
from .. import queries
from .. import roster
from .. import signals
from .. import transitions
from ..features import retention
from ..liveness import BeatFiles
from ..liveness import HeartbeatWatch
from ..tasks import Task
from .settings import WorkerOptions
from .slots import Slots

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("flask_sqlqueue.worker")

#: Seconds between two checks for pending jobs that no live worker claims.
COVERAGE_INTERVAL = 300.0
#: Seconds between two rounds that end the expired pending jobs no live worker claims
#: (a worker that claims an expired job ends it itself: docs/expiry.md).
EXPIRY_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class Health:
    """A worker's health as its own threads last saw it (no database round trip).

    ``live``: :meth:`Worker.run` is running and its heartbeat thread finished a round,
    whether the database answered or not, within ``stale_after`` seconds: the process is
    not wedged. ``ready``: the worker claims jobs: it is running and not stopping, its
    last heartbeat went through, and that was within ``stale_after`` seconds (the same
    test that lets it claim). ``reason`` says why one of them is false ("" when both hold).
    """

    live: bool
    ready: bool
    reason: str = ""


#: Seconds between two sweeps of the beat files of workers that are gone.
BEAT_PRUNE_INTERVAL = 600.0


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Upkeep:
    """A worker's row, its heartbeat thread, and the rounds that ride on the heartbeat.

    No lock: once :meth:`start` ran, the heartbeat thread alone writes this state
    (before, the thread that calls ``run()`` or ``run_once()``); other threads read one
    attribute at a time (``id``, ``last_heartbeat_ok``, ``fatal``), never a pair that
    must agree. The dispatcher alone calls :meth:`may_claim`. Two threads logging a
    database error at once may both print it: the throttle is for a flood, not a race.

    :param job_context: the rescue signal is sent inside what it returns.
    :param stop: stops the worker (when its database file is gone).
    :param wake: set after a rescue, to let the dispatcher claim the jobs taken back.
    :param record_late: retries the outcomes kept back by a fault, after each beat.
    """

    def __init__(
        self,
        store: Store,
        registry: Mapping[str, Task[Any, Any]],
        options: WorkerOptions,
        *,
        task_names: tuple[str, ...],
        clock: Callable[[], datetime],
        job_context: Callable[[], AbstractContextManager[Any]],
        policy: retention.RetentionPolicy,
        slots: Slots,
        stop: Callable[[], None],
        wake: threading.Event,
        record_late: Callable[[], None],
    ) -> None:
        self._store = store
        self._registry = registry
        self._options = options
        self._task_names = task_names
        self._clock = clock
        self._job_context = job_context
        self._retention = policy
        self._slots = slots
        self._stop = stop
        self._wake = wake
        self._record_late = record_late
        #: This worker's id: a new one once it was declared dead (see the heartbeat).
        self.id = new_worker_id()
        #: Whether this worker's row is live (registered, not yet marked stopped).
        self.registered = False
        #: When a heartbeat last went through (``time.monotonic()``).
        self.last_heartbeat_ok = time.monotonic()
        #: Why run() must fail once it returns: nothing can be written any more.
        self.fatal: DatabaseFileChanged | None = None
        #: Why the last heartbeat failed (``None`` once one went through).
        self.heartbeat_error: str | None = None
        #: When the heartbeat thread last finished a round, failed or not (monotonic).
        self.last_round = time.monotonic()
        #: Called on the heartbeat thread after each heartbeat that went through (the
        #: health file, the systemd watchdog); must be quick, and never raise.
        self.on_healthy: list[Callable[[], None]] = []
        # Other machines' heartbeats as this worker saw them (see rescue()).
        self._watch = HeartbeatWatch()
        # The first round comes a random part of the interval in, so workers started
        # together do not all prune at once.
        self._next_prune = time.monotonic() + random.uniform(0, store.settings.prune_interval)
        self._next_coverage = 0.0
        self._next_expiry = 0.0
        self._warned_unserved: set[str] = set()
        self._paused = False
        self._db_error_logged = 0.0
        self._exited = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_thread: threading.Thread | None = None
        self._next_beat_prune = 0.0

    # -- the worker's row ---------------------------------------------------------------------

    def register(self) -> None:
        if self.registered:
            return
        now = self._clock()
        self._store.run_write(
            lambda conn: roster.register_worker(
                conn,
                self.id,
                socket.gethostname(),
                os.getpid(),
                self._options.queues,
                self._options.concurrency,
                now,
                boot=self._store.boot,
                tasks=self._task_names,
            )
        )
        self.registered = True
        self.last_heartbeat_ok = time.monotonic()

    def unregister(self) -> None:
        """Mark this worker's row stopped: it is no longer alive."""
        if self.registered and self.fatal is None:
            try:
                self._store.run_write(
                    lambda conn: roster.unregister_worker(conn, self.id, self._clock())
                )
            except sa.exc.SQLAlchemyError:
                log.warning("worker %s could not remove its row; it will expire", self.id)
            self.registered = False
            self._forget_beats(self.id)

    def health(self, *, running: bool, stopping: bool) -> Health:
        """The worker's :class:`Health` now; ``running`` and ``stopping`` are the worker's."""
        now = time.monotonic()
        stale = self._options.stale_after
        if not running:
            return Health(False, False, "the worker is not running")
        if self.fatal is not None:
            return Health(False, False, str(self.fatal))
        if now - self.last_round > stale:
            return Health(False, False, f"no heartbeat round for {now - self.last_round:.0f}s")
        if stopping:
            return Health(True, False, "the worker is stopping")
        if self.heartbeat_error is not None:
            return Health(True, False, f"the heartbeat fails: {self.heartbeat_error}")
        if now - self.last_heartbeat_ok > stale:
            return Health(True, False, f"no heartbeat for {now - self.last_heartbeat_ok:.0f}s")
        return Health(True, True)

    def may_claim(self) -> bool:
        """Whether the heartbeat went through within ``stale_after``; logs each change."""
        if time.monotonic() - self.last_heartbeat_ok > self._options.stale_after:
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

    # -- the heartbeat thread -----------------------------------------------------------------

    def start(self) -> None:
        """Start the heartbeat thread. It beats until :meth:`stop`: through the grace
        period too, until the worker is done with every job."""
        self._exited.clear()
        self.heartbeat_error = None
        self.last_round = time.monotonic()
        self._healthy()  # registered just now: a heartbeat of its own
        self._thread = threading.Thread(
            target=self._heartbeat_loop, name="sqlqueue-heartbeat", daemon=True
        )
        self._thread.start()
        if self._store.beats is not None:
            self._beat_thread = threading.Thread(
                target=self._beat_loop, args=(self._store.beats,), name="sqlqueue-beat", daemon=True
            )
            self._beat_thread.start()

    def stop(self) -> None:
        self._exited.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=5)
            self._beat_thread = None

    def _beat_loop(self, beats: BeatFiles) -> None:
        # The heartbeat's twin that never waits for the database (core/liveness.py): a
        # rescuer of this boot does not take a worker whose file is fresh for lost.
        failed = False
        while True:
            try:
                beats.beat(self.id)
                failed = False
            except OSError as exc:
                if not failed:  # once per outage: the database heartbeat still counts
                    log.warning("worker %s cannot stamp %s: %s", self.id, beats.folder, exc)
                failed = True
            if self._exited.wait(self._options.heartbeat_interval):
                return

    def _heartbeat_loop(self) -> None:
        interval = self._options.heartbeat_interval
        # After a gap in our own heartbeats (an outage), rescue only once they have gone
        # through for STALE_AFTER again: every worker's heartbeat looks stale then, and the
        # live ones need that long to show it before anyone is declared dead (and their
        # attempts burned). A new worker may rescue from its second heartbeat.
        healthy_since = time.monotonic() - self._options.stale_after + 2 * interval
        while not self._exited.wait(interval):
            if self._database_file_changed():
                return  # nothing more to write: the file at the path is not ours
            last_ok = self.last_heartbeat_ok
            try:
                alive = self._store.run_write(
                    lambda conn: roster.heartbeat(
                        conn, self.id, self._clock(), self._store.boot, self._slots.waiting_ids()
                    ),
                    within=interval,
                )
                if not alive:
                    # Declared dead while cut off: our running jobs were rescued and their
                    # late outcomes are fenced. We were not dead, so those rescues were
                    # no crashes. Carry on as a new worker.
                    old = self.id
                    self._came_back(old, self._slots.since_beat())
                    self.id = new_worker_id()
                    self._forget_beats(old)
                    self.registered = False
                    self.register()
                    log.error("worker %s was declared dead; continuing as %s", old, self.id)
                self._slots.beat()
            except sa.exc.SQLAlchemyError as exc:
                # What a probe is told: the kind of error, not the driver's text, which
                # names the server's address (the log line below has it all).
                kind = type(getattr(exc, "orig", None) or exc).__name__
                self.heartbeat_error = f"{kind} (the worker's log has the detail)"
                self.last_round = time.monotonic()
                self.log_db_error("heartbeat", exc)
                continue
            now = time.monotonic()
            if now - last_ok > 2 * interval:  # failed, blocked or declared dead meanwhile
                healthy_since = now
            self.last_heartbeat_ok = now
            self.heartbeat_error = None
            self._healthy()
            self._record_late()
            if now - healthy_since >= self._options.stale_after:
                self.rescue()
            else:
                self._watch_heartbeats()
            self._prune_if_due()
            if now >= self._next_beat_prune:
                self._next_beat_prune = now + BEAT_PRUNE_INTERVAL
                self._prune_beats()
            if now >= self._next_coverage:
                self.warn_unserved()
            if now >= self._next_expiry:
                self.expire_unserved()
            self.last_round = time.monotonic()

    def _forget_beats(self, worker_id: str) -> None:
        if self._store.beats is not None:
            self._store.beats.remove(worker_id)

    def _came_back(self, old_id: str, held: list[int]) -> None:
        taken = self._store.run_write(
            lambda conn: roster.worker_came_back(
                conn,
                old_id,
                held,
                self._clock(),
                max_crashes=self._store.settings.max_crashes,
            )
        )
        for back in taken:
            log.warning(
                "job=%s: its rescue from worker %s is no crash, the worker reported in "
                "again (crashes now %s, job %s)",
                back.job_id,
                old_id,
                back.crashes,
                back.status,
            )

    def _healthy(self) -> None:
        for callback in self.on_healthy:
            try:
                callback()
            except Exception:  # a full disk must not stop the heartbeat
                log.exception("worker %s: a health callback failed", self.id)

    def _watch_heartbeats(self) -> None:
        # From the first heartbeat on, so the first rescue need not watch STALE_AFTER more.
        try:
            roster.watch_heartbeats(self._store, self._watch)
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("heartbeat watch", exc)

    def _database_file_changed(self) -> bool:
        """Whether the SQLite file was deleted or replaced under this worker; if so, log
        it with the jobs running and stop: every claim would go on with the old file."""
        try:
            self._store.check_file()
        except DatabaseFileChanged as exc:
            running = self._slots.ids()
            self.fatal = DatabaseFileChanged(exc.path, deleted=exc.deleted, running=running)
            log.error("worker %s: %s", self.id, self.fatal)
            self._stop()
            return True
        return False

    # -- rescue, retention, unserved jobs ---------------------------------------------------------

    def rescue(self) -> list[tuple[int, str, str]]:
        """Take back the running jobs of workers that stopped heartbeating (see
        :meth:`Worker.rescue`)."""
        try:
            rescued = roster.rescue(
                self._store,
                self._options.stale_after,
                now=self._clock(),
                watch=self._watch,
                within=self._options.heartbeat_interval,
            )
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("rescue", exc)
            return []
        for job_id, status, lost in rescued:
            log.warning("job=%s rescued from lost worker %s: now %s", job_id, lost, status)
            if signals.job_rescued.receivers:
                try:
                    job = self._store.get_job(job_id)
                    with self._job_context():
                        signals.send(
                            signals.job_rescued,
                            self._store.signal_sender,
                            job=job,
                            lost_worker=lost,
                        )
                except Exception:
                    log.exception("job=%s: sending the rescue signal failed", job_id)
        if rescued:
            self._wake.set()
        return rescued

    def prune(self) -> retention.Pruned:
        """One retention round now (see :meth:`Worker.prune`)."""
        within = self._options.heartbeat_interval
        return retention.prune(
            lambda fn: self._store.run_write(fn, within=within), self._retention, self._clock()
        )

    def _prune_beats(self) -> None:
        beats = self._store.beats
        if beats is None:
            return
        try:
            with self._store.read() as conn:
                live = roster.live_worker_ids(conn)
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("beat files", exc)
            return
        beats.prune(live)

    def _prune_if_due(self) -> None:
        if not self._retention.prunes_anything or time.monotonic() < self._next_prune:
            return
        interval = self._store.settings.prune_interval
        try:
            pruned = self.prune()
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("retention", exc)
            self._next_prune = time.monotonic() + interval
            return
        # More due: carry on at the next heartbeat, giving claims the database between.
        pause = self._options.heartbeat_interval if pruned.more else interval
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

    def warn_unserved(self) -> None:
        """Log pending jobs that no live worker, this one included, would claim; each
        (queue, task) once per worker, checked at start and then every few minutes."""
        self._next_coverage = time.monotonic() + COVERAGE_INTERVAL
        try:
            fresh = roster.heartbeat_fresh(self._store, self._options.stale_after, self._clock())
            with self._store.read() as conn:
                cover = queries.coverage(conn, fresh)
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("the check for unserved jobs", exc)
            return
        for what, fix in cover.warnings(self._registry):
            if what not in self._warned_unserved:
                self._warned_unserved.add(what)
                log.warning("%s; %s", what, fix)

    def expire_unserved(self) -> list[int]:
        """End the expired pending jobs that no live worker, this one included, would
        claim (their queue or task is served by none): ``cancelled``, as a worker ends an
        expired job it claims, so that neither they nor their dependents and waiters wait
        for good. Returns their ids. Runs every :data:`EXPIRY_INTERVAL` seconds; it reads
        nothing more while every pending job is served (the unserved-jobs check's read)."""
        self._next_expiry = time.monotonic() + EXPIRY_INTERVAL
        within = self._options.heartbeat_interval
        try:
            fresh = roster.heartbeat_fresh(self._store, self._options.stale_after, self._clock())
            with self._store.read() as conn:
                unserved = [(u.queue, u.task) for u in queries.coverage(conn, fresh).unserved]
            if not unserved:
                return []
            now = self._clock()
            ended = self._store.run_finishing(
                lambda conn: transitions.expire_pending(conn, now, unserved),
                lambda ids: ids,
                within=within,
            )
        except sa.exc.SQLAlchemyError as exc:
            self.log_db_error("ending expired jobs", exc)
            return []
        if ended:
            log.info(
                "worker %s ended %d expired job(s) that no live worker serves: %s",
                self.id,
                len(ended),
                ", ".join(map(str, ended)),
            )
        return ended

    def log_db_error(self, what: str, exc: Exception) -> None:
        """Log a database error that the worker lives through: one line per 10 s."""
        now = time.monotonic()
        if now - self._db_error_logged > 10:  # at most one line per 10 s while it lasts
            self._db_error_logged = now
            log.error("worker %s: database error during %s (will retry): %s", self.id, what, exc)

"""The queue's database: one engine, the dialect's operations, and the calls built on them.

The worker, the CLI and the Flask extension all go through a :class:`Store`; every
transaction it opens is short, and none is ever held while a task runs.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextlib import contextmanager
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import make_url

from ..config import Settings
from . import wakeup
from .clock import DatabaseClock
from .dialects import DialectOps
from .dialects import check_scheme
from .dialects import database_identity
from .dialects import driver_missing
from .dialects import for_dialect
from .failures import Backoff
from .failures import cut_text
from .fileguard import FileGuard
from .hooks import Hooks
from .inserts import KeptInserts
from .jobs import Job
from .jobs import read_whole
from .liveness import BeatFiles
from .liveness import BootClock
from .models import FINISHED
from .models import JobRow
from .models import jobs

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import scoped_session

T = TypeVar("T")


# In-process wake-ups: a worker waiting for jobs is woken by an enqueue in the same
# process at once instead of at its next poll. Keyed by database, so two queues on
# different databases never wake each other.
_waiters: dict[str, weakref.WeakSet[threading.Event]] = {}
_waiters_lock = threading.Lock()

# SQLite has one writer at a time, and a connection that finds the write lock taken
# sleeps in SQLite's busy handler (1, 2, 5, 10... 100 ms), so a dozen threads of one
# process taking turns spent most of their time asleep. Threads of one process queue
# for it here instead and are handed the lock as soon as it is free. Keyed by database
# file, shared by every Store on it; other processes still meet at SQLite's own lock.
_write_locks: dict[str, threading.RLock] = {}

# Every live Store and Writer, for a forked child to drop its parent's connections.
_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_writers: weakref.WeakSet[Writer] = weakref.WeakSet()
# What a forked child inherited and must neither use nor close: held, never collected.
_inherited: list[Any] = []


class Store:
    """The queue's engine and everything that reads or writes it."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        # The database is looked up once, here: everything that differs is in self.ops.
        self.ops: DialectOps = for_dialect(engine.dialect.name)
        #: The database lives in the one connection of the engine's pool: an app's
        #: in-memory SQLite database (``SQLQUEUE_USE_APP_DATABASE``), whose engine the
        #: store shares as it is. No connection is ever taken out of that pool (it would
        #: take the database with it), and no worker can share it (``QueueExtension.worker``
        #: refuses): its jobs run where they are enqueued (eager mode, ``drain()``).
        self.in_memory = self.ops.in_memory(engine.url)
        self.ops.configure_engine(engine, settings)
        self.read_engine = engine.execution_options(**self.ops.read_options())
        self.identity = database_identity(engine.url)
        self._write_lock: threading.RLock | None = None
        if self.ops.single_writer:
            with _waiters_lock:
                self._write_lock = _write_locks.setdefault(self.identity, threading.RLock())
        self._wake_dir = self.ops.wake_dir(engine.url)
        #: The processes of this host waiting for jobs to finish (``Job.wait``) listen here.
        self._waiters_dir = wakeup.waiters_dir(self._wake_dir)
        #: This process's waiters, and the listener that wakes them.
        self.waiters = wakeup.Waiters(self._listen_finished)
        # A database that is a file here (SQLite): writes are refused once it has gone.
        path = self.ops.database_file(engine.url)
        self._file_guard = FileGuard(engine, path) if path else None
        #: The database's time, which every host of the queue agrees on.
        self.clock = DatabaseClock(self.ops, self.read)
        #: Bytes one text value may take here (:meth:`DialectOps.value_limit`); the
        #: server's own figure replaces the default once :meth:`check_server` ran.
        self.value_limit = self.ops.default_value_limit
        #: This machine's boot clock, stamped on heartbeats (core/liveness.py).
        self.boot: BootClock | None = BootClock.detect()
        #: The workers' heartbeats that never wait for the database, where this host
        #: has a folder for the database and a boot clock (core/liveness.py).
        self.beats: BeatFiles | None = None
        if self.boot is not None and not self.in_memory:
            self.beats = BeatFiles(wakeup.beats_dir(self.identity), self.boot)
        _stores.add(self)
        self.backoff = Backoff(settings.backoff_base, settings.backoff_cap, settings.backoff_jitter)
        #: The sender of the queue's signals: the Flask app (set by the extension).
        self.signal_sender: Any = self
        #: The hooks around enqueues and attempts: the queue's own (set by the extension).
        self.hooks = Hooks()
        #: Kept connections for plain one-job enqueues (:meth:`_kept_inserts`).
        self._kept: KeptInserts | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        url = make_url(settings.database_uri)
        check_scheme(url)
        # Looked up from the URL, as there is no engine yet: an unsupported database is
        # refused before its driver is loaded.
        options = for_dialect(url.get_backend_name()).engine_options(url, settings.engine_options)
        try:
            engine = sa.create_engine(url, **options)
        except ImportError as exc:  # the URL's driver is not installed
            raise driver_missing(url, exc) from exc
        return cls(engine, settings)

    # -- transactions -----------------------------------------------------------------

    def write(self) -> AbstractContextManager[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite).

        :raises DatabaseFileChanged: the SQLite file was deleted or replaced since this
            store opened it.
        """
        if self._write_lock is None:
            return self.engine.begin()
        self.check_file()
        return self._single_writer_write()

    @contextmanager
    def _single_writer_write(self) -> Iterator[Connection]:
        with self._writer_turn(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _writer_turn(self) -> Iterator[None]:
        """On a single-writer database (SQLite), this process's turn to write; elsewhere,
        nothing to wait for."""
        lock = self._write_lock
        if lock is None:
            yield
            return
        # As long as SQLite itself would wait, then the same error it would raise.
        if not lock.acquire(timeout=self.settings.sqlite_busy_timeout):
            raise self.ops.busy_error("by a writer in this process")
        try:
            yield
        finally:
            lock.release()

    def writer(self) -> Writer:
        """Write transactions on one connection kept between them (see :class:`Writer`)."""
        return Writer(self)

    def read(self) -> AbstractContextManager[Connection]:
        """A short read-only transaction that never waits for writers."""
        return self.read_engine.begin()

    # -- one-job inserts on kept connections -----------------------------------------

    def insert_kept(self, values: JobRow) -> int | None:
        """Insert a plain job (:data:`.inserts.PLAIN`) in a transaction of its own on a
        kept connection (core/inserts.py); its id, or ``None``, nothing written, where no
        kept connection is free or none is kept (:meth:`_kept_inserts`)."""
        kept = self._kept_inserts()
        if kept is None:
            return None
        self.check_file()
        with self._writer_turn():
            return kept.insert(values)

    def _kept_inserts(self) -> KeptInserts | None:
        """The kept connections for plain one-job enqueues (core/inserts.py), made on
        first use; ``None`` where the driver is not one :mod:`.inserts` knows, or the
        database is in memory (:attr:`in_memory`: kept connections leave the pool).

        Connections of the engine, so the store's: dropped at a fork (:meth:`_forked`)
        and closed with the engine's pool."""
        kept = self._kept
        if (
            kept is None
            and not self.in_memory
            and self.engine.dialect.driver in self.ops.kept_drivers
        ):
            with _waiters_lock:
                kept = self._kept
                if kept is None:
                    kept = self._kept = KeptInserts(self.engine, self.ops)
                    # Closed with the pool's: an app or a test disposing of the engine
                    # means to let go of every connection it has.
                    event.listen(self.engine, "engine_disposed", lambda _e: kept.close())
        return kept

    # -- reading --------------------------------------------------------------------------

    def read_jobs(self, conn: Connection, query: sa.Select[Any]) -> list[Job]:
        """The Jobs of ``query``, a SELECT of whole rows of ``sqlqueue_jobs``, on ``conn``
        (:func:`.jobs.read_rows`: a row edited by hand comes back unreadable, not an
        error), their payloads kept outside the rows read with them (one more SELECT,
        only if any is)."""
        return [Job.from_row(row, self) for row in read_whole(conn, query)]

    def caller_connection(self, target: Session | scoped_session[Any] | Connection) -> Connection:
        """The connection of a caller's ``session=``, checked to be on the queue's own
        database.

        :raises ValueError: it is bound to another database.
        """
        caller = caller_of(target)
        assert caller is not None
        return self._caller_connection(caller)

    def _caller_connection(self, target: Session | Connection) -> Connection:
        conn = target if isinstance(target, Connection) else target.connection()
        if database_identity(conn.engine.url) != self.identity:
            raise ValueError(
                "session= must be bound to the queue's own database "
                f"({self.engine.url.render_as_string()}), not "
                f"{conn.engine.url.render_as_string()}."
            )
        return conn

    # -- the database's clock and file ------------------------------------------------

    def now(self) -> datetime:
        """The database's current time (:meth:`.clock.DatabaseClock.now`)."""
        return self.clock.now()

    def sync_clock(self) -> timedelta:
        """Read the database's clock; returns its offset from this host's wall clock."""
        return self.clock.sync()

    def check_file(self) -> None:
        """Refuse to write once the SQLite file this store opened has gone from its path
        (:meth:`.fileguard.FileGuard.check`); nothing to check on a server.

        :raises DatabaseFileChanged: it was deleted or replaced.
        """
        if self._file_guard is not None:
            self._file_guard.check()

    def check_server(self) -> None:
        """Refuse a server version that cannot claim safely (no SKIP LOCKED); read the
        largest value it stores (:attr:`value_limit`)."""
        with self.read() as conn:
            self.ops.check_server(conn)
            self.value_limit = self.ops.value_limit(conn)

    def value_size(self, text: str) -> int | None:
        """The size of ``text`` as the database counts it, if over :attr:`value_limit`;
        ``None`` if it fits."""
        if len(text) * 4 <= self.value_limit:
            return None  # fits however it is encoded or escaped: no need to measure
        size = self.ops.value_size(text)
        return size if size > self.value_limit else None

    # -- forks ------------------------------------------------------------------------------

    def _forked(self) -> None:
        """In a forked child: a pool of its own (SQLAlchemy's recipe, ``dispose(close=
        False)``); the parent's connections are kept aside, never used nor closed."""
        if self._kept is not None:  # first: disposing the engine closes what is kept
            _inherited.extend(self._kept.forked())
        _inherited.append(self.engine.pool)
        self.engine.dispose(close=False)
        self.waiters.forked()
        if self._write_lock is not None:
            with _waiters_lock:
                self._write_lock = _write_locks.setdefault(self.identity, threading.RLock())

    # -- reading --------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        with self.read() as conn:
            rows = read_whole(conn, sa.select(jobs).where(jobs.c.id == job_id))
            return Job.from_row(rows[0], self) if rows else None

    # -- waiting for jobs to finish --------------------------------------------------------

    def wait_finished(
        self,
        job_id: int,
        timeout: float | None,
        poll_interval: float,
        *,
        wake: threading.Event | None = None,
        abandon: threading.Event | None = None,
    ) -> Job | None:
        """Return the job once it is finished (``completed``, ``dead`` or ``cancelled``),
        as read then (what ``Job.wait`` does).

        The job is read when the wait starts, whenever a write that finishes it may have
        been made (:attr:`waiters` wakes ``wake``), and every ``poll_interval`` seconds
        whatever happens: a lost wake-up delays the wait, it never loses it.

        :param abandon: once set (and ``wake`` with it), the wait returns ``None``.
        :raises TimeoutError: not finished after ``timeout`` seconds.
        :raises LookupError: the job no longer exists.
        """
        wake = threading.Event() if wake is None else wake
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.waiters.watch(job_id, wake):
            while True:
                # Cleared before the read: a wake-up that comes after it is kept.
                wake.clear()
                if abandon is not None and abandon.is_set():
                    return None
                job = self.get_job(job_id)
                if job is None:
                    raise LookupError(f"Job {job_id} no longer exists.")
                if job.status in FINISHED:
                    return job
                pause = poll_interval
                if deadline is not None:
                    pause = min(pause, deadline - time.monotonic())
                    if pause <= 0:
                        raise TimeoutError(
                            f"Job {job_id} did not finish within {timeout:g} seconds; "
                            f"it is {job.status}."
                        )
                wake.wait(pause)

    def finished(self, ids: Collection[int]) -> None:
        """Tell the processes of this host that wait for jobs that ``ids`` finished,
        once the write that finished them has committed. (On a database that carries
        the news itself, the write did: :meth:`DialectOps.notify_finished`.)"""
        if ids:
            wakeup.tell_finished(self._waiters_dir, ids)

    def run_finishing(
        self,
        fn: Callable[[Connection], T],
        ended: Callable[[T], Sequence[int]],
        *,
        within: float = 10.0,
    ) -> T:
        """:meth:`run_write` for a write that may finish jobs (or delete them): those
        ``ended(result)`` names are told to their waiters, in the transaction
        (:meth:`DialectOps.notify_finished`) and after it (:meth:`finished`)."""

        def write(conn: Connection) -> T:
            result = fn(conn)
            ids = ended(result)
            if ids:
                self.ops.notify_finished(conn, ids)
            return result

        result = self.run_write(write, within=within)
        self.finished(ended(result))
        return result

    def _listen_finished(self, finished: wakeup.Finished, stop: threading.Event) -> None:
        self.ops.listen_finished(self.engine, finished, stop)

    # -- wake-ups ---------------------------------------------------------------------------

    def add_waiter(self, event_: threading.Event) -> None:
        with _waiters_lock:
            _waiters.setdefault(self.identity, weakref.WeakSet()).add(event_)

    def remove_waiter(self, event_: threading.Event) -> None:
        with _waiters_lock:
            _waiters.get(self.identity, weakref.WeakSet()).discard(event_)

    def wake(self) -> None:
        """Wake idle workers after a commit: in this process, and on SQLite on this host."""
        with _waiters_lock:
            waiting = list(_waiters.get(self.identity, ()))
        for waiter in waiting:
            waiter.set()
        wakeup.broadcast(self._wake_dir)

    # -- resilience -------------------------------------------------------------------------

    def run_write(self, fn: Callable[[Connection], T], *, within: float = 10.0) -> T:
        """Run ``fn(conn)`` in a write transaction, retrying for up to ``within`` seconds
        while the database is busy or unreachable, so an outcome is recorded, not lost.

        ``fn`` must be safe to run again after a failed commit: every write in the queue
        is a guarded UPDATE or an insert-once, so a repeat changes nothing.
        """
        deadline = time.monotonic() + within
        pause = 0.05
        while True:
            try:
                with self.write() as conn:
                    return fn(conn)
            except sa.exc.DBAPIError as exc:
                if not self.may_retry(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def may_retry(self, exc: BaseException) -> bool:
        """Whether a write that failed with ``exc`` may succeed if tried again: a passing
        fault (:func:`is_transient`), not a statement the database refuses for its size."""
        return is_transient(exc) and not self.ops.refuses_value(exc)


class Writer:
    """Write transactions for a thread that writes in a loop (the worker's claims), on
    one connection kept between them: no pool check-out, ping and reset each time. The
    connection is the writer's own, detached from the pool; one the database dropped is
    replaced by the next transaction."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._conn: Connection | None = None
        _writers.add(self)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        if self._store.in_memory:  # the pool's one connection is the database: no own one
            with self._store.write() as shared:
                yield shared
            return
        self._store.check_file()
        with self._store._writer_turn():
            conn = self._conn
            if conn is None or conn.closed or conn.invalidated:
                conn = self._store.engine.connect()
                # Its own, never back to the pool: session settings stay with it.
                conn.detach()
                self._store.ops.prepare_writer(conn)
                conn.commit()
                self._conn = conn
            try:
                with conn.begin():
                    yield conn
            except BaseException:
                if conn.invalidated:
                    self.close()
                raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _forked(self) -> None:
        # The parent's connection: closing it here could end the parent's session.
        if self._conn is not None:
            _inherited.append(self._conn)
            self._conn = None


def _after_fork_in_child() -> None:
    """Run in every forked child (gunicorn ``--preload``, uWSGI, ``os.fork()``): parent
    and child must never share a connection, and a lock held by one of the parent's
    threads at the fork would stay held for good in the child, where they do not exist."""
    global _waiters_lock
    _waiters_lock = threading.Lock()
    _waiters.clear()  # the parent's idle workers, which the child does not have
    for key in _write_locks:
        _write_locks[key] = threading.RLock()
    for store in list(_stores):
        store._forked()
    for writer in list(_writers):
        writer._forked()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def is_transient(exc: BaseException) -> bool:
    """A database error that may pass: busy or locked, or a lost or refused connection."""
    return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )


def error_reason(exc: BaseException) -> str:
    """A database error's first line, without the statement and its parameters (a value
    too large to store, say), cut to 300 characters."""
    orig = getattr(exc, "orig", None)
    lines = str(exc if orig is None else orig).strip().splitlines()
    return cut_text(lines[0] if lines else type(exc).__name__, 300)


def caller_of(
    target: Session | scoped_session[Any] | Connection | None,
) -> Session | Connection | None:
    """What a ``session=`` writes in: a Connection, or a Session (of the current scope,
    for Flask-SQLAlchemy's ``db.session``)."""
    if target is None or isinstance(target, Connection):
        return target
    # A Session: the caller has loaded the ORM, which the queue never needs itself.
    from sqlalchemy.orm import scoped_session

    return target() if isinstance(target, scoped_session) else target

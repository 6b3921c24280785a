"""The queue's database: one engine, the dialect's operations, and the calls built on them.

The worker, the CLI and the Flask extension all go through a :class:`Store`; every
transaction it opens is short, and none is ever held while a task runs.
"""

from __future__ import annotations

import math
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
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar
from typing import cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import make_url

from ..config import Settings
from ..exceptions import DatabaseFileChanged
from ..exceptions import QueueUnavailable
from . import bigpayloads
from . import dependencies
from . import signals
from . import tags
from . import uniqueness
from . import wakeup
from .dialects import DialectOps
from .dialects import check_scheme
from .dialects import database_identity
from .dialects import driver_missing
from .dialects import for_dialect
from .failures import Backoff
from .failures import cut_text
from .hooks import Hooks
from .inserts import PLAIN
from .inserts import KeptInserts
from .jobs import Job
from .jobs import read_rows
from .liveness import BeatFiles
from .liveness import BootClock
from .liveness import steady
from .models import FINISHED
from .models import jobs
from .models import utcnow
from .options import EnqueueOptions
from .options import job_values
from .uniqueness import Unique

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

#: Rounds of insert-or-find for a unique key before giving up: each round inserts, or
#: finds the key held by a job that was in scope, unless that job left in between.
_UNIQUE_ROUNDS = 8

#: Times an enqueue in the queue's own transaction is tried when the database ends it
#: to break a deadlock.
_DEADLOCK_TRIES = 8

#: Idempotency keys looked up per statement: far below any database's bound parameters.
_KEYS_PER_READ = 1_000

#: Seconds between two readings of a server's clock (see :meth:`Store.now`).
CLOCK_SYNC_INTERVAL = 60.0
#: The same, while no reading has succeeded yet.
CLOCK_RETRY_INTERVAL = 5.0


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
        # A database that is a file here (SQLite): the file the first connection opened,
        # and whether it has gone since (deleted: True, replaced: False); writes are
        # refused once it has.
        self._path = self.ops.database_file(engine.url) or ""
        self._file: tuple[int, int] | None = None
        self._file_gone: bool | None = None
        if self._path:
            event.listen(engine, "connect", self._opened)
        self._clock_offset = timedelta(0)
        #: The database's time at the last reading and the steady clock then; ``None``
        #: until a reading succeeds. One tuple, so a reader never sees half of an update.
        self._clock_anchor: tuple[datetime, float] | None = None
        #: Bytes one text value may take here (:meth:`DialectOps.value_limit`); the
        #: server's own figure replaces the default once :meth:`check_server` ran.
        self.value_limit = self.ops.default_value_limit
        self._clock_synced_at = -math.inf
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

    # -- producing ----------------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        payload: str,
        options: EnqueueOptions,
        *,
        default_max_attempts: int | None = None,
    ) -> Job:
        """Write one job; with an idempotency key that exists, return that job instead.
        Producers go through :func:`.enqueue.enqueue`, which checks the job first."""
        values = job_values(
            task,
            payload,
            options,
            default_max_attempts=default_max_attempts or self.settings.max_attempts,
            now=self.now(),
        )
        depends_on = options.dependency_ids
        if (
            options.session is None
            and not depends_on
            and values["idempotency_key"] is None
            and values.keys() == PLAIN
            and not bigpayloads.oversize(payload, self.settings.inline_payload_limit)
        ):
            kept = self._kept_inserts()
            made = None if kept is None else self._enqueue_plain(kept, values)
            if made is not None:
                return made
        labels = cast("tuple[str, ...] | None", options.tags)

        unique = options.unique if "unique_key" in values else None

        def insert(conn: Connection) -> Job:
            if not depends_on:
                job = self._insert(conn, values, unique=unique)
            else:
                start = dependencies.prepare(
                    conn, depends_on, require=options.require, batch_id=options.batch_id
                )
                row = {**values, **start.values(values["created_at"])}
                notify = start.status == dependencies.PENDING
                job = self._insert(conn, row, notify=notify, unique=unique)
                if job.created_at is row["created_at"]:  # new, not a job holding the key
                    dependencies.link(conn, [job.id], depends_on, require=options.require)
            if labels and job.created_at is values["created_at"]:
                tags.link(conn, [job.id], labels)
            return job

        job: Job = self._produce(options, insert, lambda job: self._announce(job, values))
        return job

    def enqueue_many(
        self,
        task: str,
        calls: Sequence[tuple[str, str | None, str | None]],
        options: EnqueueOptions,
        *,
        default_max_attempts: int | None = None,
    ) -> list[Job]:
        """Write one job per ``(payload, idempotency key, concurrency key)`` in one
        transaction, with multi-row INSERTs; returns the jobs in the order of ``calls``.

        A key that exists already, or repeats within ``calls``, gives the job that holds it.
        """
        values = job_values(
            task,
            "",
            options,
            default_max_attempts=default_max_attempts or self.settings.max_attempts,
            now=self.now(),
        )
        rows = [
            {**values, "payload": payload, "idempotency_key": key, "concurrency_key": limit_key}
            for payload, key, limit_key in calls
        ]
        depends_on = options.dependency_ids
        labels = cast("tuple[str, ...] | None", options.tags)

        def insert(conn: Connection) -> list[Job]:
            if not depends_on:
                made = self._insert_many(conn, rows)
            else:
                # Every job of the batch has the same dependencies, so the same start.
                start = dependencies.prepare(
                    conn, depends_on, require=options.require, batch_id=options.batch_id
                ).values(values["created_at"])
                for row in rows:
                    row.update(start)
                made = self._insert_many(conn, rows, notify=start["status"] == dependencies.PENDING)
                new = [job.id for job in made if job.created_at is values["created_at"]]
                dependencies.link(conn, new, depends_on, require=options.require)
            if labels:
                # A key repeated in the batch gives one job, tagged once.
                fresh = dict.fromkeys(j.id for j in made if j.created_at is values["created_at"])
                tags.link(conn, list(fresh), labels)
            return made

        def announce(made: list[Job]) -> None:
            seen: set[int] = set()
            for job, row in zip(made, rows, strict=True):
                if job.id not in seen:  # a key repeated in the batch is one job
                    seen.add(job.id)
                    self._announce(job, row)

        made: list[Job] = self._produce(options, insert, announce)
        return made

    def _kept_inserts(self) -> KeptInserts | None:
        """The kept connections for plain one-job enqueues (core/inserts.py), made on
        first use; ``None`` where the driver is not one :mod:`.inserts` knows, or the
        database is in memory (:attr:`in_memory`: kept connections leave the pool)."""
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

    def _enqueue_plain(self, kept: KeptInserts, values: dict[str, Any]) -> Job | None:
        """A plain job (:data:`.inserts.PLAIN`), in a transaction of its own on a kept
        connection: what :meth:`enqueue` writes for it through the engine, and no more;
        ``None``, nothing written, while every kept connection is in use."""

        def insert() -> int | None:
            self.check_file()
            with self._writer_turn():
                return kept.insert(values)

        job_id = self._own(insert)
        if job_id is None:  # every kept connection in use: the engine's pool waits
            return None
        job = Job.inserted(job_id, values, self)
        self.wake()
        self._announce(job, values)
        return job

    def _produce(
        self,
        options: EnqueueOptions,
        insert: Callable[[Connection], T],
        announce: Callable[[T], None],
    ) -> T:
        """Run ``insert`` in the queue's own transaction, or in the caller's ``session``;
        wake the workers and announce the jobs once it has committed."""
        caller = _caller(options.session)
        if caller is None:
            made = self._insert_own(insert)
            self.wake()
            announce(made)
            return made
        conn = self._caller_connection(caller)
        made = insert(conn)
        if not isinstance(caller, Connection):

            def committed(_session: Session) -> None:
                self.wake()
                announce(made)

            event.listen(caller, "after_commit", committed, once=True)
        else:
            self.wake()  # a hint only: a worker woken early just polls again later
            announce(made)
        return made

    def _insert_own(self, insert: Callable[[Connection], T]) -> T:
        """Run ``insert`` in a transaction of the queue's own."""

        def run() -> T:
            with self.write() as conn:
                return insert(conn)

        return self._own(run)

    def _own(self, run: Callable[[], T]) -> T:
        """Run ``run``, a transaction of the queue's own that enqueues: again when the
        database ended it to break a deadlock; a database that cannot be reached is
        :class:`QueueUnavailable`, with nothing enqueued."""
        tries = 0
        while True:
            try:
                return run()
            except sa.exc.DBAPIError as exc:
                tries += 1
                # A job with dependencies locks them, as finishing them does, and
                # producers racing to free or replace the holder of a unique key lock
                # it: the database may end one of two such transactions to break a
                # deadlock.
                if tries < _DEADLOCK_TRIES and self.ops.is_deadlock(exc):
                    continue
                if not is_transient(exc):
                    raise
                reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
                raise QueueUnavailable(
                    f"The queue's database is unavailable ({reason}); nothing was enqueued."
                ) from exc

    def _announce(self, job: Job, values: dict[str, Any]) -> None:
        # The job an idempotency key already had keeps its own creation time.
        if signals.job_enqueued.receivers and job.created_at == values["created_at"]:
            signals.send(signals.job_enqueued, self.signal_sender, job=job)

    def _ops_for(self, conn: Connection) -> DialectOps:
        """The dialect operations for ``conn``. A caller's connection is on the queue's
        own database (:meth:`_caller_connection` checks it), so these are :attr:`ops`;
        the dialect is compared all the same, so that no connection is ever given
        another database's SQL."""
        same = conn.dialect.name == self.engine.dialect.name
        return self.ops if same else for_dialect(conn.dialect.name)

    def _insert(
        self,
        conn: Connection,
        values: dict[str, Any],
        *,
        notify: bool = True,
        unique: Unique | None = None,
    ) -> Job:
        if unique is not None:
            return self._insert_unique(conn, values, unique, notify=notify)
        ops = self._ops_for(conn)
        key = values["idempotency_key"]
        row = bigpayloads.row_values(values, self.settings.inline_payload_limit)
        for _ in range(3):
            job_id = ops.enqueue_job(conn, row) if notify else ops.insert_job(conn, row)
            if job_id is not None:
                return self._new_job(conn, job_id, values)
            existing = conn.execute(sa.select(jobs).where(jobs.c.idempotency_key == key)).first()
            if existing is not None:
                return self._job(conn, existing)
            # The holder of the key was deleted between our insert and our read: try again.
        raise RuntimeError(f"Could not insert or find the job with idempotency key {key!r}.")

    def _insert_unique(
        self, conn: Connection, values: dict[str, Any], unique: Unique, *, notify: bool
    ) -> Job:
        """Insert a job whose ``values`` carry a unique key (core/uniqueness.py): the new
        job, the job holding its idempotency key, or the job holding its unique key in
        ``unique``'s scope (given this call's arguments first with ``replace``).

        Each round reads the key's holder: in scope, it is the answer (or replaced);
        out of scope, its key is freed. Then the insert, which the unique index refuses
        if a racer took the key meanwhile; the next round finds that racer's job. A
        holder that leaves between a read and a write (it started, finished, or was
        deleted) costs a round; a few at most, as each needs a racer or a worker to
        move in that instant. Reading before inserting keeps a key in scope free of
        writes and locks: on InnoDB, racers each holding the shared lock a refused
        insert takes would deadlock as soon as one wrote the holder.
        """
        ops = self._ops_for(conn)
        key, idempotency_key = values["unique_key"], values["idempotency_key"]
        now = values["created_at"]
        refused = False
        for _ in range(_UNIQUE_ROUNDS):
            if idempotency_key is not None:  # the contract's promise comes first
                held = conn.execute(
                    sa.select(jobs).where(jobs.c.idempotency_key == idempotency_key)
                ).first()
                if held is not None:
                    return self._job(conn, held)
            row = uniqueness.holder(conn, key, locking=refused)
            if row is not None:
                if uniqueness.holds(row, unique, now):
                    found = self._conflict(conn, ops, row, values, unique, notify=notify)
                    if found is not None:
                        return found
                    continue  # it started meanwhile: judge it again
                uniqueness.free(conn, row.id, key, unique, now)
            inserted = bigpayloads.row_values(values, self.settings.inline_payload_limit)
            job_id = ops.insert_unique(conn, inserted, notify=notify)
            if job_id is not None:
                return self._new_job(conn, job_id, values)
            refused = True
        raise RuntimeError(f"Could not insert or find the job with unique key {key!r}.")

    def _conflict(
        self,
        conn: Connection,
        ops: DialectOps,
        row: Any,
        values: dict[str, Any],
        unique: Unique,
        *,
        notify: bool,
    ) -> Job | None:
        """The job for a call whose key ``row`` holds in scope: ``row`` itself, or with
        ``replace`` and ``row`` not started, ``row`` given the call's arguments and
        ``run_at``; ``None`` if it started before the write could change it."""
        if unique.on_conflict != "replace" or row.status not in uniqueness.NOT_STARTED:
            return self._job(conn, row)
        limit = self.settings.inline_payload_limit
        if not uniqueness.replace(
            conn, row.id, row.unique_key, bigpayloads.row_values(values, limit)
        ):
            return None
        # Its new payload in its row or outside it, whichever way the old one was kept.
        bigpayloads.rewrite(conn, row.id, values["payload"], limit)
        if notify:
            ops.notify(conn)  # it may be due sooner than it was
        fresh = conn.execute(sa.select(jobs).where(jobs.c.id == row.id)).one()
        return self._job(conn, fresh)

    def _insert_many(
        self, conn: Connection, rows: list[dict[str, Any]], *, notify: bool = True
    ) -> list[Job]:
        """Insert one job per row, in as few statements as the database allows
        (``DialectOps.insert_jobs``), ids in the order of ``rows``; a row whose key a job
        holds already, or an earlier row of ``rows``, gives that job."""
        ops = self._ops_for(conn)
        limit = self.settings.inline_payload_limit
        # Big payloads outside the rows: the multi-row INSERTs carry their markers.
        inserted = [bigpayloads.row_values(row, limit) for row in rows]
        made: list[Job | None] = [None] * len(rows)
        first: dict[str, int] = {}  # idempotency key -> index of its first call
        repeats: list[tuple[int, int]] = []  # (index, index of the first call with its key)
        todo: list[int] = []  # every call without a key, and the first call of each key
        for index, row in enumerate(rows):
            key = row["idempotency_key"]
            if key is not None:
                if key in first:
                    repeats.append((index, first[key]))
                    continue
                first[key] = index
            todo.append(index)
        for _ in range(3):
            held: list[int] = []  # calls whose key another job holds
            ids = ops.insert_jobs(conn, [inserted[i] for i in todo]) if todo else []
            fresh: list[tuple[int, str]] = []
            for index, job_id in zip(todo, ids, strict=True):
                if job_id is None:
                    held.append(index)
                else:
                    made[index] = Job.inserted(job_id, rows[index], self)
                    fresh.append((job_id, rows[index]["payload"]))
            bigpayloads.keep(conn, fresh, limit)
            holders = self._holders(conn, [rows[i]["idempotency_key"] for i in held])
            todo = []
            for index in held:
                holder = holders.get(rows[index]["idempotency_key"])
                if holder is None:  # deleted between our insert and our read: try again
                    todo.append(index)
                else:
                    made[index] = self._job(conn, holder)
            if not todo:
                break
        else:
            keys = ", ".join(repr(rows[i]["idempotency_key"]) for i in todo)
            raise RuntimeError(f"Could not insert or find the jobs with idempotency keys {keys}.")
        for index, original in repeats:
            made[index] = made[original]
        if rows and notify:
            ops.notify(conn)
        return made  # type: ignore[return-value]

    def _holders(self, conn: Connection, keys: list[str]) -> dict[str, Any]:
        """The rows of the jobs holding ``keys``, by key (a page of keys per statement)."""
        found: dict[str, Any] = {}
        for start in range(0, len(keys), _KEYS_PER_READ):
            page = keys[start : start + _KEYS_PER_READ]
            rows = conn.execute(sa.select(jobs).where(jobs.c.idempotency_key.in_(page)))
            found.update((row.idempotency_key, row) for row in rows)
        return found

    def _new_job(self, conn: Connection, job_id: int, values: dict[str, Any]) -> Job:
        """The Job for a row just inserted with ``values`` (saves reading it back), its
        payload kept outside the row if it is big (:func:`bigpayloads.row_values`)."""
        bigpayloads.keep(conn, [(job_id, values["payload"])], self.settings.inline_payload_limit)
        return Job.inserted(job_id, values, self)

    def _job(self, conn: Connection, row: Any) -> Job:
        """The Job of a row read whole, with its payload if kept outside the row."""
        return Job.from_row(bigpayloads.full_row(conn, row), self)

    def read_jobs(self, conn: Connection, query: sa.Select[Any]) -> list[Job]:
        """The Jobs of ``query``, a SELECT of whole rows of ``sqlqueue_jobs``, on ``conn``
        (:func:`.jobs.read_rows`: a row edited by hand comes back unreadable, not an
        error), their payloads kept outside the rows read with them (one more SELECT,
        only if any is)."""
        return [Job.from_row(row, self) for row in bigpayloads.full(conn, read_rows(conn, query))]

    def caller_connection(self, target: Session | scoped_session[Any] | Connection) -> Connection:
        """The connection of a caller's ``session=``, checked to be on the queue's own
        database.

        :raises ValueError: it is bound to another database.
        """
        caller = _caller(target)
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

    # -- the database's clock ------------------------------------------------------------

    def now(self) -> datetime:
        """The database's current time, so workers on hosts with skewed clocks agree.

        Servers are asked once a minute; in between, the time elapsed since on a steady
        clock (:func:`~.liveness.steady`) is added to their answer, so a step of this
        host's wall clock never moves it. SQLite shares the host's clock.
        """
        if self.ops.clock_query is None:
            return utcnow()
        anchor = self._clock_anchor
        due = CLOCK_SYNC_INTERVAL if anchor is not None else CLOCK_RETRY_INTERVAL
        if steady() - self._clock_synced_at > due:
            self.sync_clock()
            anchor = self._clock_anchor
        if anchor is None:  # the server has not answered yet: the host's clock
            return utcnow() + self._clock_offset
        value, at = anchor
        return value + timedelta(seconds=steady() - at)

    def sync_clock(self) -> timedelta:
        """Read the database's clock; returns its offset from this host's wall clock."""
        assert self.ops.clock_query is not None
        self._clock_synced_at = steady()
        try:
            with self.read() as conn:
                before, wall_before = steady(), utcnow()
                value = conn.exec_driver_sql(self.ops.clock_query).scalar_one()
                after, wall_after = steady(), utcnow()
        except sa.exc.DBAPIError:
            return self._clock_offset  # keep the last reading; try again later
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        # Half the round trip on each side of the server's answer.
        self._clock_anchor = (value, (before + after) / 2)
        self._clock_offset = value - (wall_before + (wall_after - wall_before) / 2)
        return self._clock_offset

    def check_file(self) -> None:
        """Raise if the SQLite file at the database's path is no longer the one this
        store's connections opened (it was deleted, or another moved over it): they
        would go on with the old file, where every write is lost or never seen."""
        if self._file is None:
            return  # a server, or nothing opened yet
        if self._file_gone is None:
            found = _file_identity(self._path)
            if found == self._file:
                return
            self._file_gone = found is None
        raise DatabaseFileChanged(self._path, deleted=self._file_gone)

    def _opened(self, _dbapi_connection: Any, _record: Any) -> None:
        found = _file_identity(self._path)
        if self._file is None:
            self._file = found
        elif found != self._file and self._file_gone is None:
            # A connection opened on what is at the path now, beside the pooled ones
            # on the old file: writes would land in either.
            self._file_gone = found is None

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
            rows = read_rows(conn, sa.select(jobs).where(jobs.c.id == job_id))
            return self._job(conn, rows[0]) if rows else None

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


def _file_identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``; ``None`` if there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


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


def _caller(
    target: Session | scoped_session[Any] | Connection | None,
) -> Session | Connection | None:
    """What a ``session=`` writes in: a Connection, or a Session (of the current scope,
    for Flask-SQLAlchemy's ``db.session``)."""
    if target is None or isinstance(target, Connection):
        return target
    # A Session: the caller has loaded the ORM, which the queue never needs itself.
    from sqlalchemy.orm import scoped_session

    return target() if isinstance(target, scoped_session) else target

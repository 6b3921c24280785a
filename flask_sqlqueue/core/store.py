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
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session

from ..config import Settings
from ..exceptions import QueueUnavailable
from . import wakeup
from .dialects import DialectOps
from .dialects import for_dialect
from .enqueue import EnqueueOptions
from .enqueue import job_values
from .jobs import Job
from .lifecycle import Backoff
from .models import jobs
from .models import utcnow

T = TypeVar("T")

# In-process wake-ups: a worker waiting for jobs is woken by an enqueue in the same
# process at once instead of at its next poll. Keyed by database, so two queues on
# different databases never wake each other.
_waiters: dict[str, weakref.WeakSet[threading.Event]] = {}
_waiters_lock = threading.Lock()


def database_identity(url: sa.URL) -> str:
    """A key that is equal for two URLs naming the same database."""
    backend = url.get_backend_name()
    if backend == "sqlite":
        return "sqlite:" + os.path.realpath(url.database or ":memory:")
    return f"{backend}://{url.host or ''}:{url.port or ''}/{url.database or ''}"


class Store:
    """The queue's engine and everything that reads or writes it."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.ops: DialectOps = for_dialect(engine.dialect.name)
        self.ops.configure_engine(engine, settings)
        self.read_engine = engine.execution_options(**self.ops.read_options())
        self.identity = database_identity(engine.url)
        self._wake_dir = (
            wakeup.wake_dir(engine.url.database or "") if self.ops.name == "sqlite" else None
        )
        self._clock_offset = timedelta(0)
        self._clock_synced_at = -math.inf
        self.backoff = Backoff(settings.backoff_base, settings.backoff_cap, settings.backoff_jitter)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        url = make_url(settings.database_uri)
        options = dict(settings.engine_options)
        if url.get_backend_name() == "sqlite":
            if url.database in (None, "", ":memory:"):
                raise ValueError(
                    "An in-memory SQLite database cannot be shared by a worker; "
                    "use a file: sqlite:///path/to/queue.db"
                )
            os.makedirs(os.path.dirname(os.path.abspath(url.database)) or ".", exist_ok=True)
        else:
            options.setdefault("pool_pre_ping", True)
            # The claim's SKIP LOCKED reasoning assumes READ COMMITTED (MariaDB's default
            # is REPEATABLE READ, whose snapshot would hide rows committed meanwhile).
            options.setdefault("isolation_level", "READ COMMITTED")
        return cls(sa.create_engine(url, **options), settings)

    # -- transactions -----------------------------------------------------------------

    def write(self) -> Any:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite)."""
        return self.engine.begin()

    def read(self) -> Any:
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
        """Write one job; with an idempotency key that exists, return that job instead."""
        values = job_values(
            task,
            payload,
            options,
            default_max_attempts=default_max_attempts or self.settings.max_attempts,
            now=self.now(),
        )
        target = options.session
        if isinstance(target, scoped_session):
            # Flask-SQLAlchemy's db.session: write in the session of the current scope.
            target = target()
        if target is None:
            try:
                with self.write() as conn:
                    job = self._insert(conn, values)
            except sa.exc.DBAPIError as exc:
                if not is_transient(exc):
                    raise
                reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
                raise QueueUnavailable(
                    f"The queue's database is unavailable ({reason}); nothing was enqueued."
                ) from exc
            self.wake()
            return job
        conn = self._caller_connection(target)
        job = self._insert(conn, values)
        if isinstance(target, Session):
            event.listen(target, "after_commit", lambda _s: self.wake(), once=True)
        else:
            self.wake()  # a hint only: a worker woken early just polls again later
        return job

    def _insert(self, conn: Connection, values: dict[str, Any]) -> Job:
        ops = (
            self.ops
            if conn.dialect.name == self.engine.dialect.name
            else for_dialect(conn.dialect.name)
        )
        key = values["idempotency_key"]
        for _ in range(3):
            job_id = ops.insert_job(conn, values)
            if job_id is not None:
                ops.notify(conn)
                return Job.from_row(
                    _Values(
                        id=job_id,
                        **values,
                        started_at=None,
                        finished_at=None,
                        worker_id=None,
                        last_error=None,
                        result=None,
                        errors=None,
                    ),
                    self.get_job,
                )
            existing = conn.execute(sa.select(jobs).where(jobs.c.idempotency_key == key)).first()
            if existing is not None:
                return Job.from_row(existing, self.get_job)
            # The holder of the key was deleted between our insert and our read: try again.
        raise RuntimeError(f"Could not insert or find the job with idempotency key {key!r}.")

    def _caller_connection(self, target: Session | Connection) -> Connection:
        conn = target.connection() if isinstance(target, Session) else target
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

        Servers are asked once a minute and the offset to the local clock is applied in
        between (corrected for half the round trip); SQLite shares the host's clock.
        """
        if self.ops.clock_query is not None and time.monotonic() - self._clock_synced_at > 60:
            self.sync_clock()
        return utcnow() + self._clock_offset

    def sync_clock(self) -> timedelta:
        """Measure the database clock's offset from this host's; returns it."""
        assert self.ops.clock_query is not None
        self._clock_synced_at = time.monotonic()
        try:
            with self.read() as conn:
                before = utcnow()
                value = conn.exec_driver_sql(self.ops.clock_query).scalar_one()
                after = utcnow()
        except sa.exc.DBAPIError:
            return self._clock_offset  # keep the last offset; try again in a minute
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        self._clock_offset = value - (before + (after - before) / 2)
        return self._clock_offset

    def check_server(self) -> None:
        """Refuse a server version that cannot claim safely (no SKIP LOCKED)."""
        with self.read() as conn:
            self.ops.check_server(conn)

    # -- reading --------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        with self.read() as conn:
            row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).first()
        return None if row is None else Job.from_row(row, self.get_job)

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
                if not is_transient(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def is_transient(exc: BaseException) -> bool:
    """A database error that may pass: busy or locked, or a lost or refused connection."""
    return isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError) or (
        isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated
    )


class _Values:
    """Row-like access to the values of a just-inserted job (saves reading it back)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

"""One-job enqueues on connections kept for them.

A web request's enqueue is one INSERT and its commit. Through the engine it was also a
pool check-out (on a server, a ping first), SQLAlchemy's begin, execute and commit
wrappers, and a reset on return: on SQLite about 0.4 ms of Python beside a 0.2 ms commit,
on a server two round trips more than the INSERT's own. Here the INSERT is compiled once,
by SQLAlchemy, for the store's database, and runs on a driver connection kept between
enqueues, in a transaction of its own: ``BEGIN IMMEDIATE``, the INSERT, ``COMMIT`` on
SQLite; on a server one statement in autocommit mode, one round trip
(:meth:`~.dialects.base.DialectOps.run_enqueue`).

Only a plain job goes this way (:data:`PLAIN`): no ``session=``, no idempotency or unique
key, no dependencies, tags, metadata, expiry or batch, a payload kept in its row. Every
other job, and every job of ``enqueue_many``, is written through the engine.

The connections are the store's own, detached from the pool as the worker's claim
connection is: at most :attr:`KeptInserts.keep` of them (the pool's size), open between
enqueues; while all are in use, an enqueue goes through the engine and its pool. One the
server has closed since its last use is replaced before it is used
(:meth:`~.dialects.base.DialectOps.kept_alive`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .dialects import DialectOps
from .models import JobRow
from .models import jobs
from .models import utcnow
from .options import EnqueueOptions
from .options import job_values

#: The columns of a plain job's row: what ``job_values`` gives a job with no option set
#: (derived from it, so the two cannot drift). A row with any other column (tags, an
#: expiry, a unique key...) is written through the engine.
PLAIN = frozenset(job_values("plain", "", EnqueueOptions(), default_max_attempts=1, now=utcnow()))


def _to_db(value: Any, to_db: Callable[[Any], Any] | None, seen: dict[int, Any]) -> Any:
    """``value`` through its column's conversion; one object met again in the same row
    (a new job's ``run_at``, ``created_at`` and ``updated_at`` are one time) is
    converted once."""
    if to_db is None or value is None:
        return value
    done = seen.get(id(value))
    if done is None:
        done = seen[id(value)] = to_db(value)
    return done


class KeptInserts:
    """Plain one-job INSERTs, each in its own transaction, on kept driver connections."""

    def __init__(self, engine: Engine, ops: DialectOps) -> None:
        self._engine = engine
        self._ops = ops
        dialect = engine.dialect
        columns = sorted(PLAIN)
        compiled = ops.enqueue_statement().compile(dialect=dialect, column_keys=columns)
        self.sql = str(compiled)
        # The statement's own values (a NOTIFY's channel), then each column's, through
        # its type's conversion for this database (a time as SQLite's text, say).
        fixed = {name: b.effective_value for name, b in compiled.binds.items() if name not in PLAIN}
        convert: dict[str, Callable[[Any], Any] | None] = {
            name: jobs.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in columns
        }
        order = compiled.positiontup  # None for a named paramstyle (psycopg, PyMySQL)
        self._params: Callable[[Mapping[str, Any]], Any]
        if order is None:

            def named(values: Mapping[str, Any]) -> dict[str, Any]:
                params = dict(fixed)
                seen: dict[int, Any] = {}
                for name, to_db in convert.items():
                    params[name] = _to_db(values[name], to_db, seen)
                return params

            self._params = named
        else:
            steps = [(name, convert.get(name), fixed.get(name)) for name in order]

            def positional(values: Mapping[str, Any]) -> tuple[Any, ...]:
                params = []
                seen: dict[int, Any] = {}
                for name, to_db, value in steps:
                    if name in PLAIN:
                        value = _to_db(values[name], to_db, seen)
                    params.append(value)
                return tuple(params)

            self._params = positional
        self._dbapi_error: type[Exception] = engine.dialect.loaded_dbapi.Error
        #: Connections kept at most, in use or idle: the pool's size.
        self.keep = int(getattr(engine.pool, "size", lambda: 5)())
        self._idle: list[Any] = []
        self._open = 0
        #: One more at each :meth:`close`: a connection taken before it is not kept.
        self._era = 0
        self._lock = threading.Lock()

    def insert(self, values: JobRow) -> int | None:
        """Insert a plain job's row and commit it; returns its id, or ``None`` (nothing
        written) when all :attr:`keep` connections are in use.

        :raises sqlalchemy.exc.DBAPIError: the database refused it or could not be
            reached, as SQLAlchemy would raise it; the connection is not kept.
        """
        era = self._era
        conn = self._take()
        if conn is None:
            return None
        params = self._params(values)
        try:
            job_id = self._ops.run_enqueue(conn, self.sql, params)
        except self._dbapi_error as exc:
            self._discard(conn)
            dialect = self._engine.dialect
            raise sa.exc.DBAPIError.instance(
                self.sql,
                params,
                exc,
                self._dbapi_error,
                connection_invalidated=dialect.is_disconnect(exc, conn, None),  # type: ignore[arg-type]
                dialect=dialect,
            ) from exc
        except BaseException:
            self._discard(conn)
            raise
        with self._lock:
            if era == self._era:
                self._idle.append(conn)
                return job_id
        self._discard(conn)  # closed (:meth:`close`) while it ran
        return job_id

    def _take(self) -> Any:
        """An idle connection that is still alive, a new one, or ``None`` if all
        :attr:`keep` are in use."""
        while True:
            with self._lock:
                if self._idle:
                    conn = self._idle.pop()
                elif self._open < self.keep:
                    conn = None
                    self._open += 1
                else:
                    return None
            if conn is None:
                try:
                    return self._connect()
                except BaseException:
                    with self._lock:
                        self._open -= 1
                    raise
            if self._ops.kept_alive(conn):
                return conn
            self._discard(conn)

    def _connect(self) -> Any:
        # SQLAlchemy's pool opens it (the engine's connect events run, an error is
        # SQLAlchemy's), then lets go of it: the mode set below stays with it.
        proxied = self._engine.raw_connection()
        proxied.detach()
        conn = proxied.dbapi_connection
        self._ops.keep_connection(conn)
        return conn

    def _discard(self, conn: Any) -> None:
        with self._lock:
            self._open -= 1
        try:
            conn.close()
        except Exception:  # a connection already broken closes with an error, if at all
            pass

    def forked(self) -> list[Any]:
        """In a forked child: drop the idle connections, the parent's, without closing
        them, and return them; a lock a parent's thread held at the fork is replaced."""
        self._lock = threading.Lock()
        idle, self._idle = self._idle, []
        self._open = 0
        return idle

    def close(self) -> None:
        """Close the idle connections (one in use is closed when its enqueue ends, as
        a connection in use is by a pool's ``dispose``: it is not kept after)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._era += 1
        for conn in idle:
            self._discard(conn)

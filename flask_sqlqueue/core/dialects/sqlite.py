"""SQLite: one writer at a time, so claiming is safe without row locks.

Every transaction that writes starts with ``BEGIN IMMEDIATE``, which takes SQLite's
single write lock up front: two workers can never both read the same pending row and
then both update it, and a writer never fails half-way with SQLITE_BUSY on lock
upgrade (it waits up to the busy timeout at BEGIN instead). Reads run in plain
deferred transactions so they never wait for writers (WAL lets them run side by side).
The claim is a single ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING``.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from ...config import Settings
from ...exceptions import ConfigurationError
from .. import wakeup
from ..models import jobs
from .base import DialectOps
from .base import claim_update

_READ = "sqlqueue_read"
MIN_VERSION = (3, 35)


class SQLiteOps(DialectOps):
    name = "sqlite"
    insert = staticmethod(sqlite_insert)
    # One writer at a time (BEGIN IMMEDIATE): there is nothing to skip.
    skip_locked = False
    value_limit_source = "SQLite (its SQLITE_LIMIT_LENGTH)"

    def value_limit(self, conn: Connection) -> int:
        # SQLITE_LIMIT_LENGTH: a build may lower it from its default of 10**9 bytes.
        dbapi = conn.connection.dbapi_connection
        getlimit = getattr(dbapi, "getlimit", None)  # Python 3.11's sqlite3 has it
        if getlimit is None:
            return self.default_value_limit
        return int(getlimit(sqlite3.SQLITE_LIMIT_LENGTH))

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        if sqlite3.sqlite_version_info < MIN_VERSION:
            raise ConfigurationError(
                f"SQLite {sqlite3.sqlite_version} is too old: the queue's claim needs "
                "UPDATE ... RETURNING, from SQLite 3.35."
            )
        pragmas = (
            # The timeout first: switching to WAL needs a lock another process may hold.
            f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout * 1000)}",
            "PRAGMA journal_mode=WAL",
            f"PRAGMA synchronous={settings.sqlite_synchronous}",
        )

        # SQLAlchemy's documented recipe: stop pysqlite from issuing its own BEGIN,
        # then emit ours from the "begin" event.
        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            try:
                for pragma in pragmas:
                    cursor.execute(pragma)
            finally:
                cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            if conn.get_execution_options().get(_READ):
                conn.exec_driver_sql("BEGIN")
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    def claim_statement(self, candidates: sa.Select[tuple[int]]) -> sa.Update:
        return _claim_in(candidates)

    def listen(self, engine: Engine, wake: threading.Event, stop: threading.Event) -> None:
        wakeup.listen(wakeup.wake_dir(engine.url.database or ""), wake, stop)

    def read_options(self) -> dict[str, Any]:
        return {_READ: True}

    def add_seconds(
        self, moment: sa.ColumnElement[datetime], seconds: sa.ColumnElement[int]
    ) -> sa.ColumnElement[datetime]:
        # Times are stored as text, 'YYYY-MM-DD HH:MM:SS.ffffff': strftime() adds whole
        # seconds, and the fraction is copied, since SQLite's date functions keep only
        # milliseconds. The text then compares with stored times in order.
        modifier = sa.func.printf("%+d seconds", seconds)
        shifted = sa.func.strftime("%Y-%m-%d %H:%M:%S", moment, modifier, type_=sa.String)
        return sa.type_coerce(shifted.concat(sa.func.substr(moment, 20)), moment.type)

    def seconds_between(
        self, start: sa.ColumnElement[datetime], end: sa.ColumnElement[datetime]
    ) -> sa.ColumnElement[float]:
        # SQLite's date functions keep milliseconds; rounding to them drops the error of
        # julianday()'s floating point days.
        days = sa.func.julianday(end) - sa.func.julianday(start)
        return sa.type_coerce(sa.func.round(days * 86_400_000.0) / 1000.0, sa.Float)


@functools.lru_cache(maxsize=64)
def _claim_in(candidates: sa.Select[tuple[int]]) -> sa.Update:
    # One writer and one statement: the subquery's rows are still pending, and an outer
    # status test would make SQLite scan every pending row.
    return claim_update(jobs.c.id.in_(candidates.scalar_subquery()))

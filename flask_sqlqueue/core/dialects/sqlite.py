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
import os
import sqlite3
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from ...config import Settings
from ...exceptions import ConfigurationError
from .. import wakeup
from ..diagnosis import FAIL
from ..diagnosis import OK
from ..diagnosis import WARN
from ..diagnosis import Finding
from ..models import JobRow
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
    single_writer = True
    value_limit_source = "SQLite (its SQLITE_LIMIT_LENGTH)"

    def value_limit(self, conn: Connection) -> int:
        # SQLITE_LIMIT_LENGTH: a build may lower it from its default of 10**9 bytes.
        dbapi = conn.connection.dbapi_connection
        getlimit = getattr(dbapi, "getlimit", None)  # Python 3.11's sqlite3 has it
        if getlimit is None:
            return self.default_value_limit
        return int(getlimit(sqlite3.SQLITE_LIMIT_LENGTH))

    def engine_options(self, url: sa.URL, options: Mapping[str, Any]) -> dict[str, Any]:
        if self.in_memory(url):
            raise ConfigurationError(
                "An in-memory SQLite database cannot be shared by a worker; "
                "use a file: sqlite:///path/to/queue.db"
            )
        os.makedirs(os.path.dirname(os.path.abspath(url.database or "")) or ".", exist_ok=True)
        return dict(options)

    def in_folder(self, url: sa.URL, folder: str) -> sa.URL:
        name = url.database
        if (
            not name
            or name == ":memory:"
            or name.startswith("file:")  # an SQLite URI filename (?uri=true)
            or os.path.isabs(name)
        ):
            return url
        placed = os.path.join(folder, name)
        before = os.path.abspath(name)  # where the queue used to read it: the working directory
        if (
            before != os.path.abspath(placed)
            and os.path.exists(before)
            and not os.path.exists(placed)
        ):
            raise ConfigurationError(
                f"The database URL {url.render_as_string()!r} has a relative path, which is "
                f"read from the app's instance folder, as Flask-SQLAlchemy reads it: "
                f"{placed}. That file does not exist, but {before} (the same path from the "
                "working directory) does. Move that file to the instance folder, or write "
                f"its absolute path: sqlite:///{before}"
            )
        return url.set(database=placed)

    def in_memory(self, url: sa.URL) -> bool:
        # As Flask-SQLAlchemy tells one (it gives these a StaticPool: one connection).
        return url.database in (None, "", ":memory:")

    @classmethod
    def identity(cls, url: sa.URL) -> str:
        return "sqlite:" + os.path.realpath(url.database or ":memory:")

    def database_file(self, url: sa.URL) -> str | None:
        # An in-memory database is no file (abspath("") would be the working directory).
        return None if self.in_memory(url) else os.path.abspath(url.database or "")

    def wake_dir(self, url: sa.URL) -> Path | None:
        if self.in_memory(url):
            return None  # no worker waits on it: none can share it
        return wakeup.wake_dir(os.path.realpath(url.database or ""))

    def busy_error(self, reason: str) -> Exception:
        return sa.exc.OperationalError(
            "BEGIN IMMEDIATE", None, sqlite3.OperationalError(f"database is locked ({reason})")
        )

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        if sqlite3.sqlite_version_info < MIN_VERSION:
            raise ConfigurationError(
                f"SQLite {sqlite3.sqlite_version} is too old: the queue's claim needs "
                "UPDATE ... RETURNING, from SQLite 3.35."
            )
        if self.in_memory(engine.url):
            # An app's engine (SQLQUEUE_USE_APP_DATABASE), shared as it is: its one
            # connection is the app's as well, and keeps the app's settings. There is
            # no other writer to take a lock against.
            return
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

    kept_drivers = frozenset({"pysqlite"})

    # A kept connection runs the enqueue's INSERT alone, in autocommit mode (isolation
    # level None, set at connect): SQLite wraps the one statement in a write transaction
    # of its own, taken as BEGIN IMMEDIATE takes it (the busy handler waits for the write
    # lock before anything is read) and committed at its end. Two statements fewer per
    # enqueue than BEGIN IMMEDIATE, INSERT, COMMIT: DialectOps.run_enqueue.

    def claim_statement(self, candidates: sa.Select[tuple[int]]) -> sa.Update:
        return _claim_in(candidates)

    def read_options(self) -> dict[str, Any]:
        return {_READ: True}

    def insert_plain(self, conn: Connection, rows: list[JobRow]) -> list[int]:
        # SQLAlchemy cannot match RETURNING rows to parameters on SQLite, so with
        # sort_by_parameter_order it inserts a row at a time. It need not: under the
        # single write lock each row gets the next rowid in insert order (with
        # AUTOINCREMENT, one past the largest ever given), so the ids in ascending
        # order are the rows' ids in order.
        result = conn.execute(sa.insert(jobs).returning(jobs.c.id), rows)
        return sorted(int(job_id) for job_id in result.scalars())

    def diagnose(self, conn: Connection) -> list[Finding]:
        found = [Finding(OK, f"SQLite {sqlite3.sqlite_version}")]
        if self.in_memory(conn.engine.url):  # the app's (configure_engine): no file to tune
            fix = "run its jobs with SQLQUEUE_EAGER or drain(); a worker needs a database file"
            return [*found, Finding(WARN, "an in-memory database: no worker can share it", fix)]
        journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
        synchronous = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
        if str(journal).lower() == "wal":
            found.append(Finding(OK, "journal_mode=wal"))
        else:
            found.append(
                Finding(
                    FAIL,
                    f"journal_mode={journal}",
                    "the queue sets WAL itself; is the file "
                    "on a filesystem without shared memory (NFS, SMB)?",
                )
            )
        names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        level = names.get(int(synchronous), str(synchronous))
        if int(synchronous) >= 2:
            found.append(Finding(OK, f"synchronous={level}: a committed job survives power loss"))
        else:
            found.append(
                Finding(
                    WARN,
                    f"synchronous={level}: the last commits may be lost on power loss",
                    "SQLQUEUE_SQLITE_SYNCHRONOUS = 'FULL'",
                )
            )
        if int(busy) > 0:
            found.append(Finding(OK, f"busy_timeout={busy} ms"))
        else:
            found.append(
                Finding(
                    FAIL,
                    "busy_timeout=0: writers fail at once when another holds the lock",
                    "SQLQUEUE_SQLITE_BUSY_TIMEOUT = 30",
                )
            )
        return found

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

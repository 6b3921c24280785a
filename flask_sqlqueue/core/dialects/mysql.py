"""MariaDB and MySQL: ``SELECT … FOR UPDATE SKIP LOCKED``, then ``UPDATE`` by id.

MariaDB has no ``UPDATE … RETURNING``, so the claim locks its candidates first (skipping
rows other claimers hold), updates exactly those ids, and reads them back, all in the
caller's transaction; the row locks keep other claimers off until it commits.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Connection

from ...exceptions import UnsupportedDatabase
from .. import wakeup
from ..models import JobRow
from ..models import effects
from ..models import jobs
from ..models import limits as limits_table
from .base import CLAIM_COLUMNS
from .base import COMPLETED
from .base import PENDING
from .base import RUNNING
from .base import Done
from .base import ServerOps
from .base import claim_order
from .base import claim_values
from .base import listed

_STATEMENT_ROOM = 64 * 1024
_ESCAPED = ("\\", "'", '"', "\0", "\n", "\r", "\x1a")


class MySQLOps(ServerOps):
    name = "mysql"
    clock_query = "SELECT UTC_TIMESTAMP(6)"
    # The whole statement must fit in one packet: MariaDB's default max_allowed_packet,
    # less room for the statement's other columns.
    default_value_limit = 16 * 2**20 - _STATEMENT_ROOM
    value_limit_source = "MariaDB (its max_allowed_packet, less 64 KiB for the statement)"

    def wake_dir(self, url: sa.URL) -> Path | None:
        # No LISTEN/NOTIFY here: the workers and waiters on this host are woken as
        # SQLite's are; those on other hosts find new jobs, and finished ones, when they
        # next poll (a waiter: every ``poll_interval`` of ``Job.wait``).
        return wakeup.wake_dir(self.identity(url))

    def value_limit(self, conn: Connection) -> int:
        packet = conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one()
        return max(0, int(packet) - _STATEMENT_ROOM)

    def value_size(self, text: str) -> int:
        # PyMySQL sends values inside the statement's text, escaping quotes, backslashes
        # and control characters with a backslash each.
        escaped = sum(text.count(char) for char in _ESCAPED)
        return len(text.encode("utf-8", "surrogatepass")) + escaped

    def check_server(self, conn: Connection) -> None:
        version = tuple(conn.dialect.server_version_info or (0,))
        is_mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
        needed = (10, 6) if is_mariadb else (8, 0)
        if version[:2] < needed:
            name = "MariaDB" if is_mariadb else "MySQL"
            raise UnsupportedDatabase(
                f"{name} {'.'.join(map(str, version))} (SKIP LOCKED needs "
                f"{'.'.join(map(str, needed))} or newer)",
                supported=["postgresql>=9.5", "mariadb>=10.6", "mysql>=8.0", "sqlite>=3.35"],
            )

    # PyMySQL's socket is read to tell a connection the server closed (ServerOps).
    kept_drivers = frozenset({"pymysql"})

    def keep_connection(self, dbapi_connection: Any) -> None:
        # One statement, committed by itself: one round trip per enqueue.
        dbapi_connection.autocommit(True)

    def is_deadlock(self, exc: BaseException) -> bool:
        return _errno(exc) == _DEADLOCK

    def refuses_value(self, exc: BaseException) -> bool:
        return _errno(exc) in _TOO_LARGE

    def add_seconds(
        self, moment: sa.ColumnElement[datetime], seconds: sa.ColumnElement[int]
    ) -> sa.ColumnElement[datetime]:
        return sa.func.timestampadd(sa.literal_column("SECOND"), seconds, moment, type_=moment.type)

    def seconds_between(
        self, start: sa.ColumnElement[datetime], end: sa.ColumnElement[datetime]
    ) -> sa.ColumnElement[float]:
        elapsed = sa.func.timestampdiff(sa.literal_column("MICROSECOND"), start, end)
        return sa.type_coerce(elapsed / 1e6, sa.Float)

    def take(
        self,
        conn: Connection,
        candidates: sa.Select[tuple[int]],
        *,
        now: datetime,
        limit: int,
        worker_id: str,
        token: str,
    ) -> list[Any]:
        locked = _locked_skipping(candidates)
        ids = [row.id for row in conn.execute(locked, {"now": now, "limit": limit})]
        if not ids:
            return []
        return self.mark_claimed(conn, ids, worker_id=worker_id, token=token, now=now)

    def mark_claimed(
        self, conn: Connection, ids: Sequence[int], *, worker_id: str, token: str, now: datetime
    ) -> list[Any]:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
        )
        rows = conn.execute(
            sa.select(*CLAIM_COLUMNS).where(jobs.c.id.in_(ids), jobs.c.claim_token == token)
        ).all()
        return sorted(rows, key=claim_order)

    def complete_claimed(
        self, conn: Connection, done: Sequence[Done], now: datetime
    ) -> dict[int, bool]:
        """One UPDATE for the whole batch (no UPDATE … RETURNING here), of the jobs
        without dependents; its rowcount counts the rows it matched (SQLAlchemy sets
        CLIENT_FOUND_ROWS), so when it is the batch's size, every job was completed and
        none has dependents, as almost always. Else the batch is read back: the jobs
        completed by this very statement, at ``now`` (a job another attempt completed
        at the same microsecond would be counted too; either way nothing is written
        that should not be), and those still running on their claim, which have
        dependents (the statement left them), are completed by a second UPDATE. The
        ``id IN`` range walks the primary key upwards, which locks the rows in id
        order; the flag is read under that lock, as the write finds it."""
        alone = listed(done, now, alone=True)
        if sum(conn.execute(stmt, params).rowcount for stmt, params in alone) == len(done):
            return {job_id: False for job_id, _, _ in done}
        by_id = {item[0]: item for item in done}
        completed: dict[int, bool] = {}
        held: list[Done] = []
        for row in conn.execute(_READ_BACK, {"b_ids": list(by_id), "b_now": now}):
            if row.ours:
                completed[row.id] = False
            elif row.status == RUNNING and row.claim_token == by_id[row.id][1]:
                held.append(by_id[row.id])
        if held:
            matched = sum(conn.execute(stmt, params).rowcount for stmt, params in listed(held, now))
            ids = [job_id for job_id, _, _ in held]
            if matched != len(held):  # a claim lost in between: read which were completed
                ids = list(conn.execute(_COMPLETED_AT, {"b_ids": ids, "b_now": now}).scalars())
            completed.update(dict.fromkeys(ids, True))
        return completed

    def lock_buckets(self, conn: Connection, names: Sequence[str]) -> dict[str, Any]:
        """``INSERT … ON DUPLICATE KEY UPDATE`` takes the row's exclusive lock at once,
        whether it inserts or finds the row. (An insert-once that hits a duplicate takes
        a *shared* lock first; two claims that both then ask for the exclusive one
        deadlock.)"""
        if not names:
            return {}
        stmt = mysql_insert(limits_table).values([{"name": name, "starts": 0} for name in names])
        conn.execute(stmt.on_duplicate_key_update(name=stmt.inserted.name))
        rows = conn.execute(
            sa.select(limits_table)
            .where(limits_table.c.name.in_(names))
            .order_by(limits_table.c.name)
            .with_for_update()
        )
        return {row.name: row for row in rows}

    def insert_job(self, conn: Connection, values: JobRow) -> int | None:
        if values["idempotency_key"] is None:  # nothing to collide with: no savepoint
            return super().insert_job(conn, values)
        result = _insert_once(conn, _INSERT_JOB, values)
        return None if result is None else int(result.inserted_primary_key[0])  # type: ignore[index]

    def insert_unique(self, conn: Connection, values: JobRow, *, notify: bool = True) -> int | None:
        # A duplicate of either key is error 1062, caught in a savepoint. (No NOTIFY
        # here: the store wakes this host's workers after the commit.)
        result = _insert_once(conn, _INSERT_JOB, values)
        return None if result is None else int(result.inserted_primary_key[0])  # type: ignore[index]

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        values = {"key": key, "job_id": job_id, "created_at": now}
        return _insert_once(conn, _INSERT_EFFECT, values) is not None


_DUPLICATE_KEY = 1062
_DEADLOCK = 1213  # ER_LOCK_DEADLOCK: the server rolled the transaction back
# ER_NET_PACKET_TOO_LARGE, ER_WARN_ALLOWED_PACKET_OVERFLOWED. A statement over
# max_allowed_packet is as often seen as a lost connection (the server closes it while
# the client still sends); the worker tells that apart by the database answering others.
_TOO_LARGE = (1153, 1301)


@functools.lru_cache(maxsize=64)
def _locked_skipping(candidates: sa.Select[tuple[int]]) -> sa.Select[tuple[int]]:
    # Built once per candidates statement, as the other databases' claims are. (Only
    # here: skip_locked stays False, so a limited claim locks its candidates blocking.)
    return candidates.with_for_update(skip_locked=True)


def _errno(exc: BaseException) -> object:
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args else None


# Which of a batch the completion just wrote (see MySQLOps.complete_claimed).
_BATCH = jobs.c.id.in_(sa.bindparam("b_ids", expanding=True))
_WRITTEN_NOW = sa.and_(
    jobs.c.status == COMPLETED,
    jobs.c.claim_token.is_(None),
    jobs.c.finished_at == sa.bindparam("b_now", type_=jobs.c.finished_at.type),
)
_COMPLETED_AT = sa.select(jobs.c.id).where(_BATCH, _WRITTEN_NOW)
_READ_BACK = sa.select(
    jobs.c.id, jobs.c.status, jobs.c.claim_token, _WRITTEN_NOW.label("ours")
).where(_BATCH)

# Built once: constructing an INSERT per call cost more than executing it.
_INSERT_JOB = mysql_insert(jobs)
_INSERT_EFFECT = mysql_insert(effects)


def _insert_once(
    conn: Connection, stmt: sa.Insert, values: Mapping[str, Any]
) -> sa.CursorResult[Any] | None:
    """Insert, or ``None`` on a duplicate key.

    Not ``ON DUPLICATE KEY UPDATE``: with the FOUND_ROWS flag SQLAlchemy sets, its rowcount
    cannot tell an insert from a duplicate. A savepoint keeps the caller's transaction usable.
    A deadlock is raised as it is: the server rolled the whole transaction back, savepoint
    and all, so rolling back to the savepoint would fail and hide it.
    """
    savepoint = conn.begin_nested()
    try:
        result = conn.execute(stmt, values)
    except sa.exc.IntegrityError as exc:
        savepoint.rollback()
        if getattr(exc.orig, "args", (None,))[0] == _DUPLICATE_KEY:
            return None
        raise
    except sa.exc.DBAPIError as exc:
        if _errno(exc) != _DEADLOCK:
            savepoint.rollback()
        raise
    savepoint.commit()
    return result

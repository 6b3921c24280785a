"""SQLite: one writer at a time, so claiming is safe without row locks.

Every transaction that writes starts with ``BEGIN IMMEDIATE``, which takes SQLite's
single write lock up front: two workers can never both read the same pending row and
then both update it, and a writer never fails half-way with SQLITE_BUSY on lock
upgrade (it waits up to the busy timeout at BEGIN instead). Reads run in plain
deferred transactions so they never wait for writers (WAL lets them run side by side).
The claim is a single ``UPDATE … WHERE id IN (SELECT … LIMIT n) RETURNING``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from ...config import Settings
from ..models import effects
from ..models import jobs
from .base import CLAIM_COLUMNS
from .base import PENDING
from .base import DialectOps
from .base import claim_candidates
from .base import claim_order
from .base import claim_values

_READ = "sqlqueue_read"


class SQLiteOps(DialectOps):
    name = "sqlite"

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        pragmas = (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA synchronous={settings.sqlite_synchronous}",
            f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout * 1000)}",
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

    def read_options(self) -> dict[str, Any]:
        return {_READ: True}

    def claim(
        self,
        conn: Connection,
        *,
        worker_id: str,
        token: str,
        now: datetime,
        limit: int,
        queues: Sequence[str],
        tasks: Sequence[str],
    ) -> list[Any]:
        ids = claim_candidates(now, limit, queues, tasks).scalar_subquery()
        stmt = (
            sa.update(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
            .returning(*CLAIM_COLUMNS)
        )
        # RETURNING order is unspecified; restore the claim order.
        return sorted(conn.execute(stmt).all(), key=claim_order)

    def insert_job(self, conn: Connection, values: dict[str, Any]) -> int | None:
        stmt = sqlite_insert(jobs).values(values)
        if values.get("idempotency_key") is not None:
            stmt = stmt.on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        row = conn.execute(stmt.returning(jobs.c.id)).first()
        return None if row is None else int(row[0])

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        stmt = (
            sqlite_insert(effects)
            .values(key=key, job_id=job_id, created_at=now)
            .on_conflict_do_nothing(index_elements=[effects.c.key])
        )
        return conn.execute(stmt).rowcount == 1

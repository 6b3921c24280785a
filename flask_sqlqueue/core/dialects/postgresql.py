"""PostgreSQL: row locks with ``FOR UPDATE SKIP LOCKED``.

The inner SELECT locks the candidate rows and skips rows another worker has locked, so
concurrent claimers take disjoint sets without waiting; the outer UPDATE re-checks
``status = 'pending'`` because at READ COMMITTED a row may have changed between the
snapshot and the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from ..models import effects
from ..models import jobs
from .base import CLAIM_COLUMNS
from .base import PENDING
from .base import DialectOps
from .base import claim_candidates
from .base import claim_order
from .base import claim_values


class PostgresOps(DialectOps):
    name = "postgresql"

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
        ids = (
            claim_candidates(now, limit, queues, tasks)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            sa.update(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
            .returning(*CLAIM_COLUMNS)
        )
        return sorted(conn.execute(stmt).all(), key=claim_order)

    def insert_job(self, conn: Connection, values: dict[str, Any]) -> int | None:
        stmt = pg_insert(jobs).values(values)
        if values.get("idempotency_key") is not None:
            stmt = stmt.on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        row = conn.execute(stmt.returning(jobs.c.id)).first()
        return None if row is None else int(row[0])

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        stmt = (
            pg_insert(effects)
            .values(key=key, job_id=job_id, created_at=now)
            .on_conflict_do_nothing(index_elements=[effects.c.key])
        )
        return conn.execute(stmt).rowcount == 1

"""What every database must provide: engine set-up, claiming, and insert-once writes.

Everything here works on a :class:`~sqlalchemy.engine.Connection` inside a transaction
the caller opened, so one dialect object serves the queue's own engine and a caller's
session alike. Statements that are the same on every database live here too; a
subclass overrides only what its database does differently.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import Row

from ...config import Settings
from ..models import JobStatus
from ..models import jobs

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value

#: The columns a worker needs to run a job it has just claimed.
CLAIM_COLUMNS = (
    jobs.c.id,
    jobs.c.queue,
    jobs.c.task,
    jobs.c.payload,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.run_at,
    jobs.c.created_at,
    jobs.c.idempotency_key,
    jobs.c.claim_token,
)


def claim_candidates(
    now: datetime, limit: int, queues: Sequence[str], tasks: Sequence[str]
) -> sa.Select[tuple[int]]:
    """The ids of the next eligible jobs, in the order the contract promises."""
    query = sa.select(jobs.c.id).where(jobs.c.status == PENDING, jobs.c.run_at <= now)
    if queues:
        query = query.where(jobs.c.queue.in_(queues))
    return (
        query.where(jobs.c.task.in_(tasks))
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )


def claim_values(worker_id: str, token: str, now: datetime) -> dict[str, Any]:
    return {
        "status": RUNNING,
        "attempts": jobs.c.attempts + 1,
        "worker_id": worker_id,
        "claim_token": token,
        "started_at": now,
        "updated_at": now,
    }


def claim_order(row: Row[Any]) -> tuple[int, datetime, int]:
    return (-row.priority, row.run_at, row.id)


class DialectOps:
    """The database-specific half of the queue. Subclasses set ``name``."""

    name: ClassVar[str]

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        """Install whatever connection set-up the database needs. Default: nothing."""

    def read_options(self) -> dict[str, Any]:
        """Execution options that mark a connection as read-only for :meth:`configure_engine`."""
        return {}

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
        """Mark up to ``limit`` eligible jobs running for this worker and return them in order."""
        raise NotImplementedError

    def insert_job(self, conn: Connection, values: dict[str, Any]) -> int | None:
        """Insert a job; return its id, or ``None`` if its idempotency key already exists."""
        raise NotImplementedError

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        """Insert an effect key; ``False`` if it was reserved before."""
        raise NotImplementedError

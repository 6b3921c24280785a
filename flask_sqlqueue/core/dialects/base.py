"""What every database must provide: engine set-up, claiming, and insert-once writes.

Everything here works on a :class:`~sqlalchemy.engine.Connection` inside a transaction
the caller opened, so one dialect object serves the queue's own engine and a caller's
session alike. Statements that are the same on every database live here too; a
subclass overrides only what its database does differently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
from ..models import effects
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


def claim_order(row: Row[Any]) -> tuple[int, int]:
    """Order within one claimed batch. Every job of a batch starts at once (a worker
    claims only as many as it has free threads), so priority, then id, is enough; no
    timestamp is decoded on the hot path, nor can a hand-edited one break a claim."""
    return (-row.priority, row.id)


def insert_once(stmt: Any, conn: Connection, unique: sa.Column[Any]) -> int | None:
    """``INSERT … ON CONFLICT DO NOTHING RETURNING id``: the new id, or ``None`` on a duplicate.

    RETURNING rather than rowcount, which some drivers report as -1 here.
    """
    row = conn.execute(
        stmt.on_conflict_do_nothing(index_elements=[unique]).returning(unique.table.c.id)
    ).first()
    return None if row is None else int(row[0])


class DialectOps:
    """The database-specific half of the queue. Subclasses set ``name`` and ``insert``.

    The defaults claim with one ``UPDATE … WHERE id IN (SELECT …) RETURNING`` and insert
    once with ``ON CONFLICT DO NOTHING``, which SQLite and PostgreSQL share.
    """

    name: ClassVar[str]
    #: The dialect's INSERT construct, which must offer ``on_conflict_do_nothing``.
    insert: ClassVar[Callable[..., Any]]
    #: Lock the candidate rows, skipping those another claimer holds.
    skip_locked: ClassVar[bool] = False

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        """Install whatever connection set-up the database needs. Default: nothing."""

    #: A query for the database's own current UTC time; ``None`` where the database
    #: runs on the worker's host and clock (SQLite).
    clock_query: ClassVar[str | None] = None

    def check_server(self, conn: Connection) -> None:
        """Refuse a server that cannot claim safely. Default: nothing to check."""

    def notify(self, conn: Connection) -> None:
        """Tell listening workers, on commit, that a job may be eligible. Default: no-op."""

    def listen(self, engine: Engine, wake: threading.Event, stop: threading.Event) -> None:
        """Set ``wake`` whenever another process enqueues, until ``stop`` is set.

        Runs on a thread of its own. Default: return at once; polling finds new jobs.
        """

    def read_options(self) -> dict[str, Any]:
        """Execution options that mark a transaction as read-only for :meth:`configure_engine`."""
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
        candidates = claim_candidates(now, limit, queues, tasks)
        if self.skip_locked:
            # ``= ANY(ARRAY(subquery))`` runs the subquery exactly once (an InitPlan).
            # PostgreSQL may re-run an ``IN (subquery)`` for every outer row (a nested-loop
            # semi join), and with SKIP LOCKED each run finds rows the previous one locked
            # past: ``LIMIT 1`` then claimed every pending job.
            locked = candidates.with_for_update(skip_locked=True).scalar_subquery()
            chosen = jobs.c.id == sa.any_(sa.func.array(locked))
        else:
            chosen = jobs.c.id.in_(candidates.scalar_subquery())
        stmt = (
            sa.update(jobs)
            # Re-check the status: at READ COMMITTED the row may have moved on since the
            # subquery's snapshot.
            .where(chosen, jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
            .returning(*CLAIM_COLUMNS)
        )
        # RETURNING order is unspecified; restore the claim order.
        return sorted(conn.execute(stmt).all(), key=claim_order)

    def insert_job(self, conn: Connection, values: dict[str, Any]) -> int | None:
        """Insert a job; return its id, or ``None`` if its idempotency key already exists."""
        return insert_once(type(self).insert(jobs).values(values), conn, jobs.c.idempotency_key)

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        """Insert an effect key; ``False`` if it was reserved before."""
        stmt = type(self).insert(effects).values(key=key, job_id=job_id, created_at=now)
        return insert_once(stmt, conn, effects.c.key) is not None

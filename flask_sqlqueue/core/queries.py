"""The read side, shared by the CLI and the admin blueprint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .jobs import Job
from .models import JobStatus
from .models import effects
from .models import jobs
from .models import workers


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Counts for one queue, by status, and how long its oldest eligible job has waited."""

    queue: str
    counts: dict[str, int]
    oldest_eligible: datetime | None


def status(conn: Connection, now: datetime) -> list[QueueStatus]:
    counts: dict[str, dict[str, int]] = {}
    for queue, state, n in conn.execute(
        sa.select(jobs.c.queue, jobs.c.status, sa.func.count()).group_by(
            jobs.c.queue, jobs.c.status
        )
    ):
        counts.setdefault(queue, {})[state] = n
    oldest = dict(
        conn.execute(
            sa.select(jobs.c.queue, sa.func.min(jobs.c.run_at))
            .where(jobs.c.status == JobStatus.PENDING.value, jobs.c.run_at <= now)
            .group_by(jobs.c.queue)
        ).all()
    )
    return [
        QueueStatus(queue, counts[queue], _aware(oldest.get(queue))) for queue in sorted(counts)
    ]


def _aware(value: Any) -> datetime | None:
    # min() over a column loses the column's type on some backends; restore UTC.
    if value is None:
        return None
    return jobs.c.run_at.type.process_result_value(value, None)  # type: ignore[no-any-return,attr-defined]


def pending_tasks(conn: Connection) -> list[tuple[str, int]]:
    """Names of tasks that have pending jobs, with how many."""
    return [
        (task, n)
        for task, n in conn.execute(
            sa.select(jobs.c.task, sa.func.count())
            .where(jobs.c.status == JobStatus.PENDING.value)
            .group_by(jobs.c.task)
            .order_by(jobs.c.task)
        )
    ]


def list_jobs(
    conn: Connection,
    *,
    loader: Callable[[int], Job | None] | None = None,
    status: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first; pass the last id seen as ``before_id`` for the next page."""
    query = sa.select(jobs)
    if status is not None:
        query = query.where(jobs.c.status == status)
    if queue is not None:
        query = query.where(jobs.c.queue == queue)
    if task is not None:
        query = query.where(jobs.c.task == task)
    if before_id is not None:
        query = query.where(jobs.c.id < before_id)
    rows = conn.execute(query.order_by(jobs.c.id.desc()).limit(limit)).all()
    return [Job.from_row(row, loader) for row in rows]


def job_effects(conn: Connection, job_id: int) -> list[tuple[str, datetime]]:
    """The effect keys a job has reserved, oldest first."""
    return [
        (row.key, row.created_at)
        for row in conn.execute(
            sa.select(effects.c.key, effects.c.created_at)
            .where(effects.c.job_id == job_id)
            .order_by(effects.c.id)
        )
    ]


def live_workers(conn: Connection) -> list[Any]:
    return list(conn.execute(sa.select(workers).order_by(workers.c.started_at)).all())

"""The read side, shared by the CLI and the admin blueprint."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
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


# -- the admin dashboard ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What the admin's job list is narrowed to; ``None`` or empty means "any"."""

    status: str | None = None
    queue: str | None = None
    task: str | None = None
    #: Matches a job id exactly, or a substring of its idempotency key or last error
    #: (ignoring case).
    text: str | None = None

    def where(self) -> Any:
        clauses: list[Any] = []
        if self.status:
            clauses.append(jobs.c.status == self.status)
        if self.queue:
            clauses.append(jobs.c.queue == self.queue)
        if self.task:
            clauses.append(jobs.c.task == self.task)
        if self.text:
            needle = self.text.lower()
            found = [
                sa.func.lower(jobs.c.idempotency_key).contains(needle, autoescape=True),
                sa.func.lower(jobs.c.last_error).contains(needle, autoescape=True),
            ]
            if self.text.isdigit() and int(self.text) < 2**63:
                found.append(jobs.c.id == int(self.text))
            clauses.append(sa.or_(*found))
        return sa.and_(sa.true(), *clauses)


def search_jobs(
    conn: Connection,
    where: JobFilter,
    *,
    loader: Callable[[int], Job | None] | None = None,
    before_id: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs matching ``where``, newest first; pass the last id seen as ``before_id``."""
    query = sa.select(jobs).where(where.where())
    if before_id is not None:
        query = query.where(jobs.c.id < before_id)
    rows = conn.execute(query.order_by(jobs.c.id.desc()).limit(limit)).all()
    return [Job.from_row(row, loader) for row in rows]


def count_jobs(conn: Connection, where: JobFilter) -> int:
    return int(conn.execute(sa.select(sa.func.count()).where(where.where())).scalar_one())


def job_ids(conn: Connection, where: JobFilter) -> list[int]:
    """Ids of every job matching ``where``, oldest first."""
    return list(
        conn.execute(sa.select(jobs.c.id).where(where.where()).order_by(jobs.c.id)).scalars()
    )


def task_names(conn: Connection) -> list[str]:
    """Every task name that has a job, for filter menus."""
    return list(conn.execute(sa.select(jobs.c.task).distinct().order_by(jobs.c.task)).scalars())


def running_jobs(conn: Connection, limit: int = 500) -> list[Any]:
    """Running jobs (id, task, queue, worker_id, started_at), longest running first."""
    return list(
        conn.execute(
            sa.select(jobs.c.id, jobs.c.task, jobs.c.queue, jobs.c.worker_id, jobs.c.started_at)
            .where(jobs.c.status == JobStatus.RUNNING.value)
            .order_by(jobs.c.started_at, jobs.c.id)
            .limit(limit)
        ).all()
    )


@dataclass(frozen=True, slots=True)
class Throughput:
    """Jobs finished per minute: ``starts[i]`` begins the minute of ``completed[i]``."""

    starts: list[datetime]
    completed: list[int]
    dead: list[int]


def throughput(conn: Connection, now: datetime, minutes: int = 60) -> Throughput:
    """Jobs that completed, and jobs that went dead, in each of the last ``minutes``
    minutes (the current one last). One scan, bucketed with portable CASE sums."""
    first = now.replace(second=0, microsecond=0) - timedelta(minutes=minutes - 1)
    edges = [first + timedelta(minutes=i) for i in range(minutes + 1)]
    buckets = [
        sa.func.sum(
            sa.case(
                (sa.and_(jobs.c.finished_at >= edges[i], jobs.c.finished_at < edges[i + 1]), 1),
                else_=0,
            )
        )
        for i in range(minutes)
    ]
    counts = {
        JobStatus.COMPLETED.value: [0] * minutes,
        JobStatus.DEAD.value: [0] * minutes,
    }
    rows = conn.execute(
        sa.select(jobs.c.status, *buckets)
        .where(jobs.c.status.in_(list(counts)), jobs.c.finished_at >= first)
        .group_by(jobs.c.status)
    ).all()
    for row in rows:
        counts[row[0]] = [int(n or 0) for n in row[1:]]
    return Throughput(edges[:-1], counts[JobStatus.COMPLETED.value], counts[JobStatus.DEAD.value])

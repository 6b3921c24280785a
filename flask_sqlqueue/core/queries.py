"""The read side, shared by the CLI and the admin blueprint."""

from __future__ import annotations

import json
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
    """Workers that have not stopped (a silent one is listed until it is declared lost)."""
    query = sa.select(workers).where(workers.c.stopped_at.is_(None))
    return list(conn.execute(query.order_by(workers.c.started_at)).all())


def gone_workers(conn: Connection, since: datetime) -> list[Any]:
    """Workers that stopped or were declared lost since ``since``, newest first."""
    query = sa.select(workers).where(workers.c.stopped_at >= since)
    return list(conn.execute(query.order_by(workers.c.stopped_at.desc())).all())


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


# -- the admin's charts and per-task metrics ----------------------------------------------
#
# Everything here reads through an index and is bounded by the span asked for, not by
# the size of the table: counts are range counts on (status, finished_at), created_at
# and started_at, and rows are fetched only with a limit.

#: Distinct values listed at most (a runaway producer could invent a name per job).
MAX_DISTINCT = 1000


def distinct_values(conn: Connection, column: str, limit: int = MAX_DISTINCT) -> list[str]:
    """Every value of the indexed ``jobs`` column ``column`` (``"queue"`` or ``"task"``),
    sorted: one index seek per value (a loose index scan as a recursive CTE), so the
    cost follows the number of values, not the number of jobs."""
    col = jobs.c[column]
    first = sa.select(sa.func.min(col).label("value"), sa.literal(1).label("n"))
    found = first.cte("sqlqueue_distinct", recursive=True)
    following = (
        sa.select(sa.func.min(col)).where(col > found.c.value).scalar_subquery().label("value")
    )
    found = found.union_all(
        sa.select(following, (found.c.n + 1).label("n")).where(
            found.c.value.is_not(None), found.c.n < limit
        )
    )
    values = conn.execute(sa.select(found.c.value).where(found.c.value.is_not(None))).scalars()
    return sorted(values)


def effects_by_job(conn: Connection, job_ids: list[int]) -> dict[int, list[tuple[str, datetime]]]:
    """The effect keys each of ``job_ids`` has reserved, oldest first."""
    found: dict[int, list[tuple[str, datetime]]] = {}
    if not job_ids:
        return found
    rows = conn.execute(
        sa.select(effects.c.job_id, effects.c.key, effects.c.created_at)
        .where(effects.c.job_id.in_(job_ids))
        .order_by(effects.c.id)
    )
    for job_id, key, created_at in rows:
        found.setdefault(job_id, []).append((key, created_at))
    return found


@dataclass(frozen=True, slots=True)
class Activity:
    """What happened in each bucket of a span; bucket ``i`` is ``[starts[i], starts[i] + step)``.

    ``completed``: jobs that completed in the bucket. ``failed``: failed attempts in the
    bucket, read from the jobs' error histories (a job retried three times counts three
    times, whether it is now pending, completed or dead). ``waiting``: jobs created and
    not yet started at the bucket's end, rebuilt backwards from the pending jobs of now
    with ``created_at`` and ``started_at`` (approximate: a retried job counts as waiting
    from its creation until its latest attempt started; deleted jobs are left out).
    """

    starts: list[datetime]
    step: timedelta
    completed: list[int]
    failed: list[int]
    waiting: list[int]
    #: The failure scan stopped at its row limit: ``failed`` is a lower bound.
    failed_partial: bool = False


def _floor(moment: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    return datetime.fromtimestamp(moment.timestamp() // seconds * seconds, moment.tzinfo)


def _range_counts(conn: Connection, column: Any, edges: list[datetime], *where: Any) -> list[int]:
    # One statement of scalar subqueries, each an index range count: portable, and the
    # work follows the rows in the span, not a CASE per row per bucket.
    counts = [
        sa.select(sa.func.count())
        .select_from(jobs)
        .where(*where, column >= edges[i], column < edges[i + 1])
        .scalar_subquery()
        for i in range(len(edges) - 1)
    ]
    return [int(n or 0) for n in conn.execute(sa.select(*counts)).one()]


def activity(
    conn: Connection,
    now: datetime,
    *,
    span: timedelta = timedelta(hours=1),
    step: timedelta = timedelta(minutes=1),
    failure_rows: int = 20_000,
) -> Activity:
    """Completed jobs, failed attempts and waiting jobs per ``step`` over the last
    ``span``, the bucket holding ``now`` last. See :class:`Activity` for what each
    counts. At most ``failure_rows`` error histories are read."""
    buckets = max(int(span / step), 1)
    end = _floor(now, step) + step
    edges = [end - (buckets - i) * step for i in range(buckets + 1)]
    completed = _range_counts(
        conn, jobs.c.finished_at, edges, jobs.c.status == JobStatus.COMPLETED.value
    )
    created = _range_counts(conn, jobs.c.created_at, edges)
    started = _range_counts(conn, jobs.c.started_at, edges)
    # A job cancelled before it ever started stops waiting when it is cancelled.
    cancelled = _range_counts(
        conn,
        jobs.c.finished_at,
        edges,
        jobs.c.status == JobStatus.CANCELLED.value,
        jobs.c.started_at.is_(None),
    )
    waiting_now = conn.execute(
        sa.select(sa.func.count()).where(
            jobs.c.status == JobStatus.PENDING.value, jobs.c.started_at.is_(None)
        )
    ).scalar_one()
    waiting = [0] * buckets
    level = int(waiting_now)
    for i in reversed(range(buckets)):
        waiting[i] = max(level, 0)
        level += started[i] + cancelled[i] - created[i]
    failed, partial = _failed_attempts(conn, edges, failure_rows)
    return Activity(edges[:-1], step, completed, failed, waiting, partial)


def _failed_attempts(conn: Connection, edges: list[datetime], limit: int) -> tuple[list[int], bool]:
    first, step = edges[0], edges[1] - edges[0]
    # Any job that failed an attempt since ``first`` was updated since then; it has
    # finished since then, or is still pending or running.
    finished = [JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value]
    queries = [
        sa.select(jobs.c.errors).where(
            jobs.c.status.in_(finished), jobs.c.finished_at >= first, jobs.c.errors.is_not(None)
        ),
        sa.select(jobs.c.errors).where(
            jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RUNNING.value]),
            jobs.c.updated_at >= first,
            jobs.c.errors.is_not(None),
        ),
    ]
    counts = [0] * (len(edges) - 1)
    read = 0
    for query in queries:
        for text in conn.execute(query.limit(limit - read + 1)).scalars():
            read += 1
            if read > limit:
                return counts, True
            for at in _error_times(text):
                if at >= first:
                    i = int((at - first) / step)
                    if i < len(counts):
                        counts[i] += 1
    return counts, False


def _error_times(text: str | None) -> list[datetime]:
    try:
        records = json.loads(text or "[]")
    except ValueError:
        return []
    times = []
    for record in records if isinstance(records, list) else []:
        at = record.get("at") if isinstance(record, dict) else None
        try:
            moment = datetime.fromisoformat(at) if isinstance(at, str) else None
        except ValueError:
            continue
        if moment is not None and moment.tzinfo is not None:
            times.append(moment)
    return times


@dataclass(frozen=True, slots=True)
class TaskMetrics:
    """One task's jobs that finished (completed or went dead) in a window.

    ``attempts`` counts every attempt those jobs made, the failed ones included; the
    timings come from the task's latest ``sampled`` completed jobs in the window:
    duration is ``finished_at - started_at`` of the successful attempt, wait is
    ``started_at - created_at`` (so it includes scheduled delays and retry backoff).
    """

    task: str
    completed: int
    dead: int
    attempts: int
    sampled: int
    p50: float | None
    p95: float | None
    mean_wait: float | None

    @property
    def failed_attempts(self) -> int:
        # Each completed job made exactly one successful attempt.
        return max(self.attempts - self.completed, 0)

    @property
    def failure_rate(self) -> float | None:
        """Failed attempts / attempts, or ``None`` without attempts."""
        return self.failed_attempts / self.attempts if self.attempts else None


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile of ``values`` (sorted), ``None`` for no values."""
    if not values:
        return None
    rank = max(int(-(-fraction * len(values) // 1)), 1)
    return values[min(rank, len(values)) - 1]


def task_metrics(
    conn: Connection, since: datetime, *, sample: int = 1000, max_tasks: int = 200
) -> list[TaskMetrics]:
    """Per-task counts for jobs finished since ``since`` (exact), with duration
    percentiles and mean wait from each task's latest ``sample`` completed jobs."""
    finished = [JobStatus.COMPLETED.value, JobStatus.DEAD.value]
    counts: dict[str, dict[str, tuple[int, int]]] = {}
    for task, state, n, attempts in conn.execute(
        sa.select(jobs.c.task, jobs.c.status, sa.func.count(), sa.func.sum(jobs.c.attempts))
        .where(jobs.c.status.in_(finished), jobs.c.finished_at >= since)
        .group_by(jobs.c.task, jobs.c.status)
    ):
        counts.setdefault(task, {})[state] = (int(n), int(attempts or 0))
    metrics = []
    for task in sorted(counts)[:max_tasks]:
        done, done_attempts = counts[task].get(JobStatus.COMPLETED.value, (0, 0))
        dead, dead_attempts = counts[task].get(JobStatus.DEAD.value, (0, 0))
        rows = (
            conn.execute(
                sa.select(jobs.c.created_at, jobs.c.started_at, jobs.c.finished_at)
                .where(
                    jobs.c.task == task,
                    jobs.c.status == JobStatus.COMPLETED.value,
                    jobs.c.finished_at >= since,
                )
                .order_by(jobs.c.finished_at.desc())
                .limit(sample)
            ).all()
            if done
            else []
        )
        durations = sorted(
            (row.finished_at - row.started_at).total_seconds()
            for row in rows
            if row.started_at is not None
        )
        waits = [
            (row.started_at - row.created_at).total_seconds()
            for row in rows
            if row.started_at is not None
        ]
        metrics.append(
            TaskMetrics(
                task=task,
                completed=done,
                dead=dead,
                attempts=done_attempts + dead_attempts,
                sampled=len(durations),
                p50=percentile(durations, 0.5),
                p95=percentile(durations, 0.95),
                mean_wait=sum(waits) / len(waits) if waits else None,
            )
        )
    return metrics

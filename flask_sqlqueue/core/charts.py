"""The admin's charts and per-task metrics: what happened over a span of time.

Everything here reads through an index and is bounded by the span asked for, not by
the size of the table: counts are range counts on (status, finished_at), created_at
and started_at, and rows are fetched only with a limit. Time arithmetic is done by the
database (``DialectOps.add_seconds``, ``seconds_between``), so the statements are
built once per database.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import dialects
from .distinct import distinct_values
from .models import JobStatus
from .models import jobs


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
    #: The failure scan stopped at its row limit, or a history was longer than the
    #: part of it that is read (:data:`HISTORY_TAIL`): ``failed`` is a lower bound.
    failed_partial: bool = False


def _floor(moment: datetime, step: timedelta) -> datetime:
    seconds = step.total_seconds()
    return datetime.fromtimestamp(moment.timestamp() // seconds * seconds, moment.tzinfo)


#: What each per-bucket series counts: the timestamp column and extra conditions.
_SERIES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "completed": (jobs.c.finished_at, (jobs.c.status == JobStatus.COMPLETED.value,)),
    "created": (jobs.c.created_at, ()),
    "started": (jobs.c.started_at, ()),
    # A job cancelled before any attempt started stops waiting when it is cancelled.
    # (attempts = 0 rather than started_at IS NULL: planners would take the started_at
    # index for the NULLs and walk every pending and cancelled job per bucket.)
    "cancelled": (
        jobs.c.finished_at,
        (jobs.c.status == JobStatus.CANCELLED.value, jobs.c.attempts == 0),
    ),
}


@functools.cache
def _activity_statement(dialect: str) -> sa.Select[Any]:
    # One row per bucket, numbered by a recursive CTE; per series an index range count
    # between the bucket's edges, correlated to the row. The database counts index
    # entries (no expression per row, no hashing), the shape is the same for every
    # span, so it is compiled once per database, and the edges are computed in SQL from
    # three parameters instead of one parameter per bucket.
    ops = dialects.for_dialect(dialect)
    first = sa.select(sa.literal(0, sa.Integer).label("i")).cte("sqlqueue_buckets", recursive=True)
    steps = first.union_all(sa.select(first.c.i + 1).where(first.c.i + 1 < sa.bindparam("buckets")))
    origin = sa.bindparam("origin", type_=jobs.c.created_at.type)
    step = sa.bindparam("step", type_=sa.Integer)
    start = ops.add_seconds(origin, steps.c.i * step)
    end = ops.add_seconds(origin, (steps.c.i + 1) * step)
    counts = [
        sa.select(sa.func.count())
        .select_from(jobs)
        .where(*where, column >= start, column < end)
        .scalar_subquery()
        .label(name)
        for name, (column, where) in _SERIES.items()
    ]
    return sa.select(steps.c.i, *counts).order_by(steps.c.i)


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
    series: dict[str, list[int]] = {name: [0] * buckets for name in _SERIES}
    params = {"origin": edges[0], "step": int(step.total_seconds()), "buckets": buckets}
    # By the dialect's name: the statement is built once per database (see above).
    for row in conn.execute(_activity_statement(conn.dialect.name), params).mappings():
        for name in _SERIES:
            series[name][int(row["i"])] = int(row[name] or 0)
    completed, created, started, cancelled = (series[name] for name in _SERIES)
    waiting_now = conn.execute(
        sa.select(sa.func.count()).where(
            jobs.c.status == JobStatus.PENDING.value, jobs.c.attempts == 0
        )
    ).scalar_one()
    waiting = [0] * buckets
    level = int(waiting_now)
    for i in reversed(range(buckets)):
        waiting[i] = max(level, 0)
        level += started[i] + cancelled[i] - created[i]
    failed, partial = _failed_attempts(conn, edges, failure_rows)
    return Activity(edges[:-1], step, completed, failed, waiting, partial)


#: Characters read from the end of a job's error history for the failure chart. Records
#: are appended oldest first and each ends with its ``"at"``, so the end of a history
#: holds its latest failures without the tracebacks of the earlier ones (a history can
#: be megabytes, and the chart reads thousands of them).
HISTORY_TAIL = 4096


def _history_tail() -> tuple[Any, Any]:
    """The last :data:`HISTORY_TAIL` characters of ``errors``, cut in SQL, and whether
    anything was cut off."""
    length = sa.func.char_length(jobs.c.errors)
    start = length - (HISTORY_TAIL - 1)
    tail = sa.case(
        (length > HISTORY_TAIL, sa.func.substr(jobs.c.errors, start)), else_=jobs.c.errors
    )
    return tail.label("tail"), (length > HISTORY_TAIL).label("cut")


def _failed_attempts(conn: Connection, edges: list[datetime], limit: int) -> tuple[list[int], bool]:
    first, step = edges[0], edges[1] - edges[0]
    # Any job that failed an attempt since ``first`` was updated since then; it has
    # finished since then, or is still pending or running.
    finished = [JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value]
    columns = _history_tail()
    queries = [
        sa.select(*columns).where(
            jobs.c.status.in_(finished), jobs.c.finished_at >= first, jobs.c.errors.is_not(None)
        ),
        sa.select(*columns).where(
            jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RUNNING.value]),
            jobs.c.updated_at >= first,
            jobs.c.errors.is_not(None),
        ),
    ]
    counts = [0] * (len(edges) - 1)
    read = 0
    partial = False
    for query in queries:
        for text, cut in conn.execute(query.limit(limit - read + 1)):
            read += 1
            if read > limit:
                return counts, True
            times = _error_times(text)
            # A record cut off is older than the first one left: it could only be in
            # the span if that one is too.
            partial = partial or (bool(cut) and (not times or times[0] >= first))
            for at in times:
                if at >= first:
                    i = int((at - first) / step)
                    if i < len(counts):
                        counts[i] += 1
    return counts, partial


#: An ``"at"`` key of an error record. A quote inside a JSON string is always escaped,
#: so this matches keys only; it reads a history four times faster than json.loads,
#: which would decode every traceback just to throw it away.
_AT = re.compile(r'"at":\s*"([^"\\]*)"')


def _error_times(text: str | None) -> list[datetime]:
    times = []
    for at in _AT.findall(text or ""):
        try:
            moment = datetime.fromisoformat(at)
        except ValueError:
            continue
        if moment.tzinfo is not None:
            times.append(moment)
    return times


@dataclass(frozen=True, slots=True)
class TaskMetrics:
    """One task's jobs that finished (completed or went dead) in a window.

    ``completed`` and ``dead`` are exact counts. Everything else comes from the task's
    latest ``sample`` completed and latest ``sample`` dead jobs in the window: timings
    from the completed ones (duration is ``finished_at - started_at`` of the successful
    attempt, wait is ``started_at - created_at``, so it includes scheduled delays and
    retry backoff), and ``attempts``, every attempt the jobs made, failed ones included:
    exact when the samples hold every job of the window (``attempts_exact``), otherwise
    each status's count times its sample's mean attempts.
    """

    task: str
    completed: int
    dead: int
    attempts: int
    attempts_exact: bool
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


def _finished(status: str) -> Any:
    # The (task, status, finished_at) index holds every condition: a range per task.
    return sa.and_(
        jobs.c.task == sa.bindparam("task"),
        jobs.c.status == status,
        jobs.c.finished_at >= sa.bindparam("since", type_=jobs.c.finished_at.type),
    )


_COMPLETED = JobStatus.COMPLETED.value
_DEAD = JobStatus.DEAD.value
#: Statements of one shape, compiled once, run once per task.
_FINISHED_COUNTS = sa.select(
    *(
        sa.select(sa.func.count()).select_from(jobs).where(_finished(s)).scalar_subquery()
        for s in (_COMPLETED, _DEAD)
    )
)


@functools.cache
def _latest_completed(dialect: str) -> sa.Select[Any]:
    ops = dialects.for_dialect(dialect)
    return (
        sa.select(
            jobs.c.attempts,
            ops.seconds_between(jobs.c.started_at, jobs.c.finished_at).label("duration"),
            ops.seconds_between(jobs.c.created_at, jobs.c.started_at).label("wait"),
        )
        .where(_finished(_COMPLETED))
        .order_by(jobs.c.finished_at.desc())
        .limit(sa.bindparam("sample"))
    )


_LATEST_DEAD = (
    sa.select(jobs.c.attempts)
    .where(_finished(_DEAD))
    .order_by(jobs.c.finished_at.desc())
    .limit(sa.bindparam("sample"))
)


def task_metrics(
    conn: Connection, since: datetime, *, sample: int = 1000, max_tasks: int = 200
) -> list[TaskMetrics]:
    """Per-task exact counts of the jobs finished since ``since``, with attempts,
    duration percentiles and mean wait from each task's latest ``sample`` completed and
    dead jobs (see :class:`TaskMetrics`). Every statement is an index range per task:
    index-only for the counts, ``sample`` rows at most for the rest."""
    metrics = []
    for task in distinct_values(conn, "task", limit=max_tasks):
        params = {"task": task, "since": since, "sample": sample}
        done, dead = conn.execute(_FINISHED_COUNTS, params).one()
        if not done and not dead:
            continue
        latest = _latest_completed(conn.dialect.name)  # built once per database
        rows = conn.execute(latest, params).all() if done else []
        dead_attempts = list(conn.execute(_LATEST_DEAD, params).scalars()) if dead else []
        durations = sorted(float(d) for _, d, _ in rows if d is not None)
        waits = [float(w) for _, d, w in rows if d is not None and w is not None]
        exact = len(rows) == done and len(dead_attempts) == dead
        attempts = _scaled(done, [a for a, _, _ in rows]) + _scaled(dead, dead_attempts)
        metrics.append(
            TaskMetrics(
                task=task,
                completed=int(done),
                dead=int(dead),
                attempts=attempts,
                attempts_exact=exact,
                sampled=len(durations),
                p50=percentile(durations, 0.5),
                p95=percentile(durations, 0.95),
                mean_wait=sum(waits) / len(waits) if waits else None,
            )
        )
    return metrics


def _scaled(count: int, attempts: list[int]) -> int:
    """The attempts of ``count`` jobs, from a sample of theirs: exact when it is all."""
    if not attempts:
        return count  # no sample: at least one attempt each
    if len(attempts) >= count:
        return sum(attempts)
    return round(count * sum(attempts) / len(attempts))

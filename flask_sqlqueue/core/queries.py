"""The read side, shared by the CLI and the admin blueprint.

The admin's charts and per-task metrics are in ``charts.py``, and the listing of
distinct queue and task names in ``distinct.py``; what the admin reads of them is
re-exported here, so that it has one read-side namespace.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .charts import Activity as Activity
from .charts import activity as activity
from .charts import task_metrics as task_metrics
from .distinct import MAX_DISTINCT as MAX_DISTINCT
from .distinct import distinct_values as distinct_values
from .features import tags as _tags
from .features.dependencies import Edges as Edges
from .features.dependencies import job_edges as job_edges
from .jobs import UNDECODABLE
from .jobs import read_rows
from .models import JobStatus
from .models import effects
from .models import job_tags
from .models import jobs
from .models import workers


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """Counts for one queue, by status, and how long its oldest eligible job has waited."""

    queue: str
    counts: dict[str, int]
    oldest_eligible: datetime | None
    #: Pending jobs due now: what workers could start at once.
    eligible: int = 0
    #: What the oldest eligible job's ``run_at`` holds when no datetime can (a row
    #: edited by hand); ``oldest_eligible`` is ``None`` then (:func:`_eligible`).
    oldest_unreadable: str | None = None


class _Due(NamedTuple):
    """A queue's jobs due and waiting: the oldest one's ``run_at``, or what it holds if
    no datetime can (``unreadable``; ``oldest`` is ``None`` then), and how many."""

    oldest: datetime | None
    unreadable: str | None
    eligible: int


#: A queue with no job due.
_NONE_DUE = _Due(None, None, 0)


def status(conn: Connection, now: datetime) -> list[QueueStatus]:
    counts: dict[str, dict[str, int]] = {}
    for queue, state, n in conn.execute(
        sa.select(jobs.c.queue, jobs.c.status, sa.func.count()).group_by(
            jobs.c.queue, jobs.c.status
        )
    ):
        counts.setdefault(queue, {})[state] = n
    due = _eligible(conn, now)
    return [
        QueueStatus(queue, counts[queue], d.oldest, d.eligible, d.unreadable)
        for queue in sorted(counts)
        for d in [due.get(queue, _NONE_DUE)]
    ]


def _aware(value: Any) -> datetime | None:
    # min() over a column loses the column's type on some backends; restore UTC.
    if value is None:
        return None
    return jobs.c.run_at.type.process_result_value(value, None)  # type: ignore[no-any-return,attr-defined]


#: Pending jobs read per task when looking for ones no live worker claims; a count
#: that reaches it is shown as "at least".
COVERAGE_CAP = 1000


@dataclass(frozen=True, slots=True)
class Unserved:
    """Pending jobs of one task in one queue that no live worker claims."""

    queue: str
    task: str
    count: int
    #: ``count`` is a lower bound: the task's pending jobs were read up to a cap.
    capped: bool = False

    @property
    def shown(self) -> str:
        return f"{self.count}+" if self.capped else str(self.count)


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which pending jobs the live workers would run: ``live`` workers, and the
    pending jobs none of them would claim, by queue and task."""

    live: int
    unserved: list[Unserved]

    def warnings(self, registered: Collection[str]) -> list[tuple[str, str]]:
        """``(what, fix)`` for each group of unserved jobs, as an app that registers
        ``registered`` should say it. With no live worker at all, one line stands for
        the jobs the app's own workers would run."""
        found = []
        idle = 0
        capped = False
        for item in self.unserved:
            what = (
                f"{item.shown} pending job(s) of task {item.task!r} in queue "
                f"{item.queue!r}: no live worker runs them"
            )
            if item.task not in registered:
                fix = (
                    "this app does not register the task either: import the module that defines it"
                )
            elif not self.live:
                idle += item.count
                capped |= item.capped
                continue
            else:
                fix = (
                    f"start a worker that serves queue {item.queue!r}, or restart workers "
                    "that predate the task"
                )
            found.append((what, fix))
        if idle:
            count = f"{idle}+" if capped else str(idle)
            found.insert(
                0, (f"no live worker; {count} pending job(s) wait for one", "flask queue work")
            )
        return found


def coverage(conn: Connection, fresh: sa.ColumnElement[bool], cap: int = COVERAGE_CAP) -> Coverage:
    """The pending jobs that no live worker claims: no worker that serves their queue
    registers their task (a worker of an older deploy, a module the worker does not
    import, a queue no worker is started for). Live: not stopped, and ``fresh``
    (:func:`.roster.heartbeat_fresh`).

    Bounded however many jobs wait: a task that a live worker of every queue runs is
    not read at all; any other has at most ``cap`` pending jobs read, from the
    (task, status) index.
    """
    served = []
    for row in conn.execute(
        sa.select(workers.c.queues, workers.c.tasks).where(workers.c.stopped_at.is_(None), fresh)
    ):
        queues = frozenset(row.queues.split(",")) if row.queues else None
        served.append((queues, _task_names(row.tasks)))

    def runs(queue: str | None, task: str) -> bool:
        """Whether a live worker runs ``task`` in ``queue`` (``None``: in every queue)."""
        return any(
            (queues is None or queue in queues) and (tasks is None or task in tasks)
            for queues, tasks in served
        )

    unserved = []
    for task in distinct_values(conn, "task"):
        if runs(None, task):
            continue  # a worker of every queue runs it
        sample = (
            sa.select(jobs.c.queue)
            .where(jobs.c.task == task, jobs.c.status == JobStatus.PENDING.value)
            .limit(cap)
            .subquery()
        )
        rows = conn.execute(
            sa.select(sample.c.queue, sa.func.count())
            .group_by(sample.c.queue)
            .order_by(sample.c.queue)
        ).all()
        capped = sum(n for _, n in rows) >= cap
        unserved += [Unserved(q, task, n, capped) for q, n in rows if not runs(q, task)]
    unserved.sort(key=lambda item: (item.queue, item.task))
    return Coverage(len(served), unserved)


def _task_names(text: str | None) -> frozenset[str] | None:
    """A worker row's task names; ``None`` (every task) if unrecorded or unreadable."""
    try:
        names = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return frozenset(map(str, names)) if isinstance(names, list) else None


def list_jobs(
    conn: Connection,
    *,
    status: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    tag: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
    quarantined_at: int | None = None,
) -> list[JobSummary]:
    """Jobs newest first, as a list shows them (:class:`JobSummary`: no payload, result
    or history is read); pass the last id seen as ``before_id`` for the next page.

    :param tag: only jobs with exactly this tag (docs/tags.md).
    :param quarantined_at: only quarantined jobs: dead, with at least this many crashes
        (the crash budget, ``SQLQUEUE_MAX_CRASHES``).
    """
    query = sa.select(*_SUMMARY_COLUMNS)
    if quarantined_at is not None:
        query = query.where(jobs.c.status == JobStatus.DEAD.value)
        query = query.where(jobs.c.crashes >= quarantined_at)
    if status is not None:
        query = query.where(jobs.c.status == status)
    if queue is not None:
        query = query.where(jobs.c.queue == queue)
    if task is not None:
        query = query.where(jobs.c.task == task)
    if tag is not None:
        query = query.where(_tags.tagged(tag))
    if before_id is not None:
        query = query.where(jobs.c.id < before_id)
    rows = read_rows(conn, query.order_by(jobs.c.id.desc()).limit(limit))
    return [JobSummary(**row._mapping) for row in rows]


def quarantined(status: str, crashes: int, max_crashes: int) -> bool:
    """Whether a job is quarantined: dead, with its crash budget (``max_crashes``) spent
    (core/roster.py, ``rescue_stale``)."""
    return status == JobStatus.DEAD.value and crashes >= max_crashes


class Effect(NamedTuple):
    """An effect key a job reserved, and when its task marked it done (``None``: its
    outcome is unknown, see :meth:`JobContext.effect`)."""

    key: str
    reserved_at: datetime
    done_at: datetime | None


def job_effects(conn: Connection, job_id: int) -> list[Effect]:
    """The effect keys a job has reserved, oldest first."""
    return effects_by_job(conn, [job_id]).get(job_id, [])


def unsettled(found: list[Effect]) -> list[str]:
    """The keys of effects reserved but never marked done: before a dead job is replayed,
    someone must find out whether each happened (the replay will not repeat them). A
    job with none is safe to replay as far as its reserved effects go."""
    return [effect.key for effect in found if effect.done_at is None]


def replay_note(found: list[Effect]) -> str:
    """One line for a dead job's view: whether its reserved effects let it be replayed."""
    keys = unsettled(found)
    if not keys:
        return "safe to replay" + (" (every reserved effect is done)" if found else "")
    return f"reserved, outcome unknown: reconcile first: {', '.join(keys)}"


def live_workers(conn: Connection, fresh: sa.ColumnElement[bool]) -> list[Any]:
    """Workers that have not stopped (a silent one is listed until it is declared lost),
    each with ``fresh``: whether it heartbeated lately (:func:`.roster.heartbeat_fresh`)."""
    query = sa.select(workers, fresh.label("fresh")).where(workers.c.stopped_at.is_(None))
    return list(conn.execute(query.order_by(workers.c.started_at)).all())


def claimed_ahead(worker: Any) -> set[int]:
    """The jobs ``worker`` (a row of :func:`live_workers`) had claimed ahead of its free
    threads and not started at its last heartbeat (core/worker/dispatch.py)."""
    try:
        ids = json.loads(worker.claimed_ahead or "[]")
    except ValueError:  # edited by hand: show nothing rather than fail the page
        return set()
    return {i for i in ids if type(i) is int} if isinstance(ids, list) else set()


def gone_workers(conn: Connection, since: datetime) -> list[Any]:
    """Workers that stopped or were declared lost since ``since``, newest first."""
    query = sa.select(workers).where(workers.c.stopped_at >= since)
    return list(conn.execute(query.order_by(workers.c.stopped_at.desc())).all())


# -- the admin dashboard ------------------------------------------------------------------


#: Statuses whose jobs' error text ``?q=`` searches: the dead, and those waiting for
#: (or running) a retry. Finished jobs pile up by the million; these stay few.
ERROR_STATUSES = (JobStatus.DEAD.value, JobStatus.PENDING.value, JobStatus.RUNNING.value)
#: Above every code point: ``key >= q AND key < q + TOP`` is the range of keys starting
#: with ``q`` in code point order (SQLite's BINARY, PostgreSQL's "C" and ICU collations,
#: MariaDB's binary one), so the unique index on the key answers a prefix search.
_TOP = "\U0010ffff"


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What the admin's job list is narrowed to; ``None`` or empty means "any"."""

    status: str | None = None
    queue: str | None = None
    task: str | None = None
    #: Matches a job by id (all digits), by idempotency key (exactly, or keys starting
    #: with it, case-sensitive), or by a substring of its last error ignoring case,
    #: among jobs in :data:`ERROR_STATUSES`. Each through an index.
    text: str | None = None
    #: Jobs with exactly this tag (docs/tags.md), through the tags' index.
    tag: str | None = None

    def plain(self) -> list[Any]:
        """The status, queue, task and tag conditions."""
        clauses: list[Any] = []
        if self.status:
            clauses.append(jobs.c.status == self.status)
        if self.queue:
            clauses.append(jobs.c.queue == self.queue)
        if self.task:
            clauses.append(jobs.c.task == self.task)
        if self.tag:
            clauses.append(_tags.tagged(self.tag))
        return clauses

    def arms(self) -> list[Any]:
        """The free-text search as alternatives that each read through an index (the
        primary key, the key's unique index, the status index); empty without text."""
        error = self.error_arm()
        return [*self.lookup_arms(), *([] if error is None else [error])]

    def lookup_arms(self) -> list[Any]:
        """The id and idempotency-key alternatives: a few rows each, by index."""
        if not self.text:
            return []
        text = self.text
        found: list[Any] = []
        if text.isdecimal() and int(text) < 2**63:
            found.append(jobs.c.id == int(text))
        key = jobs.c.idempotency_key
        # The range uses the index; LIKE drops whatever else a collation puts in it.
        found.append(sa.and_(key >= text, key < text + _TOP, key.startswith(text, autoescape=True)))
        return found

    def error_arm(self) -> Any | None:
        """The error-text alternative, bounded by the status index to
        :data:`ERROR_STATUSES`; ``None`` without text or with another status."""
        statuses = [s for s in ERROR_STATUSES if not self.status or s == self.status]
        if not self.text or not statuses:
            return None
        return sa.and_(
            jobs.c.status.in_(statuses),
            sa.func.lower(jobs.c.last_error).contains(self.text.lower(), autoescape=True),
        )

    def where(self) -> Any:
        arms = self.arms()
        return sa.and_(sa.true(), *self.plain(), *([sa.or_(*arms)] if arms else []))


#: Characters of a job's last error and progress message that a list reads.
PREVIEW_CHARS = 200


@dataclass(frozen=True, slots=True)
class JobSummary:
    """What a list shows of a job: never its payload, result or error history, and only
    the first :data:`PREVIEW_CHARS` characters of its last error and progress message,
    cut in SQL, so a page costs the same whatever the jobs carry."""

    id: int
    queue: str
    task: str
    status: str
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    worker_id: str | None
    idempotency_key: str | None
    cancel_requested_at: datetime | None
    progress: float | None
    #: The first :data:`PREVIEW_CHARS` characters.
    progress_message: str | None
    #: The first :data:`PREVIEW_CHARS` characters.
    last_error: str | None
    #: Its tags (read as the row's JSON text, given as a list).
    tags: list[str]

    def __post_init__(self) -> None:
        raw: Any = self.tags
        object.__setattr__(self, "tags", _tags.read_tags(raw))

    #: Attempts taken back from a lost worker.
    rescues: int = 0
    #: Of them, those whose worker never reported in again (the crash budget).
    crashes: int = 0
    #: The columns that hold what no timestamp can be (edited by hand), each with its
    #: text; those fields are ``None`` (:func:`.jobs.read_rows`).
    unreadable: dict[str, str] = dataclasses.field(default_factory=dict)


def _preview(column: Any) -> Any:
    return sa.func.substr(column, 1, PREVIEW_CHARS).label(column.name)


_PREVIEWED = ("progress_message", "last_error")
_SUMMARY_COLUMNS = [
    *(
        jobs.c[f.name]
        for f in dataclasses.fields(JobSummary)
        if f.name not in (*_PREVIEWED, "unreadable")
    ),
    *(_preview(jobs.c[name]) for name in _PREVIEWED),
]


def search_jobs(
    conn: Connection,
    where: JobFilter,
    *,
    before_id: int | None = None,
    limit: int = 50,
    window: int | None = None,
) -> list[JobSummary]:
    """Jobs matching ``where``, newest first; pass the last id seen as ``before_id``.
    ``window``: jobs walked newest first before the filter's index is used (default
    :data:`SCAN_WINDOW`)."""
    window = SCAN_WINDOW if window is None else window

    def page(*clauses: Any, order: Any = jobs.c.id, n: int = limit) -> list[Any]:
        query = sa.select(*_SUMMARY_COLUMNS).where(*where.plain(), *clauses)
        if before_id is not None:
            query = query.where(jobs.c.id < before_id)
        return list(read_rows(conn, query.order_by(order.desc()).limit(n)))

    if not where.text and not where.plain():
        rows = page()
    elif where.tag and not where.text:
        rows = _tagged_page(conn, where, before_id, limit)
    elif not where.text:
        # Newest first along the primary key finds a common status, queue or task at
        # once, but walks every job for one that is rare (SQLite keeps no per-value
        # statistics to tell them apart). So walk only the newest ``window`` jobs that
        # way, and find the rest, if any, through the filter's index, sorting them.
        top = before_id if before_id is not None else _newest_id(conn) + 1
        rows = page(jobs.c.id >= top - window)
        if len(rows) < limit:
            older = jobs.c.id < top - window
            rows += page(older, order=jobs.c.id + 0, n=limit - len(rows))
    else:
        # One statement per alternative, merged here: for an OR of them ordered by id,
        # planners may walk the primary key backwards through every job for a rare match.
        found = {row.id: row for arm in where.lookup_arms() for row in page(arm)}
        error = where.error_arm()
        if error is not None:
            # Sorted by id + 0, which no index provides, for the same reason: without
            # per-value statistics SQLite guesses that a status holds a fifth of the
            # table, and would rather walk the primary key than sort.
            found.update((row.id, row) for row in page(error, order=jobs.c.id + 0))
        rows = [found[i] for i in sorted(found, reverse=True)[:limit]]
    return [JobSummary(**row._mapping) for row in rows]


def _tagged_page(
    conn: Connection, where: JobFilter, before_id: int | None, limit: int
) -> list[Any]:
    """A page of tagged jobs: the tag's jobs newest first, walked along the tags' index
    (tag, job id), whether the tag has few jobs or most of them."""
    assert where.tag
    query = (
        sa.select(*_SUMMARY_COLUMNS)
        .join_from(jobs, job_tags, job_tags.c.job_id == jobs.c.id)
        .where(
            job_tags.c.tag == where.tag,
            *JobFilter(status=where.status, queue=where.queue, task=where.task).plain(),
        )
    )
    if before_id is not None:
        query = query.where(job_tags.c.job_id < before_id)
    return list(read_rows(conn, query.order_by(job_tags.c.job_id.desc()).limit(limit)))


#: Jobs the filtered list walks newest first before it turns to the filter's index.
SCAN_WINDOW = 20_000


def _newest_id(conn: Connection) -> int:
    return int(conn.execute(sa.select(sa.func.max(jobs.c.id))).scalar() or 0)


def count_jobs(conn: Connection, where: JobFilter) -> int:
    """How many jobs match ``where`` (exact: give a status, or it may read them all)."""
    return int(conn.execute(sa.select(sa.func.count()).where(where.where())).scalar_one())


def job_ids(conn: Connection, where: JobFilter) -> list[int]:
    """Ids of every job matching ``where``, oldest first."""
    return list(
        conn.execute(sa.select(jobs.c.id).where(where.where()).order_by(jobs.c.id)).scalars()
    )


def running_jobs(conn: Connection, limit: int = 500) -> list[Any]:
    """Running jobs (id, task, queue, worker_id, started_at), longest running first."""
    # Sorted here, not in SQL: with ORDER BY started_at, planners walk the whole
    # started_at index (every job ever started) rather than sort the few running ones.
    rows = list(
        conn.execute(
            sa.select(jobs.c.id, jobs.c.task, jobs.c.queue, jobs.c.worker_id, jobs.c.started_at)
            .where(jobs.c.status == JobStatus.RUNNING.value)
            .limit(max(limit, 10_000))
        ).all()
    )
    rows.sort(key=lambda row: (row.started_at is None, row.started_at or 0, row.id))
    return rows[:limit]


def effects_by_job(conn: Connection, job_ids: list[int]) -> dict[int, list[Effect]]:
    """The effect keys each of ``job_ids`` has reserved, oldest first."""
    found: dict[int, list[Effect]] = {}
    if not job_ids:
        return found
    rows = conn.execute(
        sa.select(effects.c.job_id, effects.c.key, effects.c.created_at, effects.c.done_at)
        .where(effects.c.job_id.in_(job_ids))
        .order_by(effects.c.id)
    )
    for job_id, key, created_at, done_at in rows:
        found.setdefault(job_id, []).append(Effect(key, created_at, done_at))
    return found


#: Where the dashboard stops counting, per status: finished jobs pile up by the million
#: and counting them exactly would walk the whole index on every refresh.
COUNT_CAPS = {
    JobStatus.WAITING.value: 100_000,
    JobStatus.PENDING.value: 100_000,
    JobStatus.RUNNING.value: 100_000,
    JobStatus.DEAD.value: 100_000,
    JobStatus.COMPLETED.value: 10_000,
    JobStatus.CANCELLED.value: 10_000,
}


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """Counts for one queue by status, each exact up to its cap in :data:`COUNT_CAPS`
    (``capped`` names those that reached it), and its oldest eligible job's ``run_at``."""

    queue: str
    counts: dict[str, int]
    capped: frozenset[str]
    oldest_eligible: datetime | None
    #: As :attr:`QueueStatus.oldest_unreadable`.
    oldest_unreadable: str | None = None


def queue_counts(
    conn: Connection, now: datetime, caps: dict[str, int] | None = None
) -> list[QueueCounts]:
    """Per-queue counts read from the (queue, status) index, each stopping at its cap,
    so the cost is bounded by the caps times the queues, not by the size of the table."""
    caps = caps or COUNT_CAPS
    names = distinct_values(conn, "queue")
    if not names:
        return []
    cells = [(queue, state) for queue in names for state in caps]
    limited = [
        sa.select(sa.func.count())
        .select_from(
            sa.select(jobs.c.id)
            .where(jobs.c.queue == queue, jobs.c.status == state)
            .limit(caps[state])
            .subquery()
        )
        .scalar_subquery()
        for queue, state in cells
    ]
    row = conn.execute(sa.select(*limited)).one()
    counts: dict[str, dict[str, int]] = {queue: {} for queue in names}
    capped: dict[str, set[str]] = {queue: set() for queue in names}
    for (queue, state), n in zip(cells, row, strict=True):
        if n:
            counts[queue][state] = int(n)
        if n >= caps[state]:
            capped[queue].add(state)
    due = _eligible(conn, now)
    return [
        QueueCounts(q, counts[q], frozenset(capped[q]), d.oldest, d.unreadable)
        for q in names
        for d in [due.get(q, _NONE_DUE)]
    ]


def _eligible(conn: Connection, now: datetime) -> dict[str, _Due]:
    """Per queue with jobs due and waiting, :class:`_Due`; one range of the claim index.

    The one place the oldest ``run_at`` is read. A ``run_at`` edited by hand into what
    no datetime holds but that sorts as due (SQLite text such as ``'1999 by hand'``, a
    MariaDB zero date, PostgreSQL ``-infinity``) is the oldest of its queue and fails
    the read: then each queue is read on its own, and that queue's comes back as its text
    (as :func:`.jobs.read_rows` reads such a row), every other queue's as usual.
    """
    due = sa.and_(jobs.c.status == JobStatus.PENDING.value, jobs.c.run_at <= now)
    oldest = sa.func.min(jobs.c.run_at)
    query = sa.select(jobs.c.queue, oldest, sa.func.count()).where(due).group_by(jobs.c.queue)
    try:
        return {q: _Due(_aware(raw), None, int(n)) for q, raw, n in conn.execute(query)}
    except UNDECODABLE:
        pass  # a run_at edited by hand: each queue on its own
    found = {}
    as_text = query.with_only_columns(jobs.c.queue, sa.cast(oldest, sa.String), sa.func.count())
    for q, text, n in conn.execute(as_text):
        try:
            one = conn.execute(sa.select(oldest).where(due, jobs.c.queue == q)).scalar()
            found[q] = _Due(_aware(one), None, int(n))
        except UNDECODABLE:
            found[q] = _Due(None, str(text), int(n))
    return found


def cancel_requested_running(conn: Connection) -> list[int]:
    """Ids of running jobs asked to stop, oldest request first (through the status index:
    only running jobs are read)."""
    query = (
        sa.select(jobs.c.id)
        .where(jobs.c.status == JobStatus.RUNNING.value, jobs.c.cancel_requested_at.is_not(None))
        .order_by(jobs.c.cancel_requested_at, jobs.c.id)
    )
    return list(conn.execute(query).scalars())

"""What every database must provide: engine set-up, claiming, and insert-once writes.

Everything here works on a :class:`~sqlalchemy.engine.Connection` inside a transaction
the caller opened, so one dialect object serves the queue's own engine and a caller's
session alike. Statements that are the same on every database live here too; a
subclass overrides only what its database does differently.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import Row

from ...config import Settings
from ..limits import Bucket
from ..limits import TaskLimits
from ..limits import bucket_name
from ..limits import bucket_of
from ..limits import bucket_where
from ..limits import free_slots
from ..limits import rate_rows
from ..limits import running_counts
from ..limits import starts_in_window
from ..limits import window_start
from ..models import JobStatus
from ..models import effects
from ..models import jobs
from ..models import limits as limits_table
from ..queues import paused_names

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
    now: datetime | Any, limit: int | Any, queues: Sequence[str], tasks: Sequence[str]
) -> sa.Select[tuple[int]]:
    """The ids of the next eligible jobs, in the order the contract promises.

    Paused queues are filtered here, inside the claim's own statement, so a pause holds
    for every claim that starts after it commits (the subquery is a plain read, never a
    locking one, on every database).
    """
    query = sa.select(jobs.c.id).where(
        jobs.c.status == PENDING, jobs.c.run_at <= now, jobs.c.queue.not_in(paused_names())
    )
    if queues:
        query = query.where(jobs.c.queue.in_(queues))
    return (
        query.where(jobs.c.task.in_(tasks))
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim: which worker takes up to ``limit`` of which jobs, as of ``now``."""

    worker_id: str
    token: str
    now: datetime
    limit: int
    queues: tuple[str, ...]
    tasks: tuple[str, ...]


def claim_values(worker_id: str | Any, token: str | Any, now: datetime | Any) -> dict[str, Any]:
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


@functools.lru_cache(maxsize=64)
def _plain_claim(skip_locked: bool, queues: tuple[str, ...], tasks: tuple[str, ...]) -> Any:
    """The plain claim for one worker's queues and tasks, built once: building it per
    claim cost more than running it. ``now``, ``limit``, ``worker_id`` and ``token`` are
    bound per execution."""
    now = sa.bindparam("now", type_=jobs.c.run_at.type)
    candidates = claim_candidates(now, sa.bindparam("limit", type_=sa.Integer), queues, tasks)
    if skip_locked:
        # ``= ANY(ARRAY(subquery))`` runs the subquery exactly once (an InitPlan).
        # PostgreSQL may re-run an ``IN (subquery)`` for every outer row (a nested-loop
        # semi join), and with SKIP LOCKED each run finds rows the previous one locked
        # past: ``LIMIT 1`` then claimed every pending job.
        # No outer status test: locking a row that changed since the snapshot re-checks
        # the subquery's WHERE on its newest version (and skips it if no longer pending),
        # and the lock keeps it so. A test here also let PostgreSQL, with stale
        # statistics, find the rows by scanning every pending one instead of by id.
        locked = candidates.with_for_update(skip_locked=True).scalar_subquery()
        chosen = jobs.c.id == sa.any_(sa.func.array(locked))
    else:
        # One writer and one statement (SQLite): the subquery's rows are still
        # pending, and an outer status test would make SQLite scan every pending row.
        chosen = jobs.c.id.in_(candidates.scalar_subquery())
    values = claim_values(
        sa.bindparam("worker_id", type_=jobs.c.worker_id.type),
        sa.bindparam("token", type_=jobs.c.claim_token.type),
        now,
    )
    return sa.update(jobs).where(chosen).values(values).returning(*CLAIM_COLUMNS)


#: Looks at the head of the line per claim, each past the buckets the last found full.
_ROUNDS = 4


def _candidates(
    now: datetime, limit: int, queues: Sequence[str], tasks: Sequence[str], where: Any
) -> sa.Select[Any]:
    """Like :func:`claim_candidates`, with each job's task and key, narrowed by ``where``."""
    query = claim_candidates(now, limit, queues, tasks)
    return query.with_only_columns(jobs.c.id, jobs.c.task, jobs.c.concurrency_key).where(where)


def _excluding(full: set[Bucket], limited: Mapping[str, TaskLimits]) -> Any:
    if not full:
        return sa.true()
    return sa.not_(sa.or_(*(bucket_where(b, limited[b[0]]) for b in sorted(full, key=str))))


@functools.cache
def _insert_once_statement(insert: Callable[..., Any], unique: sa.Column[Any]) -> Any:
    # Built once: constructing the statement per call cost more than executing it.
    table = unique.table
    return insert(table).on_conflict_do_nothing(index_elements=[unique]).returning(table.c.id)


def insert_once(
    insert: Callable[..., Any], conn: Connection, unique: sa.Column[Any], values: dict[str, Any]
) -> int | None:
    """``INSERT … ON CONFLICT DO NOTHING RETURNING id``: the new id, or ``None`` on a duplicate.

    RETURNING rather than rowcount, which some drivers report as -1 here.
    """
    row = conn.execute(_insert_once_statement(insert, unique), values).first()
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

    def prepare_writer(self, conn: Connection) -> None:
        """Set up a connection a :class:`~flask_sqlqueue.core.store.Writer` keeps for
        itself (never returned to the pool). Default: nothing."""

    def check_server(self, conn: Connection) -> None:
        """Refuse a server that cannot claim safely. Default: nothing to check."""

    #: Bytes one text value may take before the server's own limit is read.
    default_value_limit: ClassVar[int] = 1_000_000_000
    #: Where :meth:`value_limit` comes from, as error messages name it.
    value_limit_source: ClassVar[str] = "this database"

    def value_limit(self, conn: Connection) -> int:
        """The most bytes (as :meth:`value_size` counts them) that one text value (a
        payload, a result, an error history) may take in a statement here. Default:
        :attr:`default_value_limit`."""
        return self.default_value_limit

    def value_size(self, text: str) -> int:
        """Bytes ``text`` takes in a statement, measured against :meth:`value_limit`:
        its UTF-8 length by default."""
        return len(text.encode("utf-8", "surrogatepass"))

    def notify(self, conn: Connection) -> None:
        """Tell listening workers, on commit, that a job may be eligible. Default: no-op."""

    def listen(self, engine: Engine, wake: threading.Event, stop: threading.Event) -> None:
        """Set ``wake`` whenever another process enqueues, until ``stop`` is set.

        Runs on a thread of its own. Default: return at once; polling finds new jobs.
        """

    def is_deadlock(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database ending a transaction to break a deadlock.
        Default: never (SQLite has one writer at a time)."""
        return False

    def refuses_value(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database refusing a statement for its size, which looks
        like a passing fault (an ``OperationalError``) but fails the same way every time.
        Default: never."""
        return False

    def read_options(self) -> dict[str, Any]:
        """Execution options that mark a transaction as read-only for :meth:`configure_engine`."""
        return {}

    def plan_per_execution(self, conn: Connection) -> None:
        """Have the rest of this transaction's statements planned with their actual
        parameters, for reads whose best plan depends on them (a time range, a status).
        Default: nothing to do."""

    def add_seconds(
        self, moment: sa.ColumnElement[datetime], seconds: sa.ColumnElement[int]
    ) -> sa.ColumnElement[datetime]:
        """``moment`` plus a whole number of ``seconds``, computed by the database and
        comparable with the queue's timestamp columns (so an index range can use it)."""
        raise NotImplementedError(f"{type(self).__name__} has no time arithmetic")

    def seconds_between(
        self, start: sa.ColumnElement[datetime], end: sa.ColumnElement[datetime]
    ) -> sa.ColumnElement[float]:
        """``end - start`` in seconds as a number, computed by the database (reading
        two timestamps per row into Python costs more than the query)."""
        raise NotImplementedError(f"{type(self).__name__} has no time arithmetic")

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
        limits: Mapping[str, TaskLimits] | None = None,
    ) -> list[Any]:
        """Mark up to ``limit`` eligible jobs running for this worker and return them in order.

        ``limits`` holds the concurrency and rate limits of the tasks that have them;
        their jobs are claimed only into free slots (see :meth:`claim_limited`).
        """
        request = ClaimRequest(worker_id, token, now, limit, tuple(queues), tuple(tasks))
        limited = {task: limits[task] for task in tasks if task in limits} if limits else {}
        if limited:
            return self.claim_limited(conn, request, limited)
        return self.claim_plain(conn, request)

    def claim_plain(self, conn: Connection, request: ClaimRequest) -> list[Any]:
        """The claim of a worker none of whose tasks is limited: one statement."""
        stmt = _plain_claim(self.skip_locked, request.queues, request.tasks)
        params = {
            "now": request.now,
            "limit": request.limit,
            "worker_id": request.worker_id,
            "token": request.token,
        }
        # RETURNING order is unspecified; restore the claim order.
        return sorted(conn.execute(stmt, params).all(), key=claim_order)

    def claim_limited(
        self, conn: Connection, request: ClaimRequest, limited: Mapping[str, TaskLimits]
    ) -> list[Any]:
        """The claim when some tasks have concurrency or rate limits, in three steps.

        1. Look (no locks) at the head of the line for the buckets it will take from,
           excluding buckets that are full and looking again, so a limited task's
           backlog never hides the jobs behind it.
        2. Lock those buckets' rows in ``sqlqueue_limits``, in name order so two claims
           can never wait for each other in a cycle, and blocking (not SKIP LOCKED):
           every claim of a bucket waits its turn, then counts the bucket's running
           jobs and its rate window, which the claims before it have committed.
        3. Lock candidates (SKIP LOCKED where the database has it) from the unlimited
           tasks and the buckets with free slots only, take them in order until the
           slots are used, and mark them running; record the rate windows' starts.

        Every claimed job's ``started_at`` is the claim's start: ``now``, or the start
        of a locked bucket's current window if a claim with a clock ahead of ours
        already opened it. Either way ``started_at`` lies in the window its start was
        counted in, so the starts per window can be checked from the jobs themselves.
        """
        now, limit, queues, tasks = request.now, request.limit, request.queues, request.tasks
        unlimited = [task for task in tasks if task not in limited]
        window = 2 * limit + 8

        def bucket(row: Any) -> Bucket:
            return bucket_of(row.task, row.concurrency_key, limited[row.task])

        # 1. Which buckets, from an unlocked look.
        wanted: set[Bucket] = set()
        full: set[Bucket] = set()
        free: dict[Bucket, int] = {}
        for _ in range(_ROUNDS):
            rows = conn.execute(
                _candidates(now, window, queues, tasks, _excluding(full, limited))
            ).all()
            fresh = list({bucket(r) for r in rows if r.task in limited} - set(free))
            running = running_counts(conn, fresh, limited)
            rates = rate_rows(conn, fresh)
            for b in fresh:
                free[b] = free_slots(b, limited[b[0]], running, rates, now)
            left, taken = dict(free), 0
            for row in rows:
                if row.task not in limited:
                    taken += 1
                elif left[bucket(row)] > 0:
                    left[bucket(row)] -= 1
                    wanted.add(bucket(row))
                    taken += 1
            full |= {b for b, n in left.items() if n <= 0}
            if taken >= limit or len(rows) < window:
                break

        # 2. Lock the buckets, then count what is free in each.
        buckets = sorted(wanted, key=bucket_name)
        locked = self.lock_buckets(conn, [bucket_name(b) for b in buckets])
        start = max([now, *(r.window_start for r in locked.values() if r.window_start)])
        running = running_counts(conn, buckets, limited)
        free = {
            # A bucket whose row we do not hold (none is ever deleted) is left alone.
            b: free_slots(b, limited[b[0]], running, locked, start)
            if bucket_name(b) in locked
            else 0
            for b in buckets
        }

        # 3. Lock candidates from the open buckets and the unlimited tasks; take in order.
        chosen: list[int] = []
        took: dict[Bucket, int] = {}
        seen: list[int] = []
        for _ in range(_ROUNDS):
            open_ = [b for b in buckets if free[b] > 0]
            if not unlimited and not open_:
                break
            allowed = sa.or_(
                jobs.c.task.in_(unlimited), *(bucket_where(b, limited[b[0]]) for b in open_)
            )
            if seen:
                allowed = sa.and_(allowed, jobs.c.id.not_in(seen))
            asked = 2 * (limit - len(chosen)) + 8
            stmt = _candidates(now, asked, queues, tasks, allowed)
            rows = conn.execute(stmt.with_for_update(skip_locked=self.skip_locked)).all()
            for row in rows:
                seen.append(row.id)
                if len(chosen) == limit:
                    break
                if row.task not in limited:
                    chosen.append(row.id)
                    continue
                b = bucket(row)
                if free.get(b, 0) > 0:
                    free[b] -= 1
                    took[b] = took.get(b, 0) + 1
                    chosen.append(row.id)
            if len(chosen) == limit or len(rows) < asked:
                break
        if not chosen:
            return []
        for b, n in took.items():
            lim = limited[b[0]]
            if lim.rate is not None:
                assert lim.period is not None
                name = bucket_name(b)
                counted = starts_in_window(locked.get(name), lim, start)
                conn.execute(
                    sa.update(limits_table)
                    .where(limits_table.c.name == name)
                    .values(window_start=window_start(start, lim.period), starts=counted + n)
                )
        return self.mark_claimed(
            conn, chosen, worker_id=request.worker_id, token=request.token, now=start
        )

    def lock_buckets(self, conn: Connection, names: Sequence[str]) -> dict[str, Any]:
        """Create the rows of ``names`` in ``sqlqueue_limits`` if missing and lock them,
        in the order given, until the transaction ends; return them by name.

        Default: ``INSERT … ON CONFLICT DO NOTHING``, then ``SELECT … FOR UPDATE``
        (which SQLite leaves out: ``BEGIN IMMEDIATE`` already made us its only writer).
        """
        if not names:
            return {}
        conn.execute(
            type(self)
            .insert(limits_table)
            .values([{"name": name, "starts": 0} for name in names])
            .on_conflict_do_nothing(index_elements=[limits_table.c.name])
        )
        rows = conn.execute(
            sa.select(limits_table)
            .where(limits_table.c.name.in_(names))
            .order_by(limits_table.c.name)
            .with_for_update()
        )
        return {row.name: row for row in rows}

    def mark_claimed(
        self, conn: Connection, ids: Sequence[int], *, worker_id: str, token: str, now: datetime
    ) -> list[Any]:
        """Mark the locked pending jobs ``ids`` running; return them in claim order."""
        stmt = (
            sa.update(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
            .returning(*CLAIM_COLUMNS)
        )
        return sorted(conn.execute(stmt).all(), key=claim_order)

    def insert_job(self, conn: Connection, values: dict[str, Any]) -> int | None:
        """Insert a job; return its id, or ``None`` if its idempotency key already exists."""
        return insert_once(type(self).insert, conn, jobs.c.idempotency_key, values)

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        """Insert an effect key; ``False`` if it was reserved before."""
        values = {"key": key, "job_id": job_id, "created_at": now}
        return insert_once(type(self).insert, conn, effects.c.key, values) is not None

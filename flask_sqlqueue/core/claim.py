"""The claim: which eligible jobs a worker takes, in the order the contract promises.

This is the dialect-neutral half of claiming: which jobs are candidates (pending, due,
in a queue that is not paused, of a task the worker runs), and, for tasks with
concurrency or rate limits, which buckets have free slots. How the chosen rows are
locked and marked running is each database's own SQL, behind
:class:`~.dialects.base.DialectOps` (``take``, ``lock_candidates``, ``lock_buckets``,
``mark_claimed``); the dialect modules explain why their claim is safe.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import DialectOps
from .features import bigpayloads
from .features.limits import Bucket
from .features.limits import TaskLimits
from .features.limits import bucket_name
from .features.limits import bucket_of
from .features.limits import bucket_where
from .features.limits import free_slots
from .features.limits import rate_rows
from .features.limits import running_counts
from .features.limits import starts_in_window
from .features.limits import window_start
from .jobs import ClaimedJob
from .models import JobStatus
from .models import jobs
from .models import limits as limits_table
from .models import queues as queues_table

#: Looks at the head of the line per claim, each past the buckets the last found full.
_ROUNDS = 4


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One claim: which worker takes up to ``limit`` of which jobs, as of ``now``.

    :param token: fences every write that finishes the attempts this claim starts.
    :param queues: the queues served; empty means every queue.
    :param tasks: the tasks the worker runs; a job of any other task is never claimed.
    :raises ValueError: ``limit`` is not a whole number of 1 or more.
    """

    worker_id: str
    token: str
    now: datetime
    limit: int
    queues: Sequence[str] = ()
    tasks: Sequence[str] = ()

    def __post_init__(self) -> None:
        if type(self.limit) is not int or self.limit < 1:
            raise ValueError(f"A claim takes 1 or more jobs, not limit={self.limit!r}.")
        # Tuples: the claim's statements are built once per (queues, tasks) and cached.
        object.__setattr__(self, "queues", tuple(self.queues))
        object.__setattr__(self, "tasks", tuple(self.tasks))


def claim(
    conn: Connection,
    ops: DialectOps,
    request: ClaimRequest,
    limits: Mapping[str, TaskLimits] | None = None,
) -> list[ClaimedJob]:
    """Mark up to ``request.limit`` eligible jobs running for this worker, in the
    caller's transaction, and return them in claim order (priority, then id): the
    claim's own rows, read by attribute (:class:`ClaimedJob` is their typed view).

    :param limits: the concurrency and rate limits of the tasks that have them; their
        jobs are claimed only into free slots (see :func:`_claim_limited`).
    """
    limited = {task: limits[task] for task in request.tasks if task in limits} if limits else {}
    if limited:
        return _claim_limited(conn, ops, request, limited)
    candidates = _plain_candidates(tuple(request.queues), tuple(request.tasks))
    rows = ops.take(
        conn,
        candidates,
        now=request.now,
        limit=request.limit,
        worker_id=request.worker_id,
        token=request.token,
    )
    # Payloads kept outside their rows: one more read, only when a claimed row has one.
    return bigpayloads.full(conn, rows)


def claim_job(
    conn: Connection, ops: DialectOps, job_id: int, *, worker_id: str, token: str, now: datetime
) -> ClaimedJob | None:
    """Claim the job ``job_id`` if it is still pending, whatever its queue or ``run_at``
    (eager mode runs a job the moment it is enqueued); ``None`` if it is not."""
    rows = ops.mark_claimed(conn, [job_id], worker_id=worker_id, token=token, now=now)
    return bigpayloads.full_row(conn, rows[0]) if rows else None


def paused_names() -> sa.Select[tuple[str]]:
    """Names of paused queues, as a subquery (see ``core/pausing.py``)."""
    return sa.select(queues_table.c.name).where(queues_table.c.paused_at.is_not(None))


def candidates(
    now: datetime | Any, limit: int | Any, queues: Sequence[str], tasks: Sequence[str]
) -> sa.Select[tuple[int]]:
    """The ids of the next eligible jobs, in the order the contract promises.

    Paused queues are filtered here, inside the claim's own statement, so a pause holds
    for every claim that starts after it commits (the subquery is a plain read, never a
    locking one, on every database).
    """
    query = sa.select(jobs.c.id).where(
        jobs.c.status == JobStatus.PENDING.value,
        jobs.c.run_at <= now,
        jobs.c.queue.not_in(paused_names()),
    )
    if queues:
        query = query.where(jobs.c.queue.in_(queues))
    return (
        query.where(jobs.c.task.in_(tasks))
        .order_by(jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id)
        .limit(limit)
    )


@functools.lru_cache(maxsize=64)
def _plain_candidates(queues: tuple[str, ...], tasks: tuple[str, ...]) -> sa.Select[tuple[int]]:
    """The candidates of one worker's plain claim, built once: building the claim per
    call cost more than running it. ``now`` and ``limit`` are bound per execution, and
    the dialects cache what they build on this statement."""
    now = sa.bindparam("now", type_=jobs.c.run_at.type)
    return candidates(now, sa.bindparam("limit", type_=sa.Integer), queues, tasks)


def _candidates(
    now: datetime, limit: int, queues: Sequence[str], tasks: Sequence[str], where: Any
) -> sa.Select[Any]:
    """Like :func:`candidates`, with each job's task and key, narrowed by ``where``."""
    query = candidates(now, limit, queues, tasks)
    return query.with_only_columns(jobs.c.id, jobs.c.task, jobs.c.concurrency_key).where(where)


def _excluding(full: set[Bucket], limited: Mapping[str, TaskLimits]) -> Any:
    if not full:
        return sa.true()
    return sa.not_(sa.or_(*(bucket_where(b, limited[b[0]]) for b in sorted(full, key=str))))


def _claim_limited(
    conn: Connection, ops: DialectOps, request: ClaimRequest, limited: Mapping[str, TaskLimits]
) -> list[ClaimedJob]:
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
    locked = ops.lock_buckets(conn, [bucket_name(b) for b in buckets])
    start = max([now, *(r.window_start for r in locked.values() if r.window_start)])
    running = running_counts(conn, buckets, limited)
    free = {
        # A bucket whose row we do not hold (none is ever deleted) is left alone.
        b: free_slots(b, limited[b[0]], running, locked, start) if bucket_name(b) in locked else 0
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
        rows = conn.execute(ops.lock_candidates(stmt)).all()
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
    claimed = ops.mark_claimed(
        conn, chosen, worker_id=request.worker_id, token=request.token, now=start
    )
    return bigpayloads.full(conn, claimed)

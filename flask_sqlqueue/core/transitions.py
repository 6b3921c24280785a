"""The transitions of a running attempt, each a guarded UPDATE whose rowcount is checked.

A guard names the state the caller believes the row is in (for a running attempt: its
id, ``running`` and the claim token). If the row moved on meanwhile, say a dead worker's
job was rescued and claimed again, the write matches nothing and changes nothing.
All functions take a connection inside a write transaction the caller owns. The worker
(and a running job's context) calls them; what a person does to jobs is in
core/actions.py, the workers' rows and their rescue in core/roster.py.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import DialectOps
from .dialects.base import COMPLETE_ONE
from .dialects.base import complete_one_params
from .failures import ErrorRecord
from .failures import appended
from .failures import summary
from .features import dependencies
from .models import JobRow
from .models import JobStatus
from .models import effects
from .models import jobs

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
DEAD = JobStatus.DEAD.value
CANCELLED = JobStatus.CANCELLED.value


def _claimed(job_id: int, token: str) -> Any:
    return sa.and_(jobs.c.id == job_id, jobs.c.status == RUNNING, jobs.c.claim_token == token)


_COMPLETE_ALONE = COMPLETE_ONE.where(sa.not_(jobs.c.has_dependents))


def complete(
    conn: Connection,
    job_id: int,
    token: str,
    result: str | None,
    now: datetime,
    *,
    ops: DialectOps | None = None,
) -> bool:
    """Finish a running attempt successfully, and release the dependents it was the last
    to wait for. ``False`` if the claim was lost.

    :param ops: to wake the workers (``NOTIFY`` on PostgreSQL) if it released any.
    """
    params = complete_one_params((job_id, token, result), now)
    # A job without dependents, as most are, in one statement; one with them (or whose
    # claim was lost) in a second, which reads the flag under the row's lock.
    if conn.execute(_COMPLETE_ALONE, params).rowcount == 1:
        return True
    if conn.execute(COMPLETE_ONE, params).rowcount != 1:
        return False
    _released(conn, ops, dependencies.release(conn, [job_id], now))
    return True


def _released(conn: Connection, ops: DialectOps | None, ids: Sequence[int]) -> None:
    if ids and ops is not None:
        ops.notify(conn)


def complete_many(
    conn: Connection, ops: DialectOps, done: Sequence[tuple[int, str, str | None]], now: datetime
) -> set[int]:
    """Finish several running attempts successfully in one transaction (a group commit),
    and release the dependents they were the last to wait for.

    ``done`` holds ``(job id, claim token, result)``; each job is fenced by its own claim
    exactly as :func:`complete` fences one. Returns the ids that were completed; any
    other lost its claim and nothing was written for it.

    One statement for the batch, the best each database has (``ops.complete_claimed``,
    which also tells waiters where the database carries such news), with the jobs in id
    order, so that rows are locked in that order. A job listed twice (a claim lost and
    the job claimed again) makes a second round: at most one of its tokens can hold the
    claim.
    """
    completed: set[int] = set()
    rounds: list[dict[int, tuple[int, str, str | None]]] = []
    for item in sorted(done, key=lambda item: item[0]):
        if item[1] is None:
            continue  # no claim to present: nothing to complete
        free = next((r for r in rounds if item[0] not in r), None)
        if free is None:
            free = {}
            rounds.append(free)
        free[item[0]] = item
    parents: list[int] = []
    for batch in rounds:
        for job_id, flagged in ops.complete_claimed(conn, list(batch.values()), now).items():
            completed.add(job_id)
            if flagged:
                parents.append(job_id)
    # The dependents they release, in the same transaction (core/features/dependencies.py).
    _released(conn, ops, dependencies.release(conn, parents, now))
    return completed


#: What an attempt that ends without completing leaves of its progress when the job
#: goes back to pending: nothing, so that a page does not show the last attempt's 100%
#: while the next one waits (a job that ends keeps its last attempt's, docs/progress.md).
NO_PROGRESS: JobRow = {"progress": None, "progress_message": None}


def fail(
    conn: Connection,
    job_id: int,
    token: str,
    record: ErrorRecord,
    retry_at: datetime | None,
    now: datetime,
    *,
    fits: Callable[[str], bool] | None = None,
) -> str | None:
    """Record a failed attempt: back to pending at ``retry_at``, or dead when it is ``None``
    (``cancelled`` instead of a retry if its cancellation was asked for). A job that ends
    cancels its waiting dependents.

    :param fits: whether a text value fits in this database (``Store.value_size``); the
        history keeps only the newest records that fit.
    :returns: the job's new status; ``None`` if the claim was lost (nothing is written then).
    """
    history = conn.execute(
        sa.select(jobs.c.errors, jobs.c.cancel_requested_at, jobs.c.has_dependents).where(
            _claimed(job_id, token)
        )
    ).first()
    if history is None:
        return None
    values: JobRow = {
        "last_error": summary(record),
        "errors": appended(history.errors, record, fits),
        "updated_at": now,
        "claim_token": None,
    }
    if retry_at is None:
        values |= {"status": DEAD, "finished_at": now}
    elif history.cancel_requested_at is not None:
        # Its cancellation was asked for: the failed attempt ends it instead of a retry.
        values |= {"status": CANCELLED, "finished_at": now}
    else:
        values |= {"status": PENDING, "run_at": retry_at, **NO_PROGRESS}
    done = conn.execute(sa.update(jobs).where(_claimed(job_id, token)).values(values))
    if done.rowcount != 1:
        return None
    status = str(values["status"])
    if status != PENDING and history.has_dependents:
        dependencies.cancel_dependents(conn, {job_id: status}, now)
    return status


def release(conn: Connection, job_id: int, token: str, now: datetime) -> bool:
    """Hand an unfinished attempt back to pending without counting it (graceful stop);
    a job whose cancellation was asked for ends ``cancelled`` instead, and so do its
    waiting dependents."""
    asked = jobs.c.cancel_requested_at.is_not(None)
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(
            status=sa.case((asked, CANCELLED), else_=PENDING),
            finished_at=sa.case((asked, now), else_=None),
            progress=sa.case((asked, jobs.c.progress), else_=None),
            progress_message=sa.case((asked, jobs.c.progress_message), else_=None),
            attempts=jobs.c.attempts - 1,
            releases=jobs.c.releases + 1,
            # run_at is kept: the job was due already and keeps its place in line.
            updated_at=now,
            worker_id=None,
            claim_token=None,
        )
    )
    if done.rowcount != 1:
        return False
    dependencies.settle(conn, [job_id], now)
    return True


def snooze(
    conn: Connection, job_id: int, token: str, run_at: datetime, now: datetime
) -> str | None:
    """Put a running attempt's job back to pending at ``run_at`` without counting the
    attempt (its task raised ``Snooze``): ``attempts`` goes back by one, ``snoozes`` up
    by one, ``last_error`` is left as it was. A job whose cancellation was asked for ends
    ``cancelled`` instead, and so do its waiting dependents.

    :returns: the job's new status; ``None`` if the claim was lost (nothing written).
    """
    row = conn.execute(
        sa.select(jobs.c.cancel_requested_at, jobs.c.has_dependents).where(_claimed(job_id, token))
    ).first()
    if row is None:
        return None
    values: dict[str, Any] = {
        "attempts": jobs.c.attempts - 1,
        "snoozes": jobs.c.snoozes + 1,
        "updated_at": now,
        "claim_token": None,
    }
    if row.cancel_requested_at is not None:
        values.update(status=CANCELLED, finished_at=now)
    else:
        values.update(status=PENDING, run_at=run_at, **NO_PROGRESS)
    if conn.execute(sa.update(jobs).where(_claimed(job_id, token)).values(values)).rowcount != 1:
        return None
    status = str(values["status"])
    if status != PENDING and row.has_dependents:
        dependencies.cancel_dependents(conn, {job_id: status}, now)
    return status


#: The error type in ``last_error`` of a job that expired before an attempt started.
EXPIRED_KIND = "Expired"


def expired_reason(expires_at: datetime, attempt: int) -> str:
    """``last_error`` of a job that expired before attempt ``attempt`` could start."""
    which = "it started" if attempt <= 1 else f"attempt {attempt} started"
    return f"{EXPIRED_KIND}: expired at {expires_at.isoformat(timespec='seconds')} before {which}"


def expire(
    conn: Connection, job_id: int, token: str, reason: str, now: datetime, *, first: bool
) -> bool:
    """End a claimed job that expired before its attempt started: ``cancelled`` with
    ``reason``, the attempt not counted (nor its start, if it was the ``first``: the job
    never started), and its waiting dependents settled as for a cancellation. ``False``
    if the claim was lost."""
    # ``first`` is the caller's, not a CASE on attempts: MariaDB evaluates an UPDATE's
    # assignments in order, so such a CASE would see attempts already decremented.
    started = {"started_at": None} if first else {}
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(
            status=CANCELLED,
            attempts=jobs.c.attempts - 1,
            last_error=reason,
            finished_at=now,
            updated_at=now,
            claim_token=None,
            **started,
        )
    )
    if done.rowcount != 1:
        return False
    dependencies.settle(conn, [job_id], now)
    return True


def expire_pending(
    conn: Connection, now: datetime, unserved: Sequence[tuple[str, str]], limit: int = 500
) -> list[int]:
    """End up to ``limit`` pending jobs of the ``(queue, task)`` pairs ``unserved`` whose
    expiry has passed, as :func:`expire` ends a claimed one (for the jobs no worker would
    claim; each pair is read from the (task, status) index). Returns the ids ended."""
    if not unserved:
        return []
    where = sa.or_(*(sa.and_(jobs.c.queue == q, jobs.c.task == t) for q, t in unserved))
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.attempts, jobs.c.expires_at)
        .where(
            jobs.c.status == PENDING,
            jobs.c.expires_at.is_not(None),
            jobs.c.expires_at <= now,
            where,
        )
        .order_by(jobs.c.id)
        .limit(limit)
        .with_for_update()
    ).all()
    ended = []
    for row in rows:
        done = conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == row.id, jobs.c.status == PENDING)
            .values(
                status=CANCELLED,
                last_error=expired_reason(row.expires_at, row.attempts + 1),
                finished_at=now,
                updated_at=now,
            )
        )
        if done.rowcount == 1:
            ended.append(row.id)
    dependencies.settle(conn, ended, now)
    return ended


def holds_claim(conn: Connection, job_id: int, token: str) -> bool:
    """Whether the attempt still holds its job's claim (asked before an effect)."""
    return conn.execute(sa.select(jobs.c.id).where(_claimed(job_id, token))).first() is not None


def cancel_requests(conn: Connection, ids: Sequence[int]) -> set[int]:
    """Which of these jobs are running with a cancellation asked for (for a worker to
    stop them: cooperatively through ``current_job``, or forcibly in process mode)."""
    if not ids:
        return set()
    return set(
        conn.execute(
            sa.select(jobs.c.id).where(
                jobs.c.id.in_(sorted(set(ids))),
                jobs.c.status == RUNNING,
                jobs.c.cancel_requested_at.is_not(None),
            )
        ).scalars()
    )


def finish_cancelled(conn: Connection, job_id: int, token: str, now: datetime) -> bool:
    """End a running attempt whose task stopped for a cancellation: ``cancelled``, not a
    failed attempt, and so are its waiting dependents. ``False`` if the claim was lost."""
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(status=CANCELLED, finished_at=now, updated_at=now, claim_token=None)
    )
    if done.rowcount != 1:
        return False
    dependencies.settle(conn, [job_id], now)
    return True


def set_progress(
    conn: Connection, job_id: int, token: str, fraction: float, message: str | None
) -> bool:
    """Record a running attempt's progress. ``False`` if the claim was lost."""
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(progress=fraction, progress_message=message)
    )
    return done.rowcount == 1


def mark_effect_done(conn: Connection, key: str, job_id: int, now: datetime) -> bool:
    """Record that job ``job_id`` did the effect it reserved as ``key``; ``False`` if it
    holds no such reservation (pruned, say) or it was marked before."""
    done = conn.execute(
        sa.update(effects)
        .where(effects.c.key == key, effects.c.job_id == job_id, effects.c.done_at.is_(None))
        .values(done_at=now)
    )
    return done.rowcount == 1

"""Every change of a job's state, each a guarded UPDATE whose rowcount is checked.

A guard names the state the caller believes the row is in (for a running attempt: its
id, ``running`` and the claim token). If the row moved on meanwhile, say a dead worker's
job was rescued and claimed again, the write matches nothing and changes nothing.
All functions take a connection inside a write transaction the caller owns.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..exceptions import SQLQueueError
from .models import JobStatus
from .models import jobs
from .models import workers
from .payload import decode_value
from .payload import dumps_trusted

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
COMPLETED = JobStatus.COMPLETED.value
DEAD = JobStatus.DEAD.value
CANCELLED = JobStatus.CANCELLED.value

#: What a task may set as its own backoff: attempt number (1-based) -> delay.
BackoffFunc = Callable[[int], "float | timedelta"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the next attempt after attempt ``k`` failed:
    ``min(cap, base * 2**k) + uniform(0, jitter)`` seconds."""

    base: float = 30.0
    cap: float = 3600.0
    jitter: float = 20.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        exponential = self.base * 2.0 ** min(attempt, 64)
        return min(self.cap, exponential) + (rng.uniform(0, self.jitter) if self.jitter else 0.0)


def error_record(
    attempt: int, kind: str, message: str, traceback: str, worker_id: str | None, now: datetime
) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "type": storable_text(kind),
        "message": storable_text(message),
        "traceback": storable_text(traceback),
        "worker": worker_id,
        "at": now.isoformat(),
    }


def storable_text(text: str) -> str:
    """``text`` with what some database cannot store written as escapes: NUL (PostgreSQL's
    text refuses it) and lone surrogates (no driver can encode them as UTF-8). A task's
    error message may hold either; left as is, its failure could not be recorded at all."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _claimed(job_id: int, token: str) -> Any:
    return sa.and_(jobs.c.id == job_id, jobs.c.status == RUNNING, jobs.c.claim_token == token)


def complete(conn: Connection, job_id: int, token: str, result: str | None, now: datetime) -> bool:
    """Finish a running attempt successfully. ``False`` if the claim was lost."""
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(status=COMPLETED, result=result, finished_at=now, updated_at=now, claim_token=None)
    )
    return done.rowcount == 1


def fail(
    conn: Connection,
    job_id: int,
    token: str,
    record: dict[str, Any],
    retry_at: datetime | None,
    now: datetime,
) -> bool:
    """Record a failed attempt: back to pending at ``retry_at``, or dead when it is ``None``.

    ``False`` if the claim was lost (nothing is written then).
    """
    history = conn.execute(sa.select(jobs.c.errors).where(_claimed(job_id, token))).first()
    if history is None:
        return False
    values: dict[str, Any] = {
        "last_error": _summary(record),
        "errors": _append(history.errors, record),
        "updated_at": now,
        "claim_token": None,
    }
    if retry_at is None:
        values.update(status=DEAD, finished_at=now)
    else:
        values.update(status=PENDING, run_at=retry_at)
    return conn.execute(sa.update(jobs).where(_claimed(job_id, token)).values(values)).rowcount == 1


def release(conn: Connection, job_id: int, token: str, now: datetime) -> bool:
    """Hand an unfinished attempt back to pending without counting it (graceful stop)."""
    done = conn.execute(
        sa.update(jobs)
        .where(_claimed(job_id, token))
        .values(
            status=PENDING,
            attempts=jobs.c.attempts - 1,
            releases=jobs.c.releases + 1,
            # run_at is kept: the job was due already and keeps its place in line.
            updated_at=now,
            worker_id=None,
            claim_token=None,
        )
    )
    return done.rowcount == 1


def holds_claim(conn: Connection, job_id: int, token: str) -> bool:
    return conn.execute(sa.select(jobs.c.id).where(_claimed(job_id, token))).first() is not None


def _summary(record: dict[str, Any]) -> str:
    return f"{record['type']}: {record['message']}" if record["message"] else record["type"]


def _append(history: str | None, record: dict[str, Any]) -> str:
    try:
        items = decode_value(history) or []
    except ValueError:
        items = []  # a history edited into nonsense is replaced, never allowed to block
    if not isinstance(items, list):
        items = []
    items.append(record)
    return dumps_trusted(items)


class InvalidTransition(SQLQueueError, ValueError):
    """An operation that does not apply to a job in its current state."""


def _lock_rows(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(ids)).with_for_update()
    ).all()
    return {row.id: row.status for row in rows}


def _check_all(
    conn: Connection, ids: Sequence[int], allowed: Iterable[str], verb: str, done: str
) -> None:
    """Refuse the whole batch, before writing anything, if any id is missing or not allowed."""
    found = _lock_rows(conn, ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise InvalidTransition(f"No job with id {', '.join(map(str, missing))}; nothing {done}.")
    allowed = set(allowed)
    wrong = [f"{i} is {found[i]}" for i in ids if found[i] not in allowed]
    if wrong:
        raise InvalidTransition(f"Cannot {verb} job {'; '.join(wrong)}; nothing {done}.")


def replay(conn: Connection, ids: Sequence[int], now: datetime) -> int:
    """Send dead or cancelled jobs back to pending with fresh attempts, to run now."""
    ids = sorted(set(ids))
    _check_all(conn, ids, (DEAD, CANCELLED), "replay", "replayed")
    return _replay_where(conn, jobs.c.id.in_(ids), now)


def replay_dead(conn: Connection, now: datetime, queue: str | None, task: str | None) -> int:
    """Replay every dead job, optionally only those of one queue and/or task."""
    where = jobs.c.status == DEAD
    if queue is not None:
        where &= jobs.c.queue == queue
    if task is not None:
        where &= jobs.c.task == task
    return _replay_where(conn, where, now)


def _replay_where(conn: Connection, where: Any, now: datetime) -> int:
    return conn.execute(
        sa.update(jobs)
        .where(where, jobs.c.status.in_((DEAD, CANCELLED)))
        .values(
            status=PENDING,
            attempts=0,
            rescues=0,
            run_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
            worker_id=None,
            claim_token=None,
            last_error=None,
        )
    ).rowcount


def cancel(conn: Connection, ids: Sequence[int], now: datetime) -> int:
    """Cancel pending jobs. Running jobs are refused: they cannot be stopped from here."""
    ids = sorted(set(ids))
    _check_all(conn, ids, (PENDING,), "cancel", "cancelled")
    return conn.execute(
        sa.update(jobs)
        .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
        .values(status=CANCELLED, finished_at=now, updated_at=now)
    ).rowcount


FINISHED = (COMPLETED, DEAD, CANCELLED)
#: How long a stopped or lost worker stays listed after it is gone.
GONE_WORKERS_KEPT = timedelta(days=1)


def purge(conn: Connection, status: str, before: datetime) -> int:
    """Delete finished jobs of one status last changed before ``before``."""
    if status not in FINISHED:
        raise InvalidTransition(
            f"Only finished jobs can be purged ({', '.join(FINISHED)}), not {status!r}."
        )
    return conn.execute(
        sa.delete(jobs).where(jobs.c.status == status, jobs.c.updated_at < before)
    ).rowcount


def delete(conn: Connection, ids: Sequence[int]) -> int:
    """Delete jobs that are not running."""
    ids = sorted(set(ids))
    _check_all(conn, ids, (PENDING, *FINISHED), "delete", "deleted")
    return conn.execute(
        sa.delete(jobs).where(jobs.c.id.in_(ids), jobs.c.status != RUNNING)
    ).rowcount


# -- workers and rescue ---------------------------------------------------------------


def register_worker(
    conn: Connection,
    worker_id: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    now: datetime,
) -> None:
    conn.execute(
        sa.insert(workers).values(
            id=worker_id,
            host=host,
            pid=pid,
            queues=",".join(queues),
            concurrency=concurrency,
            started_at=now,
            last_heartbeat_at=now,
        )
    )


def heartbeat(conn: Connection, worker_id: str, now: datetime) -> bool:
    """``False`` when the worker's row is gone: it was declared dead and must stop."""
    done = conn.execute(
        sa.update(workers)
        .where(workers.c.id == worker_id, workers.c.stopped_at.is_(None))
        .values(last_heartbeat_at=now)
    )
    return done.rowcount == 1


def unregister_worker(conn: Connection, worker_id: str, now: datetime) -> None:
    """Mark a worker stopped; its row stays a while so dashboards show it as gone."""
    conn.execute(
        sa.update(workers)
        .where(workers.c.id == worker_id, workers.c.stopped_at.is_(None))
        .values(stopped_at=now, stop_reason="stopped")
    )


def rescue_stale(
    conn: Connection, stale_before: datetime, now: datetime
) -> list[tuple[int, str, str]]:
    """Take back running jobs whose worker stopped heartbeating before ``stale_before``.

    The lost attempt counts (it may have crashed the worker: a poison pill must end
    dead, not loop). Returns ``(job id, new status, lost worker id)`` for each job.
    """
    live = sa.select(workers.c.id).where(
        workers.c.last_heartbeat_at >= stale_before, workers.c.stopped_at.is_(None)
    )
    lost = conn.execute(
        sa.select(
            jobs.c.id,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.worker_id,
            jobs.c.claim_token,
            jobs.c.errors,
        ).where(
            jobs.c.status == RUNNING,
            # A missing worker row counts as dead; the start guard covers a worker that
            # claims in the instant between registering and its first heartbeat.
            sa.or_(jobs.c.worker_id.is_(None), jobs.c.worker_id.not_in(live)),
            sa.or_(jobs.c.started_at.is_(None), jobs.c.started_at < stale_before),
        )
    ).all()
    rescued = []
    for row in lost:
        worker = row.worker_id or "unknown"
        record = error_record(
            row.attempts, "WorkerLost", f"worker lost: {worker}", "", row.worker_id, now
        )
        status = DEAD if row.attempts >= row.max_attempts else PENDING
        done = conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == row.id, jobs.c.status == RUNNING)
            .where(
                jobs.c.claim_token.is_(None)
                if row.claim_token is None
                else jobs.c.claim_token == row.claim_token
            )
            .values(
                status=status,
                rescues=jobs.c.rescues + 1,
                # run_at is kept: a rescued job goes ahead of jobs that became due after it.
                updated_at=now,
                finished_at=now if status == DEAD else None,
                claim_token=None,
                last_error=_summary(record),
                errors=_append(row.errors, record),
            )
        )
        if done.rowcount == 1:
            rescued.append((row.id, status, worker))
    conn.execute(
        sa.update(workers)
        .where(workers.c.last_heartbeat_at < stale_before, workers.c.stopped_at.is_(None))
        .values(stopped_at=now, stop_reason="lost")
    )
    conn.execute(sa.delete(workers).where(workers.c.stopped_at < now - GONE_WORKERS_KEPT))
    return rescued

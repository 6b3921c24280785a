"""What a person does to jobs (through core/operations.py and core/batches.py): replay,
run now, cancel, purge and delete.

Each checks every job it is given under a row lock and refuses the whole batch, before
writing anything, if one does not allow it (:class:`InvalidTransition`). All functions
take a connection inside a write transaction the caller owns. The worker never calls
them (a contract in pyproject.toml says so): its own transitions are in
core/transitions.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..exceptions import InvalidTransition
from ..exceptions import ids_text
from .features import dependencies
from .features import retention
from .features import uniqueness
from .models import FINISHED
from .models import JobStatus
from .models import jobs
from .models import utcnow

WAITING = JobStatus.WAITING.value
PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
DEAD = JobStatus.DEAD.value
CANCELLED = JobStatus.CANCELLED.value


def _lock_rows(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(ids)).with_for_update()
    ).all()
    return {row.id: row.status for row in rows}


def _check_all(
    conn: Connection, ids: Sequence[int], allowed: Iterable[str], verb: str, done: str
) -> dict[int, str]:
    """Refuse the whole batch, before writing anything, if any id is missing or not allowed.
    Returns each id's status, read under a row lock."""
    found = _lock_rows(conn, ids)
    missing = [i for i in ids if i not in found]
    if missing:
        raise InvalidTransition(f"No job with id {ids_text(missing)}; nothing {done}.")
    allowed = set(allowed)
    wrong = [i for i in ids if found[i] not in allowed]
    if len(wrong) == 1:
        (i,) = wrong
        raise InvalidTransition(f"Cannot {verb} job {i}: it is {found[i]}; nothing {done}.")
    if wrong:
        listed = ids_text(f"{i} ({found[i]})" for i in wrong)
        raise InvalidTransition(f"Cannot {verb} jobs {listed}; nothing {done}.")
    return found


def replay(conn: Connection, ids: Sequence[int], now: datetime) -> int:
    """Send dead or cancelled jobs back to pending with fresh attempts, to run now.

    A job with dependencies goes back to ``waiting`` instead while one of them has not
    completed (one replayed in the same call counts as not completed yet); if one is
    dead or cancelled and not replayed with it, the whole batch is refused. Replaying a
    job never replays the dependents that were cancelled for it.
    """
    ids = sorted(set(ids))
    _check_all(conn, ids, (DEAD, CANCELLED), "replay", "replayed")
    starts = {
        job_id: dependencies.prepare(conn, depends_on, replayed=ids)
        for job_id, depends_on in dependencies.depends_on(conn, ids).items()
    }
    refused = [
        f"{job_id} ({start.last_error})"
        for job_id, start in starts.items()
        if start.status == CANCELLED
    ]
    if refused:
        raise InvalidTransition(
            f"Cannot replay job {'; '.join(refused)}: replay that dependency with it, or "
            "first; nothing replayed."
        )
    _take_back_keys(conn, jobs.c.id.in_(ids))
    replayed = _replay_where(conn, jobs.c.id.in_(ids), now)
    waiting = [job_id for job_id, start in starts.items() if start.status == WAITING]
    if waiting:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(waiting), jobs.c.status == PENDING)
            .values(status=WAITING)
        )
    return replayed


def replay_dead(conn: Connection, now: datetime, queue: str | None, task: str | None) -> int:
    """Replay every dead job, optionally only those of one queue and/or task. (A dead
    job ran, so its dependencies had all completed: it goes back to pending.)"""
    where = jobs.c.status == DEAD
    if queue is not None:
        where &= jobs.c.queue == queue
    if task is not None:
        where &= jobs.c.task == task
    _take_back_keys(conn, where)
    return _replay_where(conn, where, now)


def _take_back_keys(conn: Connection, where: sa.ColumnElement[bool]) -> None:
    """Give the jobs about to be replayed the unique keys later enqueues took from them
    (core/features/uniqueness.py); refuse if a job not finished holds one: never two live
    holders."""
    held = uniqueness.take_back(conn, where & jobs.c.status.in_((DEAD, CANCELLED)))
    if len(held) == 1:
        ((job_id, row),) = held
        raise InvalidTransition(
            f"Cannot replay job {job_id}: job {row.id} ({row.status}) holds its unique key; "
            f"replay it once job {row.id} has finished, or cancel job {row.id} first; "
            "nothing replayed."
        )
    if held:
        listed = ids_text(f"{job_id} (held by job {row.id}, {row.status})" for job_id, row in held)
        raise InvalidTransition(
            f"Cannot replay jobs whose unique keys other jobs hold: {listed}; nothing replayed."
        )


def _replay_where(conn: Connection, where: Any, now: datetime) -> int:
    return conn.execute(
        sa.update(jobs)
        .where(where, jobs.c.status.in_((DEAD, CANCELLED)))
        .values(
            status=PENDING,
            attempts=0,
            rescues=0,
            crashes=0,
            run_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
            worker_id=None,
            claim_token=None,
            last_error=None,
            cancel_requested_at=None,
            progress=None,
            progress_message=None,
            # Replayed by hand to run now: an expiry that has passed would end it again.
            expires_at=None,
        )
    ).rowcount


def run_now(conn: Connection, ids: Sequence[int], now: datetime) -> dict[int, datetime]:
    """Make pending jobs that are delayed or backing off due ``now``; a pending job that
    is due already is left as it is. A paused queue or a task's limits still hold it.

    :returns: the ``run_at`` each job it moved had.
    :raises InvalidTransition: an id is missing or its job is not pending; nothing changes.
    """
    ids = sorted(set(ids))
    found = _lock_rows(conn, ids)
    wrong = [f"{i} is {found[i]}" if i in found else f"{i} does not exist" for i in ids]
    wrong = [w for i, w in zip(ids, wrong, strict=True) if found.get(i) != PENDING]
    if wrong:
        raise InvalidTransition(
            f"Only pending jobs can be run now, and job {'; '.join(wrong)}; nothing changed."
        )
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.run_at).where(jobs.c.id.in_(ids))).all()
    later = {row.id: row.run_at for row in rows if row.run_at > now}
    if later:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(list(later)), jobs.c.status == PENDING)
            .values(run_at=now, updated_at=now)
        )
    return later


def change_replayed(conn: Connection, job_id: int, values: dict[str, Any]) -> None:
    """Give a job just replayed (:func:`replay`, in this transaction) new ``values``:
    its payload, concurrency key, queue or priority, checked by the caller."""
    conn.execute(
        sa.update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status.in_((PENDING, WAITING)))
        .values(**values)
    )


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What :func:`cancel_jobs` did: waiting and pending jobs cancelled (their waiting
    dependents with them, not counted here), running jobs asked to stop."""

    cancelled: list[int]
    requested: list[int]

    @property
    def count(self) -> int:
        """How many jobs were cancelled or asked to stop."""
        return len(self.cancelled) + len(self.requested)

    def describe(self) -> str:
        """One line for the CLI and the admin's flash message."""
        parts = []
        if self.cancelled or not self.requested:
            parts.append(f"Cancelled {len(self.cancelled)} job(s).")
        if self.requested:
            parts.append(
                f"Asked {len(self.requested)} running job(s) to stop "
                f"({', '.join(map(str, self.requested))}); each stops when its task checks "
                "current_job.cancel_requested."
            )
        return " ".join(parts)


def cancel_jobs(conn: Connection, ids: Sequence[int], now: datetime) -> Cancellation:
    """Cancel waiting and pending jobs at once, with their waiting dependents, and ask
    running ones to stop (``cancel_requested_at``).

    A running job stops only if its task checks ``current_job.cancel_requested`` (or
    calls ``raise_if_cancelled()``); once the request is recorded, a failed attempt is
    not retried and a job handed back at shutdown or rescued ends ``cancelled``.
    All or nothing: a missing or finished id refuses the whole batch.
    """
    ids = sorted(set(ids))
    found = _check_all(conn, ids, (WAITING, PENDING, RUNNING), "cancel", "cancelled")
    pending = [i for i in ids if found[i] in (WAITING, PENDING)]
    running = [i for i in ids if found[i] == RUNNING]
    if pending:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(pending), jobs.c.status.in_((WAITING, PENDING)))
            .values(status=CANCELLED, finished_at=now, updated_at=now)
        )
        dependencies.settle(conn, pending, now)
    if running:
        conn.execute(
            sa.update(jobs)
            .where(
                jobs.c.id.in_(running),
                jobs.c.status == RUNNING,
                jobs.c.cancel_requested_at.is_(None),
            )
            .values(cancel_requested_at=now, updated_at=now)
        )
    return Cancellation(pending, running)


def purge(conn: Connection, status: str, before: datetime) -> int:
    """Delete finished jobs of one status last changed before ``before``, and what
    they waited for (a dependent still waiting counts a purged dependency completed:
    only completed ones can be, as the others' dependents are cancelled)."""
    if status not in FINISHED:
        raise InvalidTransition(
            f"Only finished jobs can be purged ({', '.join(FINISHED)}), not {status!r}."
        )
    purged = conn.execute(
        sa.delete(jobs).where(jobs.c.status == status, jobs.c.updated_at < before)
    ).rowcount
    if purged:
        retention.forget_deleted(conn)
    return purged


def delete(conn: Connection, ids: Sequence[int], now: datetime | None = None) -> int:
    """Delete jobs that are not running. A deleted job that had not finished cancels its
    waiting dependents, which could never run (``now`` stamps them)."""
    ids = sorted(set(ids))
    found = _check_all(conn, ids, (WAITING, PENDING, *FINISHED), "delete", "deleted")
    unfinished = {i: "deleted" for i in ids if found[i] in (WAITING, PENDING)}
    if unfinished:
        dependencies.cancel_dependents(conn, unfinished, utcnow() if now is None else now)
    deleted = conn.execute(
        sa.delete(jobs).where(jobs.c.id.in_(ids), jobs.c.status != RUNNING)
    ).rowcount
    retention.forget_deleted(conn, ids)
    return deleted

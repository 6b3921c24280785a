"""Every change of a job's state, each a guarded UPDATE whose rowcount is checked.

A guard names the state the caller believes the row is in (for a running attempt: its
id, ``running`` and the claim token). If the row moved on meanwhile, say a dead worker's
job was rescued and claimed again, the write matches nothing and changes nothing.
All functions take a connection inside a write transaction the caller owns.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from traceback import TracebackException
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..bounds import LATEST_RUN_AT
from ..bounds import longest_delay
from ..config import default
from ..exceptions import SQLQueueError
from ..exceptions import ids_text
from . import dependencies
from . import retention
from . import uniqueness
from .dialects import DialectOps
from .dialects.base import COMPLETE_ONE
from .dialects.base import complete_one_params
from .liveness import BootClock
from .liveness import BootCutoff
from .liveness import elsewhere
from .liveness import heartbeat_fresh
from .models import JobStatus
from .models import effects
from .models import jobs
from .models import utcnow
from .models import workers
from .payload import decode_value
from .payload import dumps_trusted

WAITING = JobStatus.WAITING.value
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

    base: float = default("SQLQUEUE_BACKOFF_BASE")
    cap: float = default("SQLQUEUE_BACKOFF_CAP")
    jitter: float = default("SQLQUEUE_BACKOFF_JITTER")

    def delay(self, attempt: int, rng: random.Random) -> float:
        least, most = self.bounds(attempt)
        return least + (rng.uniform(0, most - least) if most > least else 0.0)

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The least and the most :meth:`delay` gives after attempt ``attempt`` failed."""
        least = min(self.cap, self.base * 2.0 ** min(attempt, 64))
        return least, least + self.jitter


def own_delay(backoff: BackoffFunc, attempt: int) -> float:
    """A task's own ``backoff`` after attempt ``attempt`` failed, in seconds.

    :raises ValueError: it gave a delay that is not a finite number of seconds, 0 or more,
        or one that would make the next attempt due after
        :data:`~flask_sqlqueue.bounds.LATEST_RUN_AT`, as ``Retry`` refuses it (and
        whatever ``backoff`` itself raises).
    """
    delay = backoff(attempt)
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    shown = cut_text(repr(delay), 80)
    if not seconds >= 0:  # NaN too
        raise ValueError(f"backoff returned {shown}, not a number of seconds, 0 or more")
    if seconds > longest_delay(utcnow()):  # infinity too
        raise ValueError(
            f"backoff returned {shown}, which would make the next attempt due after "
            f"{LATEST_RUN_AT:%Y-%m-%d} (UTC), the latest time the queue stores"
        )
    return seconds


#: Characters of an error's type kept in its record.
MAX_ERROR_TYPE = 255
#: Characters of an error message kept (in ``last_error`` and the history): its start.
MAX_ERROR_MESSAGE = 2_000
#: Characters of a traceback kept: its end, where the exception is raised.
MAX_TRACEBACK = 20_000
#: Failed attempts kept in a job's ``errors`` history: the newest; older ones are dropped.
MAX_ERRORS_KEPT = 20
#: UTF-8 bytes a job's ``errors`` history may take (less where the database stores less):
#: the newest records that fit are kept, so a failure's write always fits.
MAX_ERROR_HISTORY = 1_000_000
# What is left of a message when one record alone is too large for the database.
_SHORT_MESSAGE = 200


def error_record(
    attempt: int, kind: str, message: str, traceback: str, worker_id: str | None, now: datetime
) -> dict[str, Any]:
    """One failed attempt as the history stores it, each text cut to its limit."""
    return {
        "attempt": attempt,
        "type": storable_text(cut_text(kind, MAX_ERROR_TYPE)),
        "message": storable_text(cut_text(message, MAX_ERROR_MESSAGE)),
        "traceback": storable_text(cut_text(traceback, MAX_TRACEBACK, keep_end=True)),
        "worker": worker_id,
        "at": now.isoformat(),
    }


def format_error(exc: BaseException) -> str:
    """``exc``'s traceback as it is stored: each part cut to :data:`MAX_ERROR_MESSAGE`
    (so a long message shows once, cut, after the frames) and the whole to
    :data:`MAX_TRACEBACK`, keeping its end."""
    parts = TracebackException.from_exception(exc).format()
    text = "".join(
        part if len(part) <= MAX_ERROR_MESSAGE else cut_text(part, MAX_ERROR_MESSAGE) + "\n"
        for part in parts
    )
    return cut_text(text, MAX_TRACEBACK, keep_end=True)


def cut_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` if it has at most ``limit`` characters, else its start (or end) with a
    note saying it was cut; never longer than ``limit``, so cutting twice changes nothing."""
    if len(text) <= limit:
        return text
    if keep_end:
        note = f"[cut: {len(text):,} characters in all; the end follows]\n"
        return note + text[len(text) - max(0, limit - len(note)) :]
    note = f" [cut: {len(text):,} characters in all]"
    return text[: max(0, limit - len(note))] + note


def storable_text(text: str) -> str:
    """``text`` with what some database cannot store written as escapes: NUL (PostgreSQL's
    text refuses it) and lone surrogates (no driver can encode them as UTF-8). A task's
    error message may hold either; left as is, its failure could not be recorded at all."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


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
    # The dependents they release, in the same transaction (core/dependencies.py).
    _released(conn, ops, dependencies.release(conn, parents, now))
    return completed


#: What an attempt that ends without completing leaves of its progress when the job
#: goes back to pending: nothing, so that a page does not show the last attempt's 100%
#: while the next one waits (a job that ends keeps its last attempt's, docs/progress.md).
NO_PROGRESS: dict[str, Any] = {"progress": None, "progress_message": None}


def fail(
    conn: Connection,
    job_id: int,
    token: str,
    record: dict[str, Any],
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
    values: dict[str, Any] = {
        "last_error": _summary(record),
        "errors": _append(history.errors, record, fits),
        "updated_at": now,
        "claim_token": None,
    }
    if retry_at is None:
        values.update(status=DEAD, finished_at=now)
    elif history.cancel_requested_at is not None:
        # Its cancellation was asked for: the failed attempt ends it instead of a retry.
        values.update(status=CANCELLED, finished_at=now)
    else:
        values.update(status=PENDING, run_at=retry_at, **NO_PROGRESS)
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
    return conn.execute(sa.select(jobs.c.id).where(_claimed(job_id, token))).first() is not None


def _summary(record: dict[str, Any]) -> str:
    return f"{record['type']}: {record['message']}" if record["message"] else record["type"]


def _append(
    history: str | None, record: dict[str, Any], fits: Callable[[str], bool] | None = None
) -> str:
    """The history with ``record`` added, bounded: at most :data:`MAX_ERRORS_KEPT`
    records and :data:`MAX_ERROR_HISTORY` bytes, and within what ``fits``."""
    # A history edited into nonsense is replaced, never allowed to block.
    items = _records(history) or []
    items.append(record)
    del items[:-MAX_ERRORS_KEPT]
    while True:
        text = dumps_trusted(items)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= MAX_ERROR_HISTORY and (fits is None or fits(text)):
            return text
        if len(items) > 1:
            items.pop(0)  # the oldest goes first
        elif items[0]["traceback"]:
            # One record alone is too large here (a server that stores very little).
            items[0] = {**record, "traceback": ""}
        else:
            short = cut_text(record["message"], _SHORT_MESSAGE)
            items[0] = {**record, "traceback": "", "message": short}
            return dumps_trusted(items)


def _records(history: str | None) -> list[Any] | None:
    """The records of an ``errors`` history; ``None`` if it is not a JSON list."""
    try:
        items = decode_value(history) or []
    except ValueError:
        return None
    return items if isinstance(items, list) else None


class InvalidTransition(SQLQueueError, ValueError):
    """An operation that does not apply to a job in its current state."""


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
    (core/uniqueness.py); refuse if a job not finished holds one: never two live holders."""
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


FINISHED = (COMPLETED, DEAD, CANCELLED)
#: How long a stopped or lost worker stays listed after it is gone.
GONE_WORKERS_KEPT = timedelta(days=1)


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


# -- workers and rescue ---------------------------------------------------------------


def register_worker(
    conn: Connection,
    worker_id: str,
    host: str,
    pid: int,
    queues: Sequence[str],
    concurrency: int,
    now: datetime,
    tasks: Sequence[str] | None = None,
    boot: BootClock | None = None,
) -> None:
    conn.execute(
        sa.insert(workers).values(
            id=worker_id,
            host=host,
            pid=pid,
            queues=",".join(queues),
            tasks=None if tasks is None else json.dumps(sorted(tasks)),
            concurrency=concurrency,
            started_at=now,
            last_heartbeat_at=now,
            **({} if boot is None else boot.stamp()),
        )
    )


def heartbeat(
    conn: Connection,
    worker_id: str,
    now: datetime,
    boot: BootClock | None = None,
    claimed_ahead: Sequence[int] = (),
) -> bool:
    """Stamp the worker's row with ``now``, its boot clock (see core/liveness.py) and
    the jobs it claimed ahead and has not started. ``False`` when the row is gone: it
    was declared dead and must stop."""
    done = conn.execute(
        sa.update(workers)
        .where(workers.c.id == worker_id, workers.c.stopped_at.is_(None))
        .values(
            last_heartbeat_at=now,
            claimed_ahead=json.dumps(list(claimed_ahead)),
            **({} if boot is None else boot.stamp()),
        )
    )
    return done.rowcount == 1


def heartbeat_marks(conn: Connection, boot_id: str | None) -> list[tuple[str, Any]]:
    """``(worker id, last heartbeat)`` of every live worker that a rescuer on boot
    ``boot_id`` cannot judge by its boot clock, for a :class:`~.liveness.HeartbeatWatch`."""
    rows = conn.execute(
        sa.select(workers.c.id, workers.c.last_heartbeat_at).where(
            workers.c.stopped_at.is_(None), elsewhere(boot_id)
        )
    )
    return [(row.id, row.last_heartbeat_at) for row in rows]


def live_worker_ids(conn: Connection) -> set[str]:
    """The ids of the workers not marked stopped (nor lost)."""
    return set(
        conn.execute(sa.select(workers.c.id).where(workers.c.stopped_at.is_(None))).scalars()
    )


def unregister_worker(conn: Connection, worker_id: str, now: datetime) -> None:
    """Mark a worker stopped; its row stays a while so dashboards show it as gone."""
    conn.execute(
        sa.update(workers)
        .where(workers.c.id == worker_id, workers.c.stopped_at.is_(None))
        .values(stopped_at=now, stop_reason="stopped")
    )


def mark_effect_done(conn: Connection, key: str, job_id: int, now: datetime) -> bool:
    """Record that job ``job_id`` did the effect it reserved as ``key``; ``False`` if it
    holds no such reservation (pruned, say) or it was marked before."""
    done = conn.execute(
        sa.update(effects)
        .where(effects.c.key == key, effects.c.job_id == job_id, effects.c.done_at.is_(None))
        .values(done_at=now)
    )
    return done.rowcount == 1


#: The error type of the attempt that quarantined its job.
QUARANTINED = "Quarantined"


def quarantine_note(crashes: int) -> str:
    """The message of the attempt that quarantined a job (``last_error`` then reads
    ``"Quarantined: killed its worker 3 times ..."``)."""
    return (
        f"killed its worker {crashes} times (SQLQUEUE_MAX_CRASHES); find out why "
        "before replaying it"
    )


#: The error type of a rescue's record (:func:`rescue_stale`), or :data:`QUARANTINED`.
WORKER_LOST = "WorkerLost"
LOST_KINDS = (WORKER_LOST, QUARANTINED)


def came_back_note(worker_id: str) -> str:
    """The message of a rescue's record once its worker reported in again."""
    return f"worker lost: {worker_id}; it reported in again, so not counted as a crash"


@dataclass(frozen=True, slots=True)
class TakenBack:
    """A rescue :func:`worker_came_back` took back from a job's crash budget."""

    job_id: int
    crashes: int
    #: The status the job has now: ``pending`` when the rescue had quarantined it.
    status: str


def worker_came_back(
    conn: Connection,
    worker_id: str,
    job_ids: Iterable[int],
    now: datetime,
    *,
    max_crashes: int = default("SQLQUEUE_MAX_CRASHES"),
) -> list[TakenBack]:
    """A worker found lost reports in again, still holding ``job_ids``: it was paused or
    starved, not dead, so the rescues of its attempts are no crashes. Each comes off its
    job's crash budget, and its record says so; a job that rescue quarantined goes back
    to pending if attempts are left (cancelled, if that was asked), unless its dependents
    were cancelled with it: it stays dead then, no longer quarantined, to replay by hand.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return []
    rows = conn.execute(
        sa.select(
            jobs.c.id,
            jobs.c.status,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.crashes,
            jobs.c.errors,
            jobs.c.cancel_requested_at,
            jobs.c.has_dependents,
        )
        .where(jobs.c.id.in_(ids), jobs.c.crashes > 0)
        .with_for_update()
    ).all()
    taken = []
    for row in rows:
        history = _records(row.errors)
        if history is None:
            continue  # a history edited into nonsense tells nothing about this rescue
        mine = [
            i
            for i, record in enumerate(history)
            if isinstance(record, dict)
            and record.get("worker") == worker_id
            and record.get("type") in LOST_KINDS
            and not record.get("came_back")
        ]
        if not mine:
            continue  # not rescued, or its record is no longer kept: nothing to take back
        index = mine[-1]
        record = {
            **history[index],
            "type": WORKER_LOST,
            "message": came_back_note(worker_id),
            "came_back": True,
        }
        history[index] = record
        crashes = row.crashes - 1
        values: dict[str, Any] = {"crashes": crashes, "errors": dumps_trusted(history)}
        status = row.status
        if row.status == DEAD and index == len(history) - 1 and crashes < max_crashes:
            # This rescue ended the job (quarantined it, or spent its last attempt).
            values["last_error"] = _summary(record)
            if row.attempts < row.max_attempts and not row.has_dependents:
                status = PENDING if row.cancel_requested_at is None else CANCELLED
                values |= {
                    "status": status,
                    "updated_at": now,
                    "finished_at": None if status == PENDING else now,
                }
        done = conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == row.id, jobs.c.crashes == row.crashes)
            .where(jobs.c.status == row.status)
            .values(**values)
        )
        if done.rowcount == 1:
            taken.append(TakenBack(row.id, crashes, status))
    return taken


def rescue_stale(
    conn: Connection,
    stale_before: datetime,
    now: datetime,
    *,
    boot: BootCutoff | None = None,
    silent: Iterable[str] | None = None,
    spared: Callable[[list[str]], set[str]] | None = None,
    max_crashes: int = default("SQLQUEUE_MAX_CRASHES"),
) -> list[tuple[int, str, str]]:
    """Take back running jobs whose worker stopped heartbeating before ``stale_before``.

    With ``boot``, the workers of the rescuer's own boot are judged by their boot clock
    instead (core/liveness.py). With ``silent``, a worker judged by the queue's time is
    lost only if it is also among these ids: the ones the rescuer itself saw silent.
    ``spared`` is given the ids of the workers found lost so far, and returns those
    shown alive another way (their :class:`~.liveness.BeatFiles`): they are not lost.

    The lost attempt counts, and is a crash until its worker reports in again
    (:func:`worker_came_back`): a job whose crashes reach ``max_crashes`` is quarantined
    (``dead``, see :func:`quarantine_note`) even with attempts left, so a poison pill that
    kills its worker stops long before its retries are spent. A job that ends cancels its
    waiting dependents. Returns ``(job id, new status, lost worker id)`` for each job.
    """
    keep = heartbeat_fresh(stale_before, boot)
    if silent is not None:
        boot_id = None if boot is None else boot.boot_id
        keep = sa.or_(keep, sa.and_(elsewhere(boot_id), workers.c.id.not_in(sorted(silent))))
    if spared is not None:
        found = conn.execute(
            sa.select(workers.c.id).where(workers.c.stopped_at.is_(None), sa.not_(keep))
        )
        alive = spared([row.id for row in found])
        if alive:
            keep = sa.or_(keep, workers.c.id.in_(sorted(alive)))
    live = sa.select(workers.c.id).where(workers.c.stopped_at.is_(None), keep)
    lost_now = sa.select(workers.c.id).where(workers.c.stopped_at.is_(None), sa.not_(keep))
    lost = conn.execute(
        sa.select(
            jobs.c.id,
            jobs.c.attempts,
            jobs.c.max_attempts,
            jobs.c.crashes,
            jobs.c.worker_id,
            jobs.c.claim_token,
            jobs.c.errors,
            jobs.c.cancel_requested_at,
            jobs.c.has_dependents,
        ).where(
            jobs.c.status == RUNNING,
            # A missing worker row counts as dead; the start guard covers a worker that
            # claims in the instant between registering and its first heartbeat. A worker
            # found lost now needs no guard: its own clock says how long it is silent.
            sa.or_(jobs.c.worker_id.is_(None), jobs.c.worker_id.not_in(live)),
            sa.or_(
                jobs.c.started_at.is_(None),
                jobs.c.started_at < stale_before,
                jobs.c.worker_id.in_(lost_now),
            ),
        )
    ).all()
    rescued = []
    for row in lost:
        worker = row.worker_id or "unknown"
        crashes = row.crashes + 1
        kind, message = WORKER_LOST, f"worker lost: {worker}"
        if crashes >= max_crashes:
            kind, message = QUARANTINED, f"{quarantine_note(crashes)}; last {message}"
        record = error_record(row.attempts, kind, message, "", row.worker_id, now)
        status = DEAD if row.attempts >= row.max_attempts or crashes >= max_crashes else PENDING
        if status == PENDING and row.cancel_requested_at is not None:
            status = CANCELLED  # its cancellation was asked for: do not run it again
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
                crashes=jobs.c.crashes + 1,
                # run_at is kept: a rescued job goes ahead of jobs that became due after it.
                updated_at=now,
                finished_at=None if status == PENDING else now,
                claim_token=None,
                last_error=_summary(record),
                errors=_append(row.errors, record),
                **(NO_PROGRESS if status == PENDING else {}),
            )
        )
        if done.rowcount == 1:
            rescued.append((row.id, status, worker))
            if status != PENDING and row.has_dependents:
                dependencies.cancel_dependents(conn, {row.id: status}, now)
    conn.execute(
        sa.update(workers)
        .where(workers.c.stopped_at.is_(None), sa.not_(keep))
        .values(stopped_at=now, stop_reason="lost")
    )
    conn.execute(sa.delete(workers).where(workers.c.stopped_at < now - GONE_WORKERS_KEPT))
    return rescued

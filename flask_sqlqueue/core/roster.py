"""The workers' rows, and the rescue of the running jobs of workers found lost.

A worker registers, heartbeats and unregisters (core/worker/upkeep.py); any process
with a store may rescue: take back the jobs of workers silent too long, each worker
judged by the clock it shares with the rescuer (core/liveness.py). A worker found lost
that reports in again takes its rescues off its jobs' crash budgets
(:func:`worker_came_back`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..config import default
from . import liveness
from .failures import ErrorRecord
from .failures import appended
from .failures import error_record
from .failures import records
from .failures import summary
from .features import dependencies
from .liveness import BootClock
from .liveness import BootCutoff
from .liveness import HeartbeatWatch
from .liveness import elsewhere
from .models import JobRow
from .models import JobStatus
from .models import jobs
from .models import workers
from .payload import dumps_trusted
from .transitions import NO_PROGRESS

if TYPE_CHECKING:
    from .features.audit import Audit
    from .store import Store

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
DEAD = JobStatus.DEAD.value
CANCELLED = JobStatus.CANCELLED.value

#: How long a stopped or lost worker stays listed after it is gone.
GONE_WORKERS_KEPT = timedelta(days=1)


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
        history = records(row.errors)
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
        # A stored record, as the history holds it; the keys read below are set here.
        record = cast(
            ErrorRecord,
            {
                **history[index],
                "type": WORKER_LOST,
                "message": came_back_note(worker_id),
                "came_back": True,
            },
        )
        history[index] = record
        crashes = row.crashes - 1
        values: JobRow = {"crashes": crashes, "errors": dumps_trusted(history)}
        status = row.status
        if row.status == DEAD and index == len(history) - 1 and crashes < max_crashes:
            # This rescue ended the job (quarantined it, or spent its last attempt).
            values["last_error"] = summary(record)
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
    keep = liveness.heartbeat_fresh(stale_before, boot)
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
                last_error=summary(record),
                errors=appended(row.errors, record),
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


# -- rescue, as a store does it ---------------------------------------------------------


def rescue(
    store: Store,
    stale_after: float,
    *,
    now: datetime | None = None,
    watch: HeartbeatWatch | None = None,
    within: float = 10.0,
    audit: Audit | None = None,
) -> list[tuple[int, str, str]]:
    """Take back the running jobs of workers silent for ``stale_after`` seconds,
    each judged by the clock it shares with this process (core/liveness.py).

    :param now: the queue's time (default ``store.now()``).
    :param watch: this process's record of other machines' heartbeats; with it, a
        worker judged by the queue's time is lost only once the watch too has seen
        it silent for ``stale_after`` seconds.
    :param audit: who asked (``flask queue rescue``): an entry per job taken back.
    :returns: ``(job id, new status, lost worker id)`` for each job taken back.

    Jobs it makes pending again wake the workers, as every write that makes a job
    runnable does (``core/operations.py``); those it ends wake their waiters.
    """
    now = store.now() if now is None else now

    def take(conn: Connection) -> list[tuple[int, str, str]]:
        return rescue_in(store, conn, stale_after, now=now, watch=watch, audit=audit)

    def ended(rescued: list[tuple[int, str, str]]) -> list[int]:
        return [job_id for job_id, status, _ in rescued if status != PENDING]

    rescued: list[tuple[int, str, str]] = store.run_finishing(take, ended, within=within)
    if any(status == PENDING for _, status, _ in rescued):
        store.wake()
    return rescued


def rescue_in(
    store: Store,
    conn: Connection,
    stale_after: float,
    *,
    now: datetime | None = None,
    watch: HeartbeatWatch | None = None,
    audit: Audit | None = None,
) -> list[tuple[int, str, str]]:
    """:func:`rescue` in the write transaction ``conn``, tried once."""
    now = store.now() if now is None else now
    boot = None if store.boot is None else store.boot.cutoff(stale_after)
    beats = store.beats
    silent = None
    if watch is not None:
        watch.look(heartbeat_marks(conn, _boot_id(store)))
        silent = watch.silent(stale_after)
    rescued = rescue_stale(
        conn,
        now - timedelta(seconds=stale_after),
        now,
        boot=boot,
        silent=silent,
        spared=None if beats is None else lambda ids: beats.fresh(ids, stale_after),
        max_crashes=store.settings.max_crashes,
    )
    if any(status == PENDING for _, status, _ in rescued):
        store.ops.notify(conn)
    if audit is not None and rescued:
        each = {i: {"status": status, "lost_worker": w} for i, status, w in rescued}
        audit.record(conn, now, "rescue", sorted(each), each=each)
    return rescued


def heartbeat_fresh(
    store: Store, stale_after: float, now: datetime | None = None
) -> sa.ColumnElement[bool]:
    """The SQL test for worker rows that heartbeated within ``stale_after`` seconds,
    each judged by the clock it shares with this process (core/liveness.py): what
    status, doctor and the admin call live."""
    now = store.now() if now is None else now
    boot = None if store.boot is None else store.boot.cutoff(stale_after)
    return liveness.heartbeat_fresh(now - timedelta(seconds=stale_after), boot)


def watch_heartbeats(store: Store, watch: HeartbeatWatch) -> None:
    """Let ``watch`` look at the heartbeats it keeps, without rescuing anything."""
    with store.read() as conn:
        watch.look(heartbeat_marks(conn, _boot_id(store)))


def _boot_id(store: Store) -> str | None:
    return None if store.boot is None else store.boot.id

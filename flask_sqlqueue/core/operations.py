"""What a person does to the queue, one function each, whichever door it comes through:
the ``flask queue`` commands, the admin's buttons, or ``queue.pause()`` in Python
(and ``queue.disable_schedule()``, ``queue.run_schedule()`` for periodic schedules).

Each runs in a write transaction of its own (retried while the database is busy, as
every write of the queue is) and is all or nothing. Every one that makes a job runnable
(retry, resume, rescue) also wakes the workers, so an idle worker does not wait out its
poll interval: ``NOTIFY`` inside the transaction, delivered only if it commits, for
workers listening on PostgreSQL on any host; then :meth:`Store.wake` once it has
committed, for workers in this process and, on SQLite, on this host (MariaDB workers
poll). Enqueueing has its own one path, :func:`.enqueue.enqueue`, which does the same.
Every one that ends or deletes jobs (cancel, delete, rescue) wakes their waiters
(``Job.wait``) the same two ways (:meth:`Store.run_finishing`).

Each that takes an ``audit`` (:class:`.features.audit.Audit`, naming who acts) writes its entries
to the audit log in the same transaction as its change: both are written or neither.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..exceptions import InvalidTransition
from . import actions
from . import pausing
from . import periodic
from . import queries
from . import roster
from .actions import Cancellation
from .enqueue import Call
from .enqueue import EnqueueOptions
from .enqueue import RunsJobs
from .enqueue import check_options
from .enqueue import encode_arguments
from .enqueue import enqueue
from .features import audit as audit_log
from .features import bigpayloads
from .features.audit import Audit
from .jobs import Job
from .models import JobStatus
from .models import jobs
from .store import Store
from .tasks import Task

#: Ids replayed per statement when replaying a free-text selection of dead jobs.
CHUNK = 500


def _making_runnable(store: Store, write: Callable[[Connection], int]) -> int:
    """Run ``write`` (which returns how many jobs it made runnable) and wake the workers
    if it made any."""

    def write_and_tell(conn: Connection) -> int:
        made = write(conn)
        if made:
            store.ops.notify(conn)
        return made

    made = store.run_write(write_and_tell)
    if made:
        store.wake()
    return made


# -- jobs ------------------------------------------------------------------------------------


def retry(store: Store, ids: Sequence[int], *, audit: Audit | None = None) -> int:
    """Replay dead or cancelled jobs with fresh attempts, to run now; wakes the workers.

    :returns: how many jobs were replayed.
    :raises InvalidTransition: an id is missing, or its job is neither dead nor
        cancelled; nothing is replayed.
    """
    now = store.now()

    def replay(conn: Connection) -> int:
        replayed = actions.replay(conn, ids, now)
        if audit is not None:
            audit.record(conn, now, "retry", sorted(set(ids)))
        return replayed

    return _making_runnable(store, replay)


def retry_dead(
    store: Store,
    *,
    queue: str | None = None,
    task: str | None = None,
    text: str | None = None,
    tag: str | None = None,
    audit: Audit | None = None,
) -> int:
    """Replay every dead job (of ``queue``, of ``task``, matching ``text`` as the
    admin's search does, tagged ``tag``, each if given) with fresh attempts; wakes the
    workers.

    :returns: how many jobs were replayed.
    """
    now = store.now()

    def replay(conn: Connection) -> int:
        if not text and not tag:
            replayed = actions.replay_dead(conn, now, queue, task)
        else:
            where = queries.JobFilter(
                status=JobStatus.DEAD.value, queue=queue, task=task, text=text, tag=tag
            )
            ids = queries.job_ids(conn, where)
            replayed = sum(
                actions.replay(conn, ids[i : i + CHUNK], now) for i in range(0, len(ids), CHUNK)
            )
        if audit is not None:
            # One entry for the selection, not one per job: it may be thousands.
            chosen = {"queue": queue, "task": task, "text": text, "tag": tag}
            detail = {k: v for k, v in chosen.items() if v} | {"replayed": replayed}
            audit.record(conn, now, "retry_dead", detail=detail)
        return replayed

    return _making_runnable(store, replay)


def cancel(store: Store, ids: Sequence[int], *, audit: Audit | None = None) -> Cancellation:
    """Cancel waiting and pending jobs with their waiting dependents, and ask running
    ones to stop (see :func:`.actions.cancel_jobs`).

    :raises InvalidTransition: an id is missing or its job finished; nothing changes.
    """
    now = store.now()

    def write(conn: Connection) -> Cancellation:
        done = actions.cancel_jobs(conn, ids, now)
        if audit is not None:
            audit.record(conn, now, "cancel", done.cancelled, {"outcome": "cancelled"})
            audit.record(conn, now, "cancel", done.requested, {"outcome": "asked to stop"})
        return done

    done: Cancellation = store.run_finishing(write, lambda done: done.cancelled)
    return done


def delete(store: Store, ids: Sequence[int], *, audit: Audit | None = None) -> int:
    """Delete jobs that are not running; a deleted job that had not finished cancels its
    waiting dependents; waiters of the deleted jobs are woken (and learn it).

    :raises InvalidTransition: an id is missing or its job is running; nothing is deleted.
    """
    now = store.now()

    def write(conn: Connection) -> int:
        if audit is not None:  # before the rows go: the entries say what each job was
            rows = conn.execute(
                sa.select(jobs.c.id, jobs.c.task, jobs.c.status).where(jobs.c.id.in_(ids))
            ).all()
            each = {row.id: {"task": row.task, "status": row.status} for row in rows}
        deleted = actions.delete(conn, ids, now)
        if audit is not None:
            audit.record(conn, now, "delete", sorted(set(ids)), each=each)
        return deleted

    deleted: int = store.run_finishing(write, lambda _deleted: sorted(set(ids)))
    return deleted


def run_now(store: Store, ids: Sequence[int], *, audit: Audit | None = None) -> int:
    """Make pending jobs that are delayed or backing off due now; wakes the workers. A
    pending job due already stays as it is; a paused queue or a task's limits still
    hold a job back.

    :returns: how many jobs were moved.
    :raises InvalidTransition: an id is missing or its job is not pending; nothing changes.
    """
    now = store.now()

    def write(conn: Connection) -> int:
        moved = actions.run_now(conn, ids, now)
        if audit is not None:
            each = {i: {"run_at_was": moved[i].isoformat()} for i in moved}
            audit.record(conn, now, "run_now", sorted(set(ids)), each=each)
        return len(moved)

    return _making_runnable(store, write)


def replay_edited(
    store: Store,
    registry: Mapping[str, Task[Any, Any]],
    job_id: int,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    audit: Audit | None = None,
) -> Job:
    """Replay a dead or cancelled job with fresh attempts, to run now, after changing its
    arguments, queue or priority (``None``: keep the job's); wakes the workers.

    New arguments are given in their stored forms (as ``job.args`` shows them) and
    checked exactly as an enqueue checks them: against the task's signature and typed
    parameters, as JSON that round-trips, against the size the database stores.

    :returns: the job as replayed.
    :raises InvalidTransition: no such job, or it is neither dead nor cancelled.
    :raises TypeError: the arguments do not fit the task, or a value is not JSON.
    :raises ValueError: a bad queue name, a value that would not round-trip, or new
        arguments for a task this app does not register (they cannot be checked).
        In every case nothing changes.
    """
    check_options(queue=queue, priority=priority)
    now = store.now()

    def write(conn: Connection) -> int:
        row = conn.execute(sa.select(jobs).where(jobs.c.id == job_id).with_for_update()).first()
        if row is None:
            raise InvalidTransition(f"No job with id {job_id}; nothing replayed.")
        job = Job.from_row(bigpayloads.full_row(conn, row))
        # First: a job in the wrong state is refused as such, whatever its new arguments.
        replayed = actions.replay(conn, [job_id], now)
        before: dict[str, Any] = {}
        after: dict[str, Any] = {}
        values: dict[str, Any] = {}
        if args is not None or kwargs is not None:
            kept_args, kept_kwargs = _current_arguments(registry, job)
            new_args = kept_args if args is None else args
            new_kwargs = kept_kwargs if kwargs is None else kwargs
            values["payload"], values["concurrency_key"] = _edited_payload(
                store, registry, job, new_args, new_kwargs
            )
            if new_args != job.args:
                before["args"], after["args"] = job.args, new_args
            if new_kwargs != job.kwargs:
                before["kwargs"], after["kwargs"] = job.kwargs, new_kwargs
        if queue is not None and queue != job.queue:
            before["queue"], after["queue"] = job.queue, queue
            values["queue"] = queue
        if priority is not None and priority != job.priority:
            before["priority"], after["priority"] = job.priority, priority
            values["priority"] = priority
        if "payload" in values:
            payload, limit = values["payload"], store.settings.inline_payload_limit
            values = bigpayloads.row_values(values, limit)
            actions.change_replayed(conn, job_id, values)
            bigpayloads.rewrite(conn, job_id, payload, limit)
        elif values:
            actions.change_replayed(conn, job_id, values)
        if audit is not None:
            detail = {"before": before, "after": after} if after else None
            audit.record(conn, now, "edit_replay" if after else "retry", [job_id], detail)
        return replayed

    _making_runnable(store, write)
    replayed = store.get_job(job_id)
    assert replayed is not None
    return replayed


def _current_arguments(
    registry: Mapping[str, Task[Any, Any]], job: Job
) -> tuple[list[Any], dict[str, Any]]:
    """``job``'s stored arguments as its registered task's version takes them (upcast
    from the version they were written for: docs/versions.md).

    :raises ValueError: they cannot be upcast; nothing changes.
    """
    task = registry.get(job.task)
    if task is None or job.version == task.version:
        return job.args, job.kwargs
    return task.upcast(job.version, job.args, job.kwargs)


def _edited_payload(
    store: Store,
    registry: Mapping[str, Task[Any, Any]],
    job: Job,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> tuple[str, str | None]:
    """The payload and concurrency key of ``job`` with new arguments, checked as an
    enqueue checks them."""
    task = registry.get(job.task)
    if task is None:
        raise ValueError(
            f"Job {job.id}'s task {job.task!r} is not registered in this app, so new "
            "arguments cannot be checked against it; edit them where the task is "
            "registered, or change only the queue or priority. Nothing was replayed."
        )
    try:
        return encode_arguments(store, task, args, kwargs, encoded=True)
    except (TypeError, ValueError) as exc:
        if exc.args and isinstance(exc.args[0], str):  # say what did not happen here
            message = exc.args[0].replace(" Nothing was enqueued.", "")
            exc.args = (f"{message} Nothing was replayed.", *exc.args[1:])
        raise


def duplicate(
    store: Store,
    registry: Mapping[str, Task[Any, Any]],
    job_id: int,
    *,
    audit: Audit | None = None,
) -> Job:
    """Enqueue a copy of any job as a new one: the same task, arguments, queue, priority
    and attempt budget, with fresh attempts, due now. Its idempotency key, dependencies
    and batch are not copied (a key names one job; the copy stands alone).

    The arguments of an earlier version of the task go through its upcasters
    (docs/versions.md), then are checked as any enqueue checks them, so a job whose task
    has since changed its signature with no upcaster is refused (a ``TypeError``)
    rather than copied.

    A task with a ``Unique`` key (docs/uniqueness.md) keeps it for the copy: while a job
    in scope holds the copy's key (the source itself, while pending), there is no copy
    to make, and the call is refused naming that job; nothing changes.

    :returns: the new job.
    :raises InvalidTransition: no such job, or the copy's unique key is held.
    :raises ValueError: its stored arguments do not decode, or cannot be upcast.
    """
    source = store.get_job(job_id)
    if source is None:
        raise InvalidTransition(f"No job with id {job_id}; nothing duplicated.")
    if source.payload_error:
        raise ValueError(
            f"Job {job_id} cannot be duplicated: its stored arguments do not decode "
            f"({source.payload_error}). Nothing was enqueued."
        )
    now = store.now()
    # A job of an earlier version of its task is copied as the task's version takes it;
    # one of a task not registered here keeps its own version, for the workers that run it.
    args, kwargs = _current_arguments(registry, source)
    version = source.version if source.task not in registry else None

    def write(conn: Connection) -> Job:
        options = EnqueueOptions(
            queue=source.queue,
            priority=source.priority,
            max_attempts=source.max_attempts,
            session=conn,
            version=version,
        )
        # The job's own row names its task, so a task this app does not register is
        # copied as it is, for the workers that run it.
        (made,) = enqueue(
            store,
            source.task,
            [Call(args, kwargs)],
            options,
            registry=registry,
            unregistered=True,
            encoded=True,
        )
        if made.created_at < now:
            # An enqueue that met the holder of its unique key returns that job (and,
            # with on_conflict="replace", gave it these arguments): undone by the raise.
            raise InvalidTransition(
                f"Job {job_id} was not duplicated: its task is unique, and job {made.id} "
                f"({made.status}) holds the copy's key; nothing enqueued."
            )
        if audit is not None:
            audit.record(conn, now, "duplicate", [job_id], {"new_job": made.id})
        return made

    made: Job = store.run_write(write)
    return made


def purge(store: Store, status: str, older_than: timedelta, *, audit: Audit | None = None) -> int:
    """Delete the finished jobs of ``status`` last changed more than ``older_than`` ago;
    with ``audit``, one entry says so (none if nothing was deleted).

    :raises InvalidTransition: ``status`` is not a finished status.
    :raises OverflowError: ``older_than`` reaches before the first year.
    """
    now = store.now()
    before = now - older_than

    def run(conn: Connection) -> int:
        n = actions.purge(conn, status, before)
        if audit is not None and n:
            detail = {"status": status, "before": before.isoformat(), "purged": n}
            audit.record(conn, now, "purge", detail=detail)
        return n

    purged: int = store.run_write(run)
    return purged


def audit_entries(
    store: Store, *, limit: int, before_id: int | None = None, job_id: int | None = None
) -> list[audit_log.Entry]:
    """The newest audit entries (of one job, if given), newest first."""
    with store.read() as conn:
        return audit_log.recent(conn, limit=limit, before_id=before_id, job_id=job_id)


def purge_audit(store: Store, older_than: timedelta, *, audit: Audit | None = None) -> int:
    """Delete the audit entries written more than ``older_than`` ago; with ``audit``, a
    new entry says who deleted how many (none if nothing was deleted).

    :raises OverflowError: ``older_than`` reaches before the first year.
    """
    now = store.now()
    before = now - older_than

    def run(conn: Connection) -> int:
        n = audit_log.prune(conn, before)
        if audit is not None and n:
            audit.record(
                conn, now, "purge_audit", detail={"before": before.isoformat(), "purged": n}
            )
        return n

    purged: int = store.run_write(run)
    return purged


def rescue(
    store: Store, stale_after: float, *, audit: Audit | None = None
) -> list[tuple[int, str, str]]:
    """Take back the running jobs of workers silent for ``stale_after`` seconds; wakes
    the workers for those that are pending again (see :func:`.roster.rescue`). With
    ``audit``, an entry per job taken back names its lost worker and its new status.

    :returns: ``(job id, new status, lost worker id)`` for each job taken back.
    """
    return roster.rescue(store, stale_after, audit=audit)


# -- queues ----------------------------------------------------------------------------------


def declared_queues(registry: Mapping[str, Task[Any, Any]]) -> set[str]:
    """The queues the registered tasks put their jobs in."""
    return {task.options.queue or "default" for task in registry.values()}


def known_queues(store: Store, registry: Mapping[str, Task[Any, Any]]) -> list[str]:
    """Every queue worth pausing, by name: the registered tasks', those that have jobs,
    and those paused before."""
    with store.read() as conn:
        return sorted(pausing.known_queues(conn, declared_queues(registry)))


def paused_queues(store: Store) -> dict[str, datetime]:
    """Every paused queue, with the time it was paused."""
    with store.read() as conn:
        return pausing.paused_queues(conn)


def set_paused(
    store: Store,
    names: Sequence[str],
    *,
    paused: bool,
    registry: Mapping[str, Task[Any, Any]],
    audit: Audit | None = None,
) -> list[str]:
    """Pause (or resume) every queue in ``names``; a resume wakes the workers.

    :returns: the queues whose state changed.
    :raises UnknownQueue: a name that no registered task uses and no job is in; nothing
        changes (nor for an invalid name, a ``ValueError``).
    """
    return pausing.set_paused(
        store, names, paused=paused, declared=declared_queues(registry), audit=audit
    )


# -- periodic schedules ----------------------------------------------------------------------


def set_schedule_enabled(
    store: Store,
    name: str,
    *,
    enabled: bool,
    registry: Mapping[str, Task[Any, Any]],
    audit: Audit | None = None,
) -> bool:
    """Enable or disable the periodic schedule ``name`` for every worker, on every host.

    A disabled schedule's slots are not enqueued from the next pass of each scheduler;
    enabled again, it carries on from its next slot (the ones missed meanwhile stay
    missed, with or without backfill).

    :returns: ``False`` if it was so already.
    :raises UnknownSchedule: no periodic task of ``registry`` is named ``name``; nothing
        changes.
    """
    task = periodic.find_schedule(registry, name)
    now = store.now()

    def write(conn: Connection) -> bool:
        changed = periodic.set_enabled(conn, task.name, enabled, now)
        if changed and audit is not None:
            action = "enable_schedule" if enabled else "disable_schedule"
            audit.record(conn, now, action, detail={"schedule": task.name})
        return changed

    changed: bool = store.run_write(write)
    return changed


def run_schedule(
    store: Store,
    name: str,
    *,
    registry: Mapping[str, Task[Any, Any]],
    eager: RunsJobs | None = None,
    audit: Audit | None = None,
) -> Job:
    """Enqueue one run of the periodic schedule ``name`` now, enabled or not; its next
    slot still runs on time (see :func:`.periodic.run_now`). With ``audit``, the job and
    its audit entry are written in one transaction.

    :raises UnknownSchedule: as :func:`set_schedule_enabled`; nothing is enqueued.
    """
    task = periodic.find_schedule(registry, name)
    if audit is None:
        return periodic.run_now(store, task, eager=eager)
    now = store.now()

    def write(conn: Connection) -> Job:
        job = periodic.run_now(store, task, conn=conn)
        audit.record(conn, now, "run_schedule", [job.id], {"schedule": task.name})
        return job

    job: Job = store.run_write(write)
    store.wake()
    if eager is not None:  # run once it is committed, as an eager enqueue does
        eager.run_job(job.id)
        job.refresh()
    return job

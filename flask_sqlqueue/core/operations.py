"""What a person does to the queue, one function each, whichever door it comes through:
the ``flask queue`` commands, the admin's buttons, or ``queue.pause()`` in Python.

Each runs in a write transaction of its own (retried while the database is busy, as
every write of the queue is) and is all or nothing. Every one that makes a job runnable
(retry, resume, rescue) also wakes the workers, so an idle worker does not wait out its
poll interval: ``NOTIFY`` inside the transaction, delivered only if it commits, for
workers listening on PostgreSQL on any host; then :meth:`Store.wake` once it has
committed, for workers in this process and, on SQLite, on this host (MariaDB workers
poll). Enqueueing has its own one path, :func:`.enqueue.enqueue`, which does the same.
Every one that ends or deletes jobs (cancel, delete, rescue) wakes their waiters
(``Job.wait``) the same two ways (:meth:`Store.run_finishing`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import datetime
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection

from . import lifecycle
from . import queries
from . import queues
from .lifecycle import Cancellation
from .models import JobStatus
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


def retry(store: Store, ids: Sequence[int]) -> int:
    """Replay dead or cancelled jobs with fresh attempts, to run now; wakes the workers.

    :returns: how many jobs were replayed.
    :raises InvalidTransition: an id is missing, or its job is neither dead nor
        cancelled; nothing is replayed.
    """
    now = store.now()
    return _making_runnable(store, lambda conn: lifecycle.replay(conn, ids, now))


def retry_dead(
    store: Store,
    *,
    queue: str | None = None,
    task: str | None = None,
    text: str | None = None,
    tag: str | None = None,
) -> int:
    """Replay every dead job (of ``queue``, of ``task``, matching ``text`` as the
    admin's search does, tagged ``tag``, each if given) with fresh attempts; wakes the
    workers.

    :returns: how many jobs were replayed.
    """
    now = store.now()

    def replay(conn: Connection) -> int:
        if not text and not tag:
            return lifecycle.replay_dead(conn, now, queue, task)
        where = queries.JobFilter(
            status=JobStatus.DEAD.value, queue=queue, task=task, text=text, tag=tag
        )
        ids = queries.job_ids(conn, where)
        return sum(
            lifecycle.replay(conn, ids[i : i + CHUNK], now) for i in range(0, len(ids), CHUNK)
        )

    return _making_runnable(store, replay)


def cancel(store: Store, ids: Sequence[int]) -> Cancellation:
    """Cancel waiting and pending jobs with their waiting dependents, and ask running
    ones to stop (see :func:`.lifecycle.cancel_jobs`).

    :raises InvalidTransition: an id is missing or its job finished; nothing changes.
    """
    now = store.now()
    done: Cancellation = store.run_finishing(
        lambda conn: lifecycle.cancel_jobs(conn, ids, now), lambda done: done.cancelled
    )
    return done


def delete(store: Store, ids: Sequence[int]) -> int:
    """Delete jobs that are not running; a deleted job that had not finished cancels its
    waiting dependents; waiters of the deleted jobs are woken (and learn it).

    :raises InvalidTransition: an id is missing or its job is running; nothing is deleted.
    """
    now = store.now()
    deleted: int = store.run_finishing(
        lambda conn: lifecycle.delete(conn, ids, now), lambda _deleted: sorted(set(ids))
    )
    return deleted


def purge(store: Store, status: str, older_than: timedelta) -> int:
    """Delete the finished jobs of ``status`` last changed more than ``older_than`` ago.

    :raises InvalidTransition: ``status`` is not a finished status.
    :raises OverflowError: ``older_than`` reaches before the first year.
    """
    before = store.now() - older_than
    purged: int = store.run_write(lambda conn: lifecycle.purge(conn, status, before))
    return purged


def rescue(store: Store, stale_after: float) -> list[tuple[int, str, str]]:
    """Take back the running jobs of workers silent for ``stale_after`` seconds; wakes
    the workers for those that are pending again (see :meth:`Store.rescue_stale`).

    :returns: ``(job id, new status, lost worker id)`` for each job taken back.
    """
    return store.rescue_stale(stale_after)


# -- queues ----------------------------------------------------------------------------------


def declared_queues(registry: Mapping[str, Task[Any, Any]]) -> set[str]:
    """The queues the registered tasks put their jobs in."""
    return {task.options.queue or "default" for task in registry.values()}


def known_queues(store: Store, registry: Mapping[str, Task[Any, Any]]) -> list[str]:
    """Every queue worth pausing, by name: the registered tasks', those that have jobs,
    and those paused before."""
    with store.read() as conn:
        return sorted(queues.known_queues(conn, declared_queues(registry)))


def paused_queues(store: Store) -> dict[str, datetime]:
    """Every paused queue, with the time it was paused."""
    with store.read() as conn:
        return queues.paused_queues(conn)


def set_paused(
    store: Store, names: Sequence[str], *, paused: bool, registry: Mapping[str, Task[Any, Any]]
) -> list[str]:
    """Pause (or resume) every queue in ``names``; a resume wakes the workers.

    :returns: the queues whose state changed.
    :raises UnknownQueue: a name that no registered task uses and no job is in; nothing
        changes (nor for an invalid name, a ``ValueError``).
    """
    return queues.set_paused(store, names, paused=paused, declared=declared_queues(registry))

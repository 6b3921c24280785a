"""Chains and batches: workflows on top of job dependencies (docs/workflows.md).

A chain is a list of steps, each depending on the one before: written in one
transaction, it needs nothing the dependencies do not already give (a step that ends
dead or cancelled cancels the rest).

A batch is a group of member jobs with up to three callback jobs, all written in one
transaction with a row in ``sqlqueue_batches``; every member and callback carries the
batch's id in ``sqlqueue_jobs.batch_id``, which only enqueueing writes, so a job's end
costs nothing more for being in a batch. The callbacks wait on every member over edges
of their own kind (core/features/dependencies.py): ``on_success`` requires each to have
completed, ``on_complete`` each to have finished, and ``on_failure`` each to have
finished and one not to have completed. The release or cancellation of each happens in
the transaction that ends the last member, as for any dependent.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import actions
from .actions import Cancellation
from .enqueue import RunsJobs
from .enqueue import enqueue
from .features import dependencies
from .jobs import Job
from .models import JobStatus
from .models import batches
from .models import jobs
from .options import Call
from .options import EnqueueOptions
from .options import Machinery
from .store import Store
from .tasks import Step
from .tasks import Task

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import scoped_session

    Target = Session | scoped_session[Any] | Connection

#: The statuses a member has finished in.
FINISHED = (JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value)
#: Each callback of a batch: what it requires of every member.
CALLBACKS = {
    "on_success": dependencies.REQUIRE_COMPLETED,
    "on_failure": dependencies.REQUIRE_FAILED,
    "on_complete": dependencies.REQUIRE_FINISHED,
}


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a batch's members got: ``counts`` by status (every status present),
    ``done`` of ``size`` finished, whatever the outcome."""

    counts: dict[str, int]
    size: int

    @property
    def done(self) -> int:
        return sum(self.counts.get(status, 0) for status in FINISHED)

    def __str__(self) -> str:
        return f"{self.done} of {self.size} done"


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch of jobs with callbacks, as stored; :meth:`progress`, :attr:`jobs` and
    :meth:`cancel` read or write the database each time."""

    id: int
    label: str | None
    #: Its members, the callbacks not counted.
    size: int
    created_at: datetime
    on_success_id: int | None
    on_failure_id: int | None
    on_complete_id: int | None
    _store: Store = field(repr=False, compare=False)

    @property
    def callback_ids(self) -> list[int]:
        """The ids of its callback jobs."""
        found = (self.on_success_id, self.on_failure_id, self.on_complete_id)
        return [job_id for job_id in found if job_id is not None]

    @property
    def jobs(self) -> list[Job]:
        """Its member jobs as they are now, by id (callbacks not included)."""
        with self._store.read() as conn:
            return self._store.read_jobs(conn, self._members(sa.select(jobs)).order_by(jobs.c.id))

    @property
    def on_success(self) -> Job | None:
        return self._callback(self.on_success_id)

    @property
    def on_failure(self) -> Job | None:
        return self._callback(self.on_failure_id)

    @property
    def on_complete(self) -> Job | None:
        return self._callback(self.on_complete_id)

    def progress(self) -> Progress:
        """Its members counted by status: ``str(batch.progress())`` is ``"3 of 5 done"``."""
        with self._store.read() as conn:
            return progress(conn, self)

    def summary(self, job_id: int | None = None) -> str:
        """``"12 (nightly): 3 of 5 done"``, for people; given one of its jobs, ends with
        what that job is to it, if a callback (``", its on_complete"``)."""
        label = "" if self.label is None else f" ({self.label})"
        role = next(
            (
                f", its {name}"
                for name, callback in (
                    ("on_success", self.on_success_id),
                    ("on_failure", self.on_failure_id),
                    ("on_complete", self.on_complete_id),
                )
                if job_id is not None and callback == job_id
            ),
            "",
        )
        return f"{self.id}{label}: {self.progress()}{role}"

    def cancel(self) -> Cancellation:
        """Cancel what has not run (see :func:`cancel_batch`)."""
        return cancel_batch(self._store, self.id)

    def _members(self, select: sa.Select[Any]) -> sa.Select[Any]:
        return select.where(jobs.c.batch_id == self.id, jobs.c.id.notin_(self.callback_ids))

    def _callback(self, job_id: int | None) -> Job | None:
        return None if job_id is None else self._store.get_job(job_id)


# -- writing ---------------------------------------------------------------------------------


def chain(
    store: Store,
    steps: Sequence[Step],
    *,
    session: Target | None = None,
    registry: Mapping[str, Task[Any, Any]] | None = None,
    eager: RunsJobs | None = None,
) -> list[Job]:
    """Write ``steps`` as jobs, each depending on the one before (and on what its own
    ``depends_on`` names), in one transaction: the queue's own, committed on return, or
    ``session``'s. Returns the jobs, in order.

    :raises ValueError: there is no step; nothing is written.
    :raises TypeError: a step is not a :class:`Step`, or its arguments do not fit its
        task; nothing is written.
    """
    steps = _checked(steps, "chain")

    def write(target: Target) -> list[Job]:
        made: list[Job] = []
        for step in steps:
            after = [made[-1].id] if made else []
            made.append(_write(store, step, target, registry, depends_on=after))
        return made

    return _in_one_transaction(store, session, write, eager)


def batch(
    store: Store,
    steps: Sequence[Step],
    *,
    on_success: Step | None = None,
    on_failure: Step | None = None,
    on_complete: Step | None = None,
    label: str | None = None,
    session: Target | None = None,
    registry: Mapping[str, Task[Any, Any]] | None = None,
    eager: RunsJobs | None = None,
) -> Batch:
    """Write a batch: its row, a member job per step, and each callback given, waiting
    for every member (:data:`CALLBACKS`), in one transaction as :func:`chain`.

    :raises ValueError: there is no step, a step has an ``idempotency_key`` or is
        ``unique`` (a job that holds its key already cannot join the batch), or
        ``label`` is longer than 255 characters; nothing is written.
    """
    steps = _checked(steps, "batch")
    given = {
        name: step
        for name, step in (
            ("on_success", on_success),
            ("on_failure", on_failure),
            ("on_complete", on_complete),
        )
        if step is not None
    }
    for name, step in given.items():
        _checked([step], name)
    for step in [*steps, *given.values()]:
        if step.options.idempotency_key is not None:
            raise ValueError(
                f"A step of a batch cannot have an idempotency_key ({step!r} has "
                f"{step.options.idempotency_key!r}): a job that holds it already could not "
                "join the batch. Nothing was enqueued."
            )
        if step.options.unique is not None:
            raise ValueError(
                f"A step of a batch cannot be unique ({step!r} has unique="
                f"{step.options.unique!r}): a job that holds its key already could not "
                "join the batch. Nothing was enqueued."
            )
    if label is not None and (not isinstance(label, str) or len(label) > 255):
        raise ValueError(f"label must be a string of at most 255 characters, got {label!r}.")

    now = store.now()
    written: dict[str, int] = {}

    def write(target: Target) -> list[Job]:
        conn = store.caller_connection(target)
        inserted = conn.execute(
            sa.insert(batches).values(label=label, size=len(steps), created_at=now)
        ).inserted_primary_key
        assert inserted is not None
        batch_id = int(inserted[0])
        written.clear()
        written["id"] = batch_id
        members = [_write(store, step, target, registry, batch_id=batch_id) for step in steps]
        ids = [job.id for job in members]
        callbacks = {
            name: _write(
                store,
                step,
                target,
                registry,
                depends_on=ids,
                require=CALLBACKS[name],
                batch_id=batch_id,
            )
            for name, step in given.items()
        }
        written.update({f"{name}_id": job.id for name, job in callbacks.items()})
        if callbacks:
            conn.execute(
                sa.update(batches)
                .where(batches.c.id == batch_id)
                .values({f"{name}_id": job.id for name, job in callbacks.items()})
            )
        return [*members, *callbacks.values()]

    _in_one_transaction(store, session, write, eager)
    return Batch(
        id=written["id"],
        label=label,
        size=len(steps),
        created_at=now,
        on_success_id=written.get("on_success_id"),
        on_failure_id=written.get("on_failure_id"),
        on_complete_id=written.get("on_complete_id"),
        _store=store,
    )


def _checked(steps: Sequence[Step], what: str) -> list[Step]:
    if isinstance(steps, Step) or not isinstance(steps, Sequence):
        raise TypeError(f"{what} takes a list of steps (task.step(...)), got {steps!r}.")
    steps = list(steps)
    if not steps:
        raise ValueError(f"A {what} needs at least one step; nothing was enqueued.")
    for step in steps:
        if not isinstance(step, Step):
            raise TypeError(
                f"{what}: {step!r} is not a step; write task.step(...) or "
                "task.using(...).step(...)."
            )
    return steps


def _write(
    store: Store,
    step: Step,
    target: Target,
    registry: Mapping[str, Task[Any, Any]] | None,
    *,
    depends_on: Sequence[int] = (),
    require: str | None = None,
    batch_id: int | None = None,
) -> Job:
    """Write one step's job in ``target``'s transaction."""
    options = step.options.merged(
        EnqueueOptions(
            session=target,
            depends_on=[*step.options.dependency_ids, *depends_on] or None,
        )
    )
    (job,) = enqueue(
        store,
        step.task,
        [Call(step.args, step.kwargs)],
        options,
        registry=registry,
        machinery=Machinery(require=require, batch_id=batch_id),
    )
    return job


def _in_one_transaction(
    store: Store,
    session: Target | None,
    write: Any,
    eager: RunsJobs | None,
) -> list[Job]:
    """``write(target)`` in ``session``'s transaction, or in one of the queue's own,
    committed on return; in eager mode, then run each job written that can run, in
    order (a chain's next step is pending once the one before completed)."""
    if session is not None:
        made: list[Job] = write(session)
        return made
    with store.write() as conn:
        made = write(conn)
    store.wake()
    if eager is not None:
        for job in made:
            eager.run_job(job.id)
            job.refresh()
    return made


# -- reading and cancelling ----------------------------------------------------------------


def get_batch(store: Store, batch_id: int) -> Batch | None:
    """The batch with this id, or ``None``."""
    with store.read() as conn:
        row = conn.execute(sa.select(batches).where(batches.c.id == batch_id)).first()
    if row is None:
        return None
    return Batch(**row._mapping, _store=store)


def progress(conn: Connection, batch: Batch) -> Progress:
    """The members of ``batch`` counted by status."""
    rows = conn.execute(
        batch._members(sa.select(jobs.c.status, sa.func.count())).group_by(jobs.c.status)
    )
    counts = {status.value: 0 for status in JobStatus}
    counts.update({status: count for status, count in rows})
    return Progress(counts, batch.size)


def cancel_batch(store: Store, batch_id: int) -> Cancellation:
    """Cancel the members and callbacks of batch ``batch_id`` that are waiting or
    pending, and ask those running to stop, in one transaction: the callbacks go with
    the members, so none is released by a member cancelled here.

    :raises LookupError: no batch has this id.
    """
    found = get_batch(store, batch_id)
    if found is None:
        raise LookupError(f"No batch has id {batch_id}.")
    now = store.now()

    def cancel(conn: Connection) -> Cancellation:
        unfinished = list(
            conn.execute(
                sa.select(jobs.c.id).where(
                    jobs.c.batch_id == batch_id, jobs.c.status.notin_(FINISHED)
                )
            ).scalars()
        )
        return actions.cancel_jobs(conn, unfinished, now)

    done: Cancellation = store.run_write(cancel)
    return done

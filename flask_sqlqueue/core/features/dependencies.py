"""Job dependencies: a job that waits for others to complete (docs/workflows.md).

A job enqueued with ``depends_on`` gets one row per dependency in
``sqlqueue_job_dependencies`` and starts ``waiting``; it becomes ``pending`` once every
one of them is ``completed``, and ends ``cancelled`` if one ends ``dead`` or
``cancelled``, as its own waiting dependents then do. Both happen in the transaction that
records the dependency's end (``core/transitions.py`` calls :func:`release` and
:func:`cancel_dependents`), so a crash cannot leave a dependent waiting for good, nor
release it twice: either the end and its consequences commit, or neither does.

Why it is safe with many writers (on the servers, READ COMMITTED):

- A job's dependents are found through ``has_dependents``, a flag on the job's own row,
  set under that row's lock by the enqueue of a dependent (:func:`prepare`). The write
  that finishes the job locks the same row, so it sees the flag of any dependent
  committed before it, and an enqueue that waited for it sees the job finished. A job
  without dependents therefore costs its end nothing more: no look at the edges.
- Two dependencies of one job may end at once, in two transactions. Each locks the
  waiting dependents (in id order) before it reads their dependencies' statuses in a
  statement of its own, which sees what committed while it waited for the lock: the
  second to take the lock sees the first's end, and the dependent is released (or
  cancelled) once, by whichever sees the last dependency end.
- A dependency cannot be purged while a dependent waits for it, except a completed one,
  and a dependency that is gone counts as completed. Deleting a job that has not finished
  cancels its waiting dependents first (:func:`settle`).

Cycles cannot happen: a dependency must exist before the job that depends on it.

What an edge requires of its dependency (its ``require``, :data:`REQUIRES`): that it
``completed`` (the default, as above); that it ``finished``, whatever the outcome (a
batch's ``on_complete``); or that it finished and that one of the dependent's ``failed``
dependencies did not complete (a batch's ``on_failure``, core/batches.py), else the
dependent ends ``cancelled`` without running. Only ``completed`` edges carry a
cancellation on: a dependency that ends dead or cancelled releases the dependents that
wait for it to have finished, in the same transaction, as a completion does.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...exceptions import ids_text
from ..models import JobRow
from ..models import JobStatus
from ..models import dependencies
from ..models import jobs
from ..payload import decode_value

WAITING = JobStatus.WAITING.value
PENDING = JobStatus.PENDING.value
COMPLETED = JobStatus.COMPLETED.value
DEAD = JobStatus.DEAD.value
CANCELLED = JobStatus.CANCELLED.value

#: What a dependent requires of a dependency (the ``require`` of an edge).
REQUIRE_COMPLETED = "completed"
REQUIRE_FINISHED = "finished"
REQUIRE_FAILED = "failed"
REQUIRES = (REQUIRE_COMPLETED, REQUIRE_FINISHED, REQUIRE_FAILED)
#: The statuses a job ends in.
ENDED = (COMPLETED, DEAD, CANCELLED)

#: The error type in ``last_error`` of a job cancelled for one of its dependencies.
KIND = "DependencyFailed"
#: Ids per ``IN (…)``: far below every database's limit on bound parameters.
CHUNK = 500


def _chunks(ids: Iterable[int]) -> Iterator[list[int]]:
    ordered = sorted(set(ids))
    for start in range(0, len(ordered), CHUNK):
        yield ordered[start : start + CHUNK]


def _ended(job_id: int, status: str, noun: str = "dependency") -> str:
    """``"dependency 5 is dead"``: why a job depending on ``job_id`` is cancelled."""
    return f"{noun} {job_id} is dead" if status == DEAD else f"{noun} {job_id} was {status}"


def _not_needed(batch_id: int | None) -> str:
    """Why a job that runs only after a failure is cancelled: there was none."""
    if batch_id is None:
        return "NotNeeded: every dependency completed"
    return f"NotNeeded: batch {batch_id}: every member completed"


# -- enqueueing a dependent ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """How a job with dependencies starts, given their statuses when it is written."""

    status: str
    #: For a job that starts ``cancelled``: the dependency that ended badly.
    last_error: str | None = None

    def values(self, now: datetime) -> JobRow:
        """The columns of the new job's row that this decides."""
        finished = self.status == CANCELLED
        return {
            "status": self.status,
            "last_error": self.last_error,
            "finished_at": now if finished else None,
        }


def prepare(
    conn: Connection,
    depends_on: Sequence[int],
    *,
    replayed: Collection[int] | None = None,
    require: str | None = None,
    batch_id: int | None = None,
) -> Start:
    """Lock the dependencies ``depends_on`` (in id order, until the transaction ends),
    flag those that may still finish as having dependents, and say how a job depending
    on them starts: ``pending`` if all completed, ``cancelled`` if one is dead or
    cancelled, else ``waiting``. With ``require`` ``finished``: ``pending`` once all
    ended, else ``waiting``; ``failed``: the same, but ``cancelled`` if all completed
    (naming ``batch_id``, if given).

    :param replayed: for a job being replayed, the jobs replayed with it (they count as
        pending); a dependency that is gone then counts as completed.
    :raises ValueError: an id names no job (of a new job); nothing has been written then.
    """
    ids = sorted(set(depends_on))
    found: dict[int, tuple[str, bool]] = {}
    for chunk in _chunks(ids):
        rows = conn.execute(
            sa.select(jobs.c.id, jobs.c.status, jobs.c.has_dependents)
            .where(jobs.c.id.in_(chunk))
            .order_by(jobs.c.id)
            .with_for_update()
        )
        found.update((row.id, (row.status, bool(row.has_dependents))) for row in rows)
    missing = [job_id for job_id in ids if job_id not in found]
    if replayed is not None:
        found.update((job_id, (COMPLETED, True)) for job_id in missing)
    elif missing:
        raise ValueError(
            f"depends_on names no job with id {ids_text(missing)}; "
            "a dependency must be enqueued first. Nothing was enqueued."
        )
    statuses = {
        job_id: PENDING if job_id in (replayed or ()) else status
        for job_id, (status, _) in found.items()
    }
    unflagged = [
        job_id
        for job_id, (_, flagged) in found.items()
        if not flagged and statuses[job_id] not in (COMPLETED, DEAD, CANCELLED)
    ]
    for chunk in _chunks(unflagged):
        conn.execute(sa.update(jobs).where(jobs.c.id.in_(chunk)).values(has_dependents=True))
    if require not in (None, REQUIRE_COMPLETED):
        if any(status not in ENDED for status in statuses.values()):
            return Start(WAITING)
        if require == REQUIRE_FAILED and all(s == COMPLETED for s in statuses.values()):
            return Start(CANCELLED, _not_needed(batch_id))
        return Start(PENDING)
    for job_id in ids:
        if statuses[job_id] in (DEAD, CANCELLED):
            return Start(CANCELLED, f"{KIND}: {_ended(job_id, statuses[job_id])}")
    if all(status == COMPLETED for status in statuses.values()):
        return Start(PENDING)
    return Start(WAITING)


def link(
    conn: Connection,
    job_ids: Sequence[int],
    depends_on: Sequence[int],
    *,
    require: str | None = None,
) -> None:
    """Write the edges from each of ``job_ids`` to each of ``depends_on``, each
    requiring ``require`` (``completed`` if ``None``)."""
    kind = require or REQUIRE_COMPLETED
    rows = [
        {"job_id": job_id, "depends_on_id": dependency, "require": kind}
        for job_id in dict.fromkeys(job_ids)
        for dependency in sorted(set(depends_on))
    ]
    if rows:
        conn.execute(sa.insert(dependencies), rows)


# -- a dependency ends ---------------------------------------------------------------------


def _dependents(conn: Connection, of: Collection[int], *, completed: bool = False) -> list[int]:
    """The ids of the jobs that depend on any of ``of`` (whatever their status); with
    ``completed``, only over edges that require it to complete."""
    found: set[int] = set()
    kind = [dependencies.c.require == REQUIRE_COMPLETED] if completed else []
    for chunk in _chunks(of):
        found.update(
            conn.execute(
                sa.select(dependencies.c.job_id).where(
                    dependencies.c.depends_on_id.in_(chunk), *kind
                )
            ).scalars()
        )
    return sorted(found)


def _lock_waiting(conn: Connection, ids: Collection[int]) -> list[int]:
    """Those of ``ids`` still waiting, locked in id order until the transaction ends."""
    locked: list[int] = []
    for chunk in _chunks(ids):
        locked += conn.execute(
            sa.select(jobs.c.id)
            .where(jobs.c.id.in_(chunk), jobs.c.status == WAITING)
            .order_by(jobs.c.id)
            .with_for_update()
        ).scalars()
    return locked


#: An edge whose dependency has not yet done what the dependent requires of it.
_UNMET = sa.or_(
    sa.and_(dependencies.c.require == REQUIRE_COMPLETED, jobs.c.status != COMPLETED),
    sa.and_(dependencies.c.require != REQUIRE_COMPLETED, jobs.c.status.notin_(ENDED)),
)


def _edges_to(conn: Connection, ids: Collection[int], *where: Any) -> set[int]:
    """Those of ``ids`` with an edge to a job (still in the table) that meets ``where``."""
    found: set[int] = set()
    for chunk in _chunks(ids):
        found.update(
            conn.execute(
                sa.select(dependencies.c.job_id)
                .join(jobs, jobs.c.id == dependencies.c.depends_on_id)
                .where(dependencies.c.job_id.in_(chunk), *where)
            ).scalars()
        )
    return found


def release(conn: Connection, completed: Collection[int], now: datetime) -> list[int]:
    """Make ``pending`` (due now, or at its own ``run_at`` if later) each waiting
    dependent of the jobs ``completed`` (or ended otherwise) whose every dependency has
    done what it requires now; a dependency no longer in the table counts as completed.
    A dependent that runs only after a failure (``failed`` edges) and saw none ends
    ``cancelled`` instead, and so do its waiting dependents. Call it in the transaction
    that ended them. Returns the ids released."""
    if not completed:
        return []
    waiting = _lock_waiting(conn, _dependents(conn, completed))
    if not waiting:
        return []
    # A statement of its own, after the locks: it sees every end committed meanwhile.
    blocked = _edges_to(conn, waiting, _UNMET)
    ready = [job_id for job_id in waiting if job_id not in blocked]
    on_failure: set[int] = set()
    for chunk in _chunks(ready):
        on_failure.update(
            conn.execute(
                sa.select(dependencies.c.job_id).where(
                    dependencies.c.job_id.in_(chunk), dependencies.c.require == REQUIRE_FAILED
                )
            ).scalars()
        )
    if on_failure:
        failed = dependencies.c.require == REQUIRE_FAILED
        unneeded = on_failure - _edges_to(conn, on_failure, failed, jobs.c.status != COMPLETED)
        _cancel_unneeded(conn, unneeded, now)
        ready = [job_id for job_id in ready if job_id not in unneeded]
    due = sa.bindparam("b_now", now, type_=jobs.c.run_at.type)
    for chunk in _chunks(ready):
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id.in_(chunk), jobs.c.status == WAITING)
            .values(
                status=PENDING,
                run_at=sa.case((jobs.c.run_at > due, jobs.c.run_at), else_=due),
                updated_at=now,
            )
        )
    return ready


def cancel_dependents(conn: Connection, ended: Mapping[int, str], now: datetime) -> list[int]:
    """Cancel the waiting dependents of the jobs ``ended`` (id: the status each ended
    in, ``dead`` or ``cancelled``, or why it is gone), then theirs, and so on; each one's
    ``last_error`` names the dependency it was cancelled for. Call it in the transaction
    that ended them. Returns the ids cancelled."""
    # Why each job of the frontier stops its dependents, and the end that started the
    # cascade (``None`` for the jobs of ``ended`` themselves).
    causes: dict[int, tuple[str, str | None]] = {
        job_id: (_ended(job_id, status), None) for job_id, status in ended.items()
    }
    roots = {job_id: _ended(job_id, status, "job") for job_id, status in ended.items()}
    cancelled: list[int] = []
    frontier: Collection[int] = list(causes)
    while frontier:
        waiting = _lock_waiting(conn, _dependents(conn, frontier, completed=True))
        if not waiting:
            break
        named: dict[int, int] = {}  # dependent -> the (lowest) dependency it stops for
        for chunk in _chunks(waiting):
            rows = conn.execute(
                sa.select(dependencies.c.job_id, dependencies.c.depends_on_id).where(
                    dependencies.c.job_id.in_(chunk),
                    dependencies.c.depends_on_id.in_(sorted(frontier)),
                    dependencies.c.require == REQUIRE_COMPLETED,
                )
            )
            for job_id, dependency in rows:
                named[job_id] = min(dependency, named.get(job_id, dependency))
        by_error: dict[str, list[int]] = {}
        for job_id in waiting:
            dependency = named[job_id]
            reason, root = causes[dependency]
            error = f"{KIND}: {reason}" + ("" if root is None else f" ({root})")
            by_error.setdefault(error, []).append(job_id)
            causes[job_id] = (f"dependency {job_id} was cancelled", root or roots[dependency])
        for error, ids in by_error.items():
            for chunk in _chunks(ids):
                conn.execute(
                    sa.update(jobs)
                    .where(jobs.c.id.in_(chunk), jobs.c.status == WAITING)
                    .values(status=CANCELLED, last_error=error, finished_at=now, updated_at=now)
                )
        cancelled += waiting
        frontier = waiting
    # The dependents that wait for these jobs to have finished, whatever the outcome.
    release(conn, [*ended, *cancelled], now)
    return cancelled


def _cancel_unneeded(conn: Connection, ids: Collection[int], now: datetime) -> None:
    """Cancel the waiting jobs ``ids``, which run only after a failure, and none came;
    then their own waiting dependents."""
    if not ids:
        return
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.batch_id).where(jobs.c.id.in_(sorted(ids))))
    for job_id, batch_id in rows.all():
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status == WAITING)
            .values(
                status=CANCELLED, last_error=_not_needed(batch_id), finished_at=now, updated_at=now
            )
        )
    cancel_dependents(conn, dict.fromkeys(sorted(ids), CANCELLED), now)


def settle(conn: Connection, ids: Collection[int], now: datetime) -> None:
    """Release or cancel the waiting dependents of those of the jobs ``ids`` that have
    any, as each job's status now says: for the ends that do not already know whether
    their job has dependents (the rarer ones: cancelling, handing back, deleting)."""
    ended: dict[int, str] = {}
    completed: list[int] = []
    for chunk in _chunks(ids):
        rows = conn.execute(
            sa.select(jobs.c.id, jobs.c.status).where(jobs.c.id.in_(chunk), jobs.c.has_dependents)
        )
        for job_id, status in rows:
            if status == COMPLETED:
                completed.append(job_id)
            elif status in (DEAD, CANCELLED):
                ended[job_id] = status
    if ended:
        cancel_dependents(conn, ended, now)
    if completed:
        release(conn, completed, now)


def depends_on(conn: Connection, job_ids: Collection[int]) -> dict[int, list[int]]:
    """The dependencies of each of ``job_ids`` that has any, by id."""
    found: dict[int, list[int]] = {}
    for chunk in _chunks(job_ids):
        rows = conn.execute(
            sa.select(dependencies.c.job_id, dependencies.c.depends_on_id)
            .where(dependencies.c.job_id.in_(chunk))
            .order_by(dependencies.c.job_id, dependencies.c.depends_on_id)
        )
        for job_id, dependency in rows:
            found.setdefault(job_id, []).append(dependency)
    return found


# -- reading ---------------------------------------------------------------------------------


def results(conn: Connection, job_id: int) -> dict[int, Any]:
    """The result of each dependency of ``job_id`` that is still in the table, by id."""
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.result)
        .join(dependencies, dependencies.c.depends_on_id == jobs.c.id)
        .where(dependencies.c.job_id == job_id)
        .order_by(jobs.c.id)
    )
    found = {}
    for row in rows:
        try:
            found[row.id] = decode_value(row.result)
        except ValueError:  # edited by hand into text that is not JSON: given as it is
            found[row.id] = row.result
    return found


@dataclass(frozen=True, slots=True)
class Edges:
    """A job's place in its workflow: ``(id, status)`` of what it depends on (``None``
    for a dependency that is gone) and of what depends on it, by id."""

    dependencies: list[tuple[int, str | None]]
    dependents: list[tuple[int, str]]


def job_edges(conn: Connection, job_id: int) -> Edges:
    """The dependencies and dependents of ``job_id``, each with its status."""
    before = conn.execute(
        sa.select(dependencies.c.depends_on_id, jobs.c.status)
        .outerjoin(jobs, jobs.c.id == dependencies.c.depends_on_id)
        .where(dependencies.c.job_id == job_id)
        .order_by(dependencies.c.depends_on_id)
    ).all()
    after = conn.execute(
        sa.select(jobs.c.id, jobs.c.status)
        .join(dependencies, dependencies.c.job_id == jobs.c.id)
        .where(dependencies.c.depends_on_id == job_id)
        .order_by(jobs.c.id)
    ).all()
    return Edges([(i, s) for i, s in before], [(i, s) for i, s in after])


@dataclass(frozen=True, slots=True)
class Workflow:
    """The jobs joined to one job by dependencies, either way: ``jobs`` maps each id to
    ``(task, status)``, or to ``None`` for a dependency that is gone (purged);
    ``edges`` holds ``(dependency, dependent)`` pairs. ``partial``: the walk stopped at
    its limit, so some members are missing."""

    jobs: dict[int, tuple[str, str] | None]
    edges: list[tuple[int, int]]
    partial: bool


def workflow(conn: Connection, job_id: int, most: int = 300) -> Workflow:
    """The workflow of ``job_id``: every job reached from it over dependency edges in
    either direction, breadth first, at most ``most`` of them."""
    seen = {job_id}
    frontier = [job_id]
    edges: set[tuple[int, int]] = set()
    partial = False
    while frontier and not partial:
        found: list[int] = []
        for chunk in _chunks(frontier):
            rows = conn.execute(
                sa.select(dependencies.c.depends_on_id, dependencies.c.job_id).where(
                    sa.or_(
                        dependencies.c.job_id.in_(chunk), dependencies.c.depends_on_id.in_(chunk)
                    )
                )
            )
            for dependency, dependent in rows:
                for other in (dependency, dependent):
                    if other in seen:
                        continue
                    if len(seen) >= most:
                        partial = True
                        continue
                    seen.add(other)
                    found.append(other)
                if dependency in seen and dependent in seen:
                    edges.add((dependency, dependent))
        frontier = found
    members: dict[int, tuple[str, str] | None] = dict.fromkeys(sorted(seen))
    for chunk in _chunks(seen):
        rows = conn.execute(
            sa.select(jobs.c.id, jobs.c.task, jobs.c.status).where(jobs.c.id.in_(chunk))
        )
        for row in rows:
            members[row.id] = (row.task, row.status)
    return Workflow(members, sorted(edges), partial)

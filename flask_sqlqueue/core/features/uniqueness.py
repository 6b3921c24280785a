"""Scoped uniqueness and debounce (docs/uniqueness.md): at most one job per key while
the job is in scope, and what an enqueue does when another holds the key.

A job enqueued with :class:`Unique` stores a key in ``sqlqueue_jobs.unique_key``, which
a unique index covers, so two producers racing can never both insert: the database
refuses the second row whatever the timing. The key is freed *lazily*: no write that
moves a job along its life (claim, completion, failure, cancellation, rescue) touches
it, so those hot paths cost what they did. An enqueue reads the job holding its key
and asks the scope of its own :class:`Unique` whether that job still counts; if not,
it clears the holder's key with a guarded ``UPDATE … WHERE unique_key = :key AND <out
of scope>`` (the test is made again in that statement, under the row's lock) and
inserts. Purging or deleting a job frees its key with its row. An enqueue that finds
the holder in scope and skips writes nothing and locks nothing.

Everything here is the same SQL on every database; the insert that may find its key
held is the dialect's (``DialectOps.insert_unique``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import Any
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..models import JobRow
from ..models import JobStatus
from ..models import jobs
from ..payload import decode_payload
from ..payload import is_unicode

Scope = Literal["pending", "active", "any"]
OnConflict = Literal["skip", "replace"]

#: The statuses of a job that has not started: the only ones ``replace`` changes.
NOT_STARTED = (JobStatus.WAITING.value, JobStatus.PENDING.value)
#: The statuses in which a holder keeps its key, by scope (``any``: every status).
SCOPES: dict[str, tuple[str, ...] | None] = {
    "pending": NOT_STARTED,
    "active": (*NOT_STARTED, JobStatus.RUNNING.value),
    "any": None,
}
ON_CONFLICT = ("skip", "replace")
#: Characters a stored key may have (the column's length).
MAX_KEY = 255


@dataclass(frozen=True, slots=True)
class Unique:
    """At most one job of a task per key while the job is in scope.

    ``search_index.using(unique=Unique(on_conflict="replace"), delay=30).enqueue(doc_id)``
    called ten times in a burst leaves one job, due 30 seconds after the last call.

    :param key: what makes two calls the same job, within the task: ``None`` (the
        default) for the task's arguments (``f(1)`` and ``f(x=1)`` are the same call);
        a string (1-255 characters) for that key, whatever the arguments.
    :param scope: while a job holds its key: ``"pending"`` (the default) until it
        starts, that is while it is waiting or pending (pending for a retry included);
        ``"active"`` until it finishes (pending or running); ``"any"`` whatever its
        status, as long as the row exists (or the ``period`` lasts).
    :param period: seconds (or a timedelta) after a job was enqueued during which it
        may hold its key, on top of ``scope``; ``None``: no time limit.
    :param on_conflict: ``"skip"`` (the default): return the job that holds the key and
        write nothing. ``"replace"``: if that job has not started, give it this call's
        arguments and ``run_at`` (the debounce) and return it; a job that has started is
        never changed, and is returned as with ``"skip"``.
    """

    key: str | None = None
    scope: Scope = "pending"
    period: float | timedelta | None = None
    on_conflict: OnConflict = "skip"

    def __post_init__(self) -> None:
        if self.key is not None and (
            not isinstance(self.key, str)
            or not 1 <= len(self.key) <= MAX_KEY
            or "\x00" in self.key
            or not is_unicode(self.key)
        ):
            raise ValueError(
                f"Unique(key={self.key!r}): pass a string of 1-255 characters of valid "
                "Unicode text, without NUL, "
                "or None to make the task's arguments the key."
            )
        if self.scope not in SCOPES:
            raise ValueError(
                f"Unique(scope={self.scope!r}): pass one of {', '.join(map(repr, SCOPES))}."
            )
        if self.on_conflict not in ON_CONFLICT:
            raise ValueError(f"Unique(on_conflict={self.on_conflict!r}): pass 'skip' or 'replace'.")
        if self.period is not None:
            seconds = (
                self.period.total_seconds()
                if isinstance(self.period, timedelta)
                else self.period
                if isinstance(self.period, int | float) and not isinstance(self.period, bool)
                else None
            )
            if seconds is None or not 0 < seconds < 10**9:
                raise ValueError(
                    f"Unique(period={self.period!r}): pass a positive number of seconds "
                    "(below 10**9) or a timedelta, or None for no time limit."
                )

    @property
    def period_seconds(self) -> float | None:
        """:attr:`period` in seconds."""
        period = self.period
        return period.total_seconds() if isinstance(period, timedelta) else period

    def token(self, task: str, payload: str, signature: inspect.Signature | None) -> str:
        """The key stored for a call of ``task`` with these (encoded) arguments: within
        the task, the given key or the arguments bound to the task's signature, so that
        positional and keyword spellings of one call agree. Readable when it fits in
        :data:`MAX_KEY` characters, else a SHA-256 of it."""
        if self.key is not None:
            token = f"{task}:key:{self.key}"
        else:
            token = f"{task}:args:{_digest(_canonical_arguments(payload, signature))}"
        if len(token) > MAX_KEY:
            token = f"sha256:{_digest(token)}"
        return token


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical_arguments(payload: str, signature: inspect.Signature | None) -> str:
    args, kwargs = decode_payload(payload)
    call: Any = {"args": args, "kwargs": kwargs}
    if signature is not None:
        try:
            call = dict(signature.bind(*args, **kwargs).arguments)
        except TypeError:  # an unregistered task's call: keep it as given
            pass
    return json.dumps(call, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def out_of_scope(unique: Unique, now: datetime) -> sa.ColumnElement[bool]:
    """The SQL test for a holder whose key ``unique``'s scope no longer counts at
    ``now`` (the database's time, as ``created_at`` was written)."""
    tests: list[sa.ColumnElement[bool]] = []
    statuses = SCOPES[unique.scope]
    if statuses is not None:
        tests.append(jobs.c.status.not_in(statuses))
    period = unique.period_seconds
    if period is not None:
        tests.append(jobs.c.created_at <= now - timedelta(seconds=period))
    return sa.or_(*tests) if tests else sa.false()


def free(conn: Connection, job_id: int, key: str, unique: Unique, now: datetime) -> bool:
    """Clear ``key`` from the job ``job_id`` if it still holds it and ``unique``'s scope
    no longer counts it; ``True`` if it did (an insert may then take the key).

    One guarded UPDATE: the scope is tested again under the row's lock, so a holder
    that a person replays meanwhile is judged as it is then. By id, not by key: InnoDB
    then locks the row alone, and racers waiting for it hold no lock on the key's
    entry of the unique index, which the insert that follows must write (waiting there,
    they deadlocked with it)."""
    done = conn.execute(
        sa.update(jobs)
        .where(jobs.c.id == job_id, jobs.c.unique_key == key, out_of_scope(unique, now))
        .values(unique_key=None, unique_key_freed=key)
    )
    return done.rowcount > 0


#: The statuses of a job that has finished: no scope but ``"any"`` counts it, and a key
#: held by one under ``"any"`` is never taken, so a replay may take a key back from it.
FINISHED = (JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value)


def take_back(conn: Connection, where: sa.ColumnElement[bool]) -> list[tuple[int, Any]]:
    """Before the dead or cancelled jobs matching ``where`` are replayed: give each one
    that lost its unique key to a later enqueue (``unique_key_freed``) the key back, from
    a holder that has finished since; one whose key a job not finished holds is returned
    with that holder's row, and nothing is written for it. The caller refuses the replay
    if any is returned (its transaction then undoes the keys given back)."""
    rows = conn.execute(
        sa.select(jobs.c.id, jobs.c.unique_key_freed)
        .where(where, jobs.c.unique_key_freed.is_not(None))
        .order_by(jobs.c.id)
    ).all()
    held: list[tuple[int, Any]] = []
    for job_id, key in rows:
        found = holder(conn, key, locking=True)
        if found is not None and found.status not in FINISHED:
            held.append((job_id, found))
            continue
        if found is not None:
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == found.id, jobs.c.unique_key == key)
                .values(unique_key=None, unique_key_freed=key)
            )
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == job_id, jobs.c.unique_key.is_(None))
            .values(unique_key=key, unique_key_freed=None)
        )
    return held


_HOLDER = sa.select(jobs).where(jobs.c.unique_key == sa.bindparam("key"))
_HOLDER_LOCKED = _HOLDER.with_for_update(read=True)


def holder(conn: Connection, key: str, *, locking: bool = False) -> Any:
    """The row of the job holding ``key``, or ``None``.

    Read plainly: under READ COMMITTED that sees every committed holder. With
    ``locking`` (an insert was just refused, so there is a holder), a plain read that
    finds none is made again as a shared locking read, which sees the newest committed
    version even in a caller's transaction whose snapshot is older than the holder
    (REPEATABLE READ, MariaDB's default)."""
    row = conn.execute(_HOLDER, {"key": key}).first()
    if row is None and locking:
        row = conn.execute(_HOLDER_LOCKED, {"key": key}).first()
    return row


def holds(row: Any, unique: Unique, now: datetime) -> bool:
    """Whether ``unique``'s scope counts the holder ``row`` at ``now``."""
    statuses = SCOPES[unique.scope]
    if statuses is not None and row.status not in statuses:
        return False
    period = unique.period_seconds
    return period is None or row.created_at > now - timedelta(seconds=period)


def replace(conn: Connection, job_id: int, key: str, values: JobRow) -> bool:
    """Give the job ``job_id``, still holding ``key`` and not started, the arguments
    and ``run_at`` of ``values`` (a new job's row); ``False`` if it has started, or
    lost the key, meanwhile (the UPDATE's guard, tested under the row's lock)."""
    done = conn.execute(
        sa.update(jobs)
        .where(jobs.c.id == job_id, jobs.c.unique_key == key, jobs.c.status.in_(NOT_STARTED))
        .values(
            payload=values["payload"],
            run_at=values["run_at"],
            concurrency_key=values["concurrency_key"],
            updated_at=values["updated_at"],
        )
    )
    return done.rowcount == 1

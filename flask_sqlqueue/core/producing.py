"""Writing new jobs: one insert path for one job and for many.

:func:`enqueue` writes the rows :func:`.enqueue.enqueue` has checked and encoded. One job
is a batch of one: the features decided at enqueue (dependencies, tags, uniqueness, big
payloads) each have one step here, whatever the number of jobs. Only the statements
differ: a plain job on its own goes on a kept connection (core/inserts.py), any other
single job in the one-row statements its database tells workers with, a batch in
multi-row INSERTs.

Every write is in a transaction of the queue's own, committed on return, or in the
caller's ``session=``; workers are woken and ``job_enqueued`` sent once it commits.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar
from typing import cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection

from ..exceptions import QueueUnavailable
from . import signals
from .features import bigpayloads
from .features import dependencies
from .features import tags
from .features import uniqueness
from .features.uniqueness import Unique
from .inserts import PLAIN
from .jobs import Job
from .models import JobRow
from .models import jobs
from .options import NO_MACHINERY
from .options import EnqueueOptions
from .options import Machinery
from .options import job_values
from .store import Store
from .store import caller_of
from .store import is_transient

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

T = TypeVar("T")

#: What a call is encoded into: ``(payload, idempotency key, concurrency key)``.
Encoded = tuple[str, str | None, str | None]

#: Rounds of insert-or-find for a unique key before giving up: each round inserts, or
#: finds the key held by a job that was in scope, unless that job left in between.
_UNIQUE_ROUNDS = 8

#: Times an enqueue in the queue's own transaction is tried when the database ends it
#: to break a deadlock.
_DEADLOCK_TRIES = 8

#: Idempotency keys looked up per statement: far below any database's bound parameters.
_KEYS_PER_READ = 1_000


def enqueue(
    store: Store,
    task: str,
    calls: Sequence[Encoded],
    options: EnqueueOptions,
    machinery: Machinery = NO_MACHINERY,
) -> list[Job]:
    """Write one job of ``task`` per call, in one transaction; the jobs in the order of
    ``calls``. Producers go through :func:`.enqueue.enqueue`, which checks them first.

    A call whose idempotency key a job holds already (or an earlier call of ``calls``)
    gives that job, and so does one whose ``options.unique`` key a job holds in scope.
    """
    values = job_values(
        task,
        "",
        options,
        default_max_attempts=store.settings.max_attempts,
        now=store.now(),
        machinery=machinery,
    )
    rows: list[JobRow] = [
        {**values, "payload": payload, "idempotency_key": key, "concurrency_key": limit}
        for payload, key, limit in calls
    ]
    depends_on = options.dependency_ids
    require = machinery.require
    if len(rows) == 1 and options.session is None and not depends_on:
        made = _enqueue_plain(store, rows[0])
        if made is not None:
            return [made]
    unique = options.unique if "unique_key" in values else None
    labels = cast("tuple[str, ...] | None", options.tags)
    created = values["created_at"]

    def insert(conn: Connection) -> list[Job]:
        notify = True
        if depends_on:
            # Every job of the call has the same dependencies, so the same start.
            start = dependencies.prepare(
                conn, depends_on, require=require, batch_id=machinery.batch_id
            ).values(created)
            for row in rows:
                row.update(start)
            notify = start["status"] == dependencies.PENDING
        made = _insert(store, conn, rows, notify=notify, unique=unique)
        # New jobs only, each once: not a job holding a key, nor a key repeated.
        new = list(dict.fromkeys(job.id for job in made if job.created_at is created))
        if depends_on:
            dependencies.link(conn, new, depends_on, require=require)
        if labels and new:
            tags.link(conn, new, labels)
        return made

    def announce(made: list[Job]) -> None:
        seen: set[int] = set()
        for job, row in zip(made, rows, strict=True):
            if job.id not in seen:  # a key repeated in the batch is one job
                seen.add(job.id)
                _announce(store, job, row)

    return _produce(store, options, insert, announce)


def _enqueue_plain(store: Store, values: JobRow) -> Job | None:
    """A plain job (:data:`.inserts.PLAIN`), in a transaction of its own on a kept
    connection: what the engine would write for it, and no more; ``None``, nothing
    written, for any other job, or while no kept connection is free."""
    if (
        values["idempotency_key"] is not None
        or values.keys() != PLAIN
        or bigpayloads.oversize(values["payload"], store.settings.inline_payload_limit)
    ):
        return None
    job_id = _own(store, lambda: store.insert_kept(values))
    if job_id is None:  # no kept connection free: the engine's pool waits
        return None
    job = Job.inserted(job_id, values, store)
    store.wake()
    _announce(store, job, values)
    return job


def _produce(
    store: Store,
    options: EnqueueOptions,
    insert: Callable[[Connection], T],
    announce: Callable[[T], None],
) -> T:
    """Run ``insert`` in the queue's own transaction, or in the caller's ``session``;
    wake the workers and announce the jobs once it has committed."""
    caller = caller_of(options.session)
    if caller is None:

        def run() -> T:
            with store.write() as conn:
                return insert(conn)

        made = _own(store, run)
        store.wake()
        announce(made)
        return made
    made = insert(store.caller_connection(caller))
    if not isinstance(caller, Connection):

        def committed(_session: Session) -> None:
            store.wake()
            announce(made)

        event.listen(caller, "after_commit", committed, once=True)
    else:
        store.wake()  # a hint only: a worker woken early just polls again later
        announce(made)
    return made


def _own(store: Store, run: Callable[[], T]) -> T:
    """Run ``run``, a transaction of the queue's own that enqueues: again when the
    database ended it to break a deadlock; a database that cannot be reached is
    :class:`QueueUnavailable`, with nothing enqueued."""
    tries = 0
    while True:
        try:
            return run()
        except sa.exc.DBAPIError as exc:
            tries += 1
            # A job with dependencies locks them, as finishing them does, and
            # producers racing to free or replace the holder of a unique key lock
            # it: the database may end one of two such transactions to break a
            # deadlock.
            if tries < _DEADLOCK_TRIES and store.ops.is_deadlock(exc):
                continue
            if not is_transient(exc):
                raise
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise QueueUnavailable(
                f"The queue's database is unavailable ({reason}); nothing was enqueued."
            ) from exc


def _announce(store: Store, job: Job, values: JobRow) -> None:
    # The job an idempotency key already had keeps its own creation time.
    if signals.job_enqueued.receivers and job.created_at == values["created_at"]:
        signals.send(signals.job_enqueued, store.signal_sender, job=job)


# -- the rows -----------------------------------------------------------------------------


def _insert(
    store: Store,
    conn: Connection,
    rows: list[JobRow],
    *,
    notify: bool,
    unique: Unique | None,
) -> list[Job]:
    """The jobs of ``rows``: one row in the one-row statements (with a unique key, its
    rounds), several in multi-row INSERTs."""
    if len(rows) != 1:
        return _insert_many(store, conn, rows, notify=notify)
    (row,) = rows
    if unique is not None:
        return [_insert_unique(store, conn, row, unique, notify=notify)]
    return [_insert_one(store, conn, row, notify=notify)]


def _insert_one(store: Store, conn: Connection, values: JobRow, *, notify: bool) -> Job:
    ops = store.ops
    key = values["idempotency_key"]
    row = bigpayloads.row_values(values, store.settings.inline_payload_limit)
    for _ in range(3):
        job_id = ops.enqueue_job(conn, row) if notify else ops.insert_job(conn, row)
        if job_id is not None:
            return _new_job(store, conn, job_id, values)
        existing = conn.execute(sa.select(jobs).where(jobs.c.idempotency_key == key)).first()
        if existing is not None:
            return _job(store, conn, existing)
        # The holder of the key was deleted between our insert and our read: try again.
    raise RuntimeError(f"Could not insert or find the job with idempotency key {key!r}.")


def _insert_unique(
    store: Store, conn: Connection, values: JobRow, unique: Unique, *, notify: bool
) -> Job:
    """Insert a job whose ``values`` carry a unique key (core/features/uniqueness.py): the new
    job, the job holding its idempotency key, or the job holding its unique key in
    ``unique``'s scope (given this call's arguments first with ``replace``).

    Each round reads the key's holder: in scope, it is the answer (or replaced);
    out of scope, its key is freed. Then the insert, which the unique index refuses
    if a racer took the key meanwhile; the next round finds that racer's job. A
    holder that leaves between a read and a write (it started, finished, or was
    deleted) costs a round; a few at most, as each needs a racer or a worker to
    move in that instant. Reading before inserting keeps a key in scope free of
    writes and locks: on InnoDB, racers each holding the shared lock a refused
    insert takes would deadlock as soon as one wrote the holder.
    """
    # Only a row with a unique key comes here (enqueue passes ``unique`` only then).
    key = cast("str", values["unique_key"])
    idempotency_key = values["idempotency_key"]
    now = values["created_at"]
    refused = False
    for _ in range(_UNIQUE_ROUNDS):
        if idempotency_key is not None:  # the contract's promise comes first
            held = conn.execute(
                sa.select(jobs).where(jobs.c.idempotency_key == idempotency_key)
            ).first()
            if held is not None:
                return _job(store, conn, held)
        row = uniqueness.holder(conn, key, locking=refused)
        if row is not None:
            if uniqueness.holds(row, unique, now):
                found = _conflict(store, conn, row, values, unique, notify=notify)
                if found is not None:
                    return found
                continue  # it started meanwhile: judge it again
            uniqueness.free(conn, row.id, key, unique, now)
        inserted = bigpayloads.row_values(values, store.settings.inline_payload_limit)
        job_id = store.ops.insert_unique(conn, inserted, notify=notify)
        if job_id is not None:
            return _new_job(store, conn, job_id, values)
        refused = True
    raise RuntimeError(f"Could not insert or find the job with unique key {key!r}.")


def _conflict(
    store: Store,
    conn: Connection,
    row: Any,
    values: JobRow,
    unique: Unique,
    *,
    notify: bool,
) -> Job | None:
    """The job for a call whose key ``row`` holds in scope: ``row`` itself, or with
    ``replace`` and ``row`` not started, ``row`` given the call's arguments and
    ``run_at``; ``None`` if it started before the write could change it."""
    if unique.on_conflict != "replace" or row.status not in uniqueness.NOT_STARTED:
        return _job(store, conn, row)
    limit = store.settings.inline_payload_limit
    if not uniqueness.replace(conn, row.id, row.unique_key, bigpayloads.row_values(values, limit)):
        return None
    # Its new payload in its row or outside it, whichever way the old one was kept.
    bigpayloads.rewrite(conn, row.id, values["payload"], limit)
    if notify:
        store.ops.notify(conn)  # it may be due sooner than it was
    fresh = conn.execute(sa.select(jobs).where(jobs.c.id == row.id)).one()
    return _job(store, conn, fresh)


def _insert_many(store: Store, conn: Connection, rows: list[JobRow], *, notify: bool) -> list[Job]:
    """Insert one job per row, in as few statements as the database allows
    (``DialectOps.insert_jobs``), ids in the order of ``rows``; a row whose key a job
    holds already, or an earlier row of ``rows``, gives that job."""
    ops = store.ops
    limit = store.settings.inline_payload_limit
    # Big payloads outside the rows: the multi-row INSERTs carry their markers.
    inserted = [bigpayloads.row_values(row, limit) for row in rows]
    made: list[Job | None] = [None] * len(rows)
    first: dict[str, int] = {}  # idempotency key -> index of its first call
    repeats: list[tuple[int, int]] = []  # (index, index of the first call with its key)
    todo: list[int] = []  # every call without a key, and the first call of each key
    for index, row in enumerate(rows):
        key = row["idempotency_key"]
        if key is not None:
            if key in first:
                repeats.append((index, first[key]))
                continue
            first[key] = index
        todo.append(index)
    for _ in range(3):
        held: list[int] = []  # calls whose key another job holds
        ids = ops.insert_jobs(conn, [inserted[i] for i in todo]) if todo else []
        fresh: list[tuple[int, str]] = []
        for index, job_id in zip(todo, ids, strict=True):
            if job_id is None:
                held.append(index)
            else:
                made[index] = Job.inserted(job_id, rows[index], store)
                fresh.append((job_id, rows[index]["payload"]))
        bigpayloads.keep(conn, fresh, limit)
        holders = _holders(conn, [rows[i]["idempotency_key"] for i in held])
        todo = []
        for index in held:
            holder = holders.get(rows[index]["idempotency_key"])
            if holder is None:  # deleted between our insert and our read: try again
                todo.append(index)
            else:
                made[index] = _job(store, conn, holder)
        if not todo:
            break
    else:
        keys = ", ".join(repr(rows[i]["idempotency_key"]) for i in todo)
        raise RuntimeError(f"Could not insert or find the jobs with idempotency keys {keys}.")
    for index, original in repeats:
        made[index] = made[original]
    if rows and notify:
        ops.notify(conn)
    return made  # type: ignore[return-value]


def _holders(conn: Connection, keys: list[str | None]) -> dict[str | None, Any]:
    """The rows of the jobs holding ``keys``, by key (a page of keys per statement).
    Typed as a row's idempotency key is: only rows with a key are ever held."""
    found: dict[str | None, Any] = {}
    for start in range(0, len(keys), _KEYS_PER_READ):
        page = keys[start : start + _KEYS_PER_READ]
        rows = conn.execute(sa.select(jobs).where(jobs.c.idempotency_key.in_(page)))
        found.update((row.idempotency_key, row) for row in rows)
    return found


def _new_job(store: Store, conn: Connection, job_id: int, values: JobRow) -> Job:
    """The Job for a row just inserted with ``values`` (saves reading it back), its
    payload kept outside the row if it is big (:func:`bigpayloads.row_values`)."""
    bigpayloads.keep(conn, [(job_id, values["payload"])], store.settings.inline_payload_limit)
    return Job.inserted(job_id, values, store)


def _job(store: Store, conn: Connection, row: Any) -> Job:
    """The Job of a row read whole, with its payload if kept outside the row."""
    return Job.from_row(bigpayloads.full_row(conn, row), store)

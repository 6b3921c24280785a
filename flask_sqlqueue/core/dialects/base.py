"""What every database must provide: engine set-up, locking and marking claimed jobs,
insert-once writes, and what ``flask queue doctor`` checks of the database itself.

Everything here works on a :class:`~sqlalchemy.engine.Connection` inside a transaction
the caller opened, so one dialect object serves the queue's own engine and a caller's
session alike. Statements that are the same on every database live here too; a
subclass overrides only what its database does differently. Which jobs a claim takes
is decided above, in ``core/claim.py``: this package imports only the models and
standard-library leaves.
"""

from __future__ import annotations

import functools
import select
import threading
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine
from sqlalchemy.engine import Row

from ...config import Settings
from ...exceptions import SQLQueueError
from .. import wakeup
from ..diagnosis import FAIL
from ..diagnosis import OK
from ..diagnosis import Finding
from ..models import JobRow
from ..models import JobStatus
from ..models import effects
from ..models import jobs
from ..models import limits as limits_table

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
COMPLETED = JobStatus.COMPLETED.value

#: What a batch of successes gives :meth:`DialectOps.complete_claimed`: ``(job id, claim
#: token, result)`` for each job, every id once.
Done = tuple[int, str, "str | None"]

#: The columns a worker needs to run a job it has just claimed.
CLAIM_COLUMNS = (
    jobs.c.id,
    jobs.c.queue,
    jobs.c.task,
    jobs.c.payload,
    jobs.c.attempts,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.idempotency_key,
    jobs.c.claim_token,
    # For the worker to end an expired job instead of running it (docs/expiry.md).
    jobs.c.expires_at,
    jobs.c.snoozes,
    # run_at as the driver gives it, for the claim order only: not decoded on the hot
    # path (SQLite's ISO text sorts as the times it spells; the servers give datetimes).
    sa.type_coerce(jobs.c.run_at, sa.types.NullType()).label("run_at_key"),
)


def claim_values(worker_id: str | Any, token: str | Any, now: datetime | Any) -> dict[str, Any]:
    return {
        "status": RUNNING,
        "attempts": jobs.c.attempts + 1,
        "worker_id": worker_id,
        "claim_token": token,
        "started_at": now,
        "updated_at": now,
    }


def claim_order(row: Row[Any]) -> tuple[int, Any, int]:
    """Order within one claimed batch, the contract's: priority, then ``run_at``, then
    id. The jobs of a batch taken ahead of the free threads start one after another."""
    return (-row.priority, row.run_at_key, row.id)


def claim_update(chosen: sa.ColumnElement[bool]) -> sa.Update:
    """``UPDATE … SET <running> WHERE chosen RETURNING <claim columns>``, with
    ``worker_id``, ``token`` and ``now`` bound per execution: the one-statement claim
    of the databases that have UPDATE … RETURNING."""
    values = claim_values(
        sa.bindparam("worker_id", type_=jobs.c.worker_id.type),
        sa.bindparam("token", type_=jobs.c.claim_token.type),
        sa.bindparam("now", type_=jobs.c.run_at.type),
    )
    return sa.update(jobs).where(chosen).values(values).returning(*CLAIM_COLUMNS)


#: The completion of one running attempt, fenced by its claim token, bound per call.
#: Every statement of the hot path is built once: building one cost more than running it.
COMPLETE_ONE = (
    sa.update(jobs)
    .where(
        jobs.c.id == sa.bindparam("b_id"),
        jobs.c.status == RUNNING,
        jobs.c.claim_token == sa.bindparam("b_token"),
    )
    .values(
        status=COMPLETED,
        result=sa.bindparam("b_result", type_=jobs.c.result.type),
        finished_at=sa.bindparam("b_now", type_=jobs.c.finished_at.type),
        updated_at=sa.bindparam("b_now", type_=jobs.c.updated_at.type),
        claim_token=None,
    )
)


def complete_one_params(done: Done, now: datetime) -> dict[str, Any]:
    job_id, token, result = done
    return {"b_id": job_id, "b_token": token, "b_result": result, "b_now": now}


#: Most jobs one listed completion carries: a batch of a worker that claims ahead may
#: hold hundreds, completed in statements of this many.
LISTED_MOST = 128
#: The id of a padding entry: never a job's.
_NO_JOB = -1


@functools.lru_cache(maxsize=64)
def complete_listed(size: int, valued: bool, alone: bool = False) -> sa.Update:
    """``UPDATE … SET <completed> WHERE id IN (:b_id0, …) AND status = 'running' AND
    claim_token = CASE id WHEN :b_id0 THEN :b_token0 … END``: the completion of ``size``
    jobs, each fenced by its own token, in one statement on any database, its result
    bound per job with ``valued`` (else ``NULL`` for all); with ``alone``, only of jobs
    without dependents (``AND NOT has_dependents``). Built once per size, and sizes are
    powers of two (:func:`listed`): a statement per batch size cost a worker that claims
    ahead about 12 MiB of compiled statements."""
    ids = [sa.bindparam(f"b_id{n}", type_=jobs.c.id.type) for n in range(size)]

    def per_job(name: str, column: sa.Column[Any]) -> sa.Case[Any]:
        return sa.case(
            *(
                (jobs.c.id == ids[n], sa.bindparam(f"{name}{n}", type_=column.type))
                for n in range(size)
            )
        )

    now = sa.bindparam("b_now", type_=jobs.c.finished_at.type)
    return (
        sa.update(jobs)
        .where(
            jobs.c.id.in_(ids),
            jobs.c.status == RUNNING,
            jobs.c.claim_token == per_job("b_token", jobs.c.claim_token),
            *([sa.not_(jobs.c.has_dependents)] if alone else []),
        )
        .values(
            status=COMPLETED,
            result=per_job("b_result", jobs.c.result) if valued else None,
            finished_at=now,
            updated_at=now,
            claim_token=None,
        )
    )


def listed(
    done: Sequence[Done], now: datetime, *, alone: bool = False
) -> Iterator[tuple[sa.Update, dict[str, Any]]]:
    """The statements of :func:`complete_listed` that complete ``done`` (with ``alone``,
    those of its jobs that have no dependents), with their parameters:
    :data:`LISTED_MOST` jobs at most each, padded to a power of two with entries that
    match no job."""
    for start in range(0, len(done), LISTED_MOST):
        part = done[start : start + LISTED_MOST]
        size = 1 << (len(part) - 1).bit_length()
        params: dict[str, Any] = {"b_now": now}
        valued = False
        for n in range(size):
            job_id, token, result = part[n] if n < len(part) else (_NO_JOB, "", None)
            params[f"b_id{n}"] = job_id
            params[f"b_token{n}"] = token
            params[f"b_result{n}"] = result
            valued = valued or result is not None
        yield complete_listed(size, valued, alone), params


@functools.cache
def _insert_once_statement(insert: Callable[..., Any], unique: sa.Column[Any]) -> Any:
    # Built once: constructing the statement per call cost more than executing it.
    table = unique.table
    return insert(table).on_conflict_do_nothing(index_elements=[unique]).returning(table.c.id)


_INSERT_JOB = sa.insert(jobs)


@functools.cache
def _insert_any_once(insert: Callable[..., Any]) -> Any:
    # Built once per dialect, as _insert_once_statement's are.
    return insert(jobs).on_conflict_do_nothing().returning(jobs.c.id)


@functools.lru_cache(maxsize=32)
def _returning_id(stmt: sa.Update) -> sa.Update:
    return stmt.returning(jobs.c.id, jobs.c.has_dependents)


def insert_once(
    insert: Callable[..., Any], conn: Connection, unique: sa.Column[Any], values: Mapping[str, Any]
) -> int | None:
    """``INSERT … ON CONFLICT DO NOTHING RETURNING id``: the new id, or ``None`` on a duplicate.

    RETURNING rather than rowcount, which some drivers report as -1 here.
    """
    row = conn.execute(_insert_once_statement(insert, unique), values).first()
    return None if row is None else int(row[0])


class DialectOps:
    """The database-specific half of the queue. Subclasses set ``name`` and ``insert``.

    The defaults mark claimed jobs with ``UPDATE … RETURNING`` and insert once with
    ``ON CONFLICT DO NOTHING``, which SQLite and PostgreSQL share. Which jobs a claim
    takes is decided above the dialects, in ``core/claim.py``.
    """

    name: ClassVar[str]
    #: The dialect's INSERT construct, which must offer ``on_conflict_do_nothing``.
    insert: ClassVar[Callable[..., Any]]
    #: Lock the candidate rows, skipping those another claimer holds.
    skip_locked: ClassVar[bool] = False
    #: One writer at a time for the whole database: a store queues its own process's
    #: writers for that lock (``Store.write``) rather than leave them to the database's
    #: busy handler, which sleeps between tries.
    single_writer: ClassVar[bool] = False

    # -- the engine ---------------------------------------------------------------------

    def engine_options(self, url: sa.URL, options: Mapping[str, Any]) -> dict[str, Any]:
        """``create_engine`` keyword arguments for ``url``: the app's ``options``, with
        this database's defaults for what they leave out. Default: ``options`` as given."""
        return dict(options)

    def in_folder(self, url: sa.URL, folder: str) -> sa.URL:
        """``url`` with a relative file path read from ``folder`` (the app's instance
        folder), as Flask-SQLAlchemy reads it. Default: ``url`` (a server's)."""
        return url

    def in_memory(self, url: sa.URL) -> bool:
        """Whether ``url`` is a database that lives in one connection of this process
        (SQLite's ``sqlite://``), which no other connection sees, nor any other process.
        The queue opens no such engine of its own; it shares an app's, as it is
        (``Store.in_memory``). Default: ``False`` (a file or a server)."""
        return False

    def configure_engine(self, engine: Engine, settings: Settings) -> None:
        """Install whatever connection set-up the database needs. Default: nothing."""

    @classmethod
    def identity(cls, url: sa.URL) -> str:
        """A key that is equal for two URLs naming the same database. Default: the
        server's address and the database's name."""
        return f"{url.get_backend_name()}://{url.host or ''}:{url.port or ''}/{url.database or ''}"

    def database_file(self, url: sa.URL) -> str | None:
        """The file on this host that the database is, if it is one: the store refuses
        to write once it has been deleted or replaced. Default: ``None`` (a server)."""
        return None

    def wake_dir(self, url: sa.URL) -> Path | None:
        """Where enqueues wake idle workers on this host (``core/wakeup.py``), for a
        database that cannot notify them itself. Default: ``None`` (no such wake-ups)."""
        return None

    def busy_error(self, reason: str) -> Exception:
        """The error of a write that found the write lock taken for too long, for a
        :attr:`single_writer` database: the one the database itself raises, so that
        callers treat both alike. Default: a generic ``OperationalError``."""
        return sa.exc.OperationalError("BEGIN", None, RuntimeError(reason))

    def diagnose(self, conn: Connection) -> list[Finding]:
        """What ``flask queue doctor`` says about this database itself: its version and
        settings. Default: nothing."""
        return []

    #: A query for the database's own current UTC time; ``None`` where the database
    #: runs on the worker's host and clock (SQLite).
    clock_query: ClassVar[str | None] = None

    def prepare_writer(self, conn: Connection) -> None:
        """Set up a connection a :class:`~flask_sqlqueue.core.store.Writer` keeps for
        itself (never returned to the pool). Default: nothing."""

    def check_server(self, conn: Connection) -> None:
        """Refuse a server that cannot claim safely. Default: nothing to check."""

    #: Bytes one text value may take before the server's own limit is read.
    default_value_limit: ClassVar[int] = 1_000_000_000
    #: Where :meth:`value_limit` comes from, as error messages name it.
    value_limit_source: ClassVar[str] = "this database"

    def value_limit(self, conn: Connection) -> int:
        """The most bytes (as :meth:`value_size` counts them) that one text value (a
        payload, a result, an error history) may take in a statement here. Default:
        :attr:`default_value_limit`."""
        return self.default_value_limit

    def value_size(self, text: str) -> int:
        """Bytes ``text`` takes in a statement, measured against :meth:`value_limit`:
        its UTF-8 length by default."""
        return len(text.encode("utf-8", "surrogatepass"))

    def notify(self, conn: Connection) -> None:
        """Tell listening workers, on commit, that a job may be eligible. Default: no-op."""

    def listen(self, engine: Engine, wake: threading.Event, stop: threading.Event) -> None:
        """Set ``wake`` whenever another process enqueues, until ``stop`` is set.

        Runs on a thread of its own. Default: the same-host sockets of :meth:`wake_dir`
        (``core/wakeup.py``); without them, return at once: polling finds new jobs.
        """
        wakeup.listen(self.wake_dir(engine.url), wake, stop)

    def notify_finished(self, conn: Connection, ids: Sequence[int]) -> None:
        """Tell the processes waiting for jobs (``Job.wait``), on commit, that the jobs
        ``ids`` finished, where the database carries such news to other hosts. Default:
        nothing here; after the commit, ``Store.finished`` tells this host's waiters."""

    def listen_finished(
        self, engine: Engine, finished: wakeup.Finished, stop: threading.Event
    ) -> None:
        """Pass the ids of the jobs that finish to ``finished`` until ``stop`` is set
        (``None`` once listening: anything may have finished before). Runs on a thread of
        its own. Default: the same-host sockets of :meth:`wake_dir`; without them, return
        at once: waiters recheck the database."""
        wakeup.listen_finished(wakeup.waiters_dir(self.wake_dir(engine.url)), finished, stop)

    def is_deadlock(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database ending a transaction to break a deadlock.
        Default: never (SQLite has one writer at a time)."""
        return False

    def refuses_value(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the database refusing a statement for its size, which looks
        like a passing fault (an ``OperationalError``) but fails the same way every time.
        Default: never."""
        return False

    def read_options(self) -> dict[str, Any]:
        """Execution options that mark a transaction as read-only for :meth:`configure_engine`."""
        return {}

    def plan_per_execution(self, conn: Connection) -> None:
        """Have the rest of this transaction's statements planned with their actual
        parameters, for reads whose best plan depends on them (a time range, a status).
        Default: nothing to do."""

    def add_seconds(
        self, moment: sa.ColumnElement[datetime], seconds: sa.ColumnElement[int]
    ) -> sa.ColumnElement[datetime]:
        """``moment`` plus a whole number of ``seconds``, computed by the database and
        comparable with the queue's timestamp columns (so an index range can use it)."""
        raise NotImplementedError(f"{type(self).__name__} has no time arithmetic")

    def seconds_between(
        self, start: sa.ColumnElement[datetime], end: sa.ColumnElement[datetime]
    ) -> sa.ColumnElement[float]:
        """``end - start`` in seconds as a number, computed by the database (reading
        two timestamps per row into Python costs more than the query)."""
        raise NotImplementedError(f"{type(self).__name__} has no time arithmetic")

    def take(
        self,
        conn: Connection,
        candidates: sa.Select[tuple[int]],
        *,
        now: datetime,
        limit: int,
        worker_id: str,
        token: str,
    ) -> list[Any]:
        """Lock the jobs ``candidates`` selects (``now`` and ``limit`` are its bound
        parameters), skipping any another claim holds; mark them running for this
        claim; return them in claim order (the plain claim of ``core/claim.py``).

        Default: the one statement of :meth:`claim_statement`, after :meth:`before_claim`.
        """
        self.before_claim(conn)
        params = {"now": now, "limit": limit, "worker_id": worker_id, "token": token}
        # RETURNING order is unspecified; restore the claim order.
        return sorted(conn.execute(self.claim_statement(candidates), params).all(), key=claim_order)

    def before_claim(self, conn: Connection) -> None:
        """Set up the transaction for the one statement of :meth:`take`. Default: nothing."""

    def claim_statement(self, candidates: sa.Select[tuple[int]]) -> sa.Update:
        """The claim as one ``UPDATE … RETURNING`` (see :func:`claim_update`) of the jobs
        ``candidates`` selects; cache it per ``candidates``, which the claim builds once
        per worker's queues and tasks. A database without UPDATE … RETURNING overrides
        :meth:`take` instead."""
        raise NotImplementedError(f"{type(self).__name__} claims in more than one statement")

    def lock_candidates(self, candidates: sa.Select[Any]) -> sa.Select[Any]:
        """``candidates``, locking the rows it reads until the transaction ends and
        skipping those another claim holds, where the database can (``skip_locked``);
        SQLite renders no lock: ``BEGIN IMMEDIATE`` already made us its only writer."""
        return candidates.with_for_update(skip_locked=self.skip_locked)

    def lock_buckets(self, conn: Connection, names: Sequence[str]) -> dict[str, Any]:
        """Create the rows of ``names`` in ``sqlqueue_limits`` if missing and lock them,
        in the order given, until the transaction ends; return them by name.

        Default: ``INSERT … ON CONFLICT DO NOTHING``, then ``SELECT … FOR UPDATE``
        (which SQLite leaves out: ``BEGIN IMMEDIATE`` already made us its only writer).
        """
        if not names:
            return {}
        conn.execute(
            type(self)
            .insert(limits_table)
            .values([{"name": name, "starts": 0} for name in names])
            .on_conflict_do_nothing(index_elements=[limits_table.c.name])
        )
        rows = conn.execute(
            sa.select(limits_table)
            .where(limits_table.c.name.in_(names))
            .order_by(limits_table.c.name)
            .with_for_update()
        )
        return {row.name: row for row in rows}

    def mark_claimed(
        self, conn: Connection, ids: Sequence[int], *, worker_id: str, token: str, now: datetime
    ) -> list[Any]:
        """Mark those of the jobs ``ids`` that are still pending running; return them in
        claim order. The caller holds their locks, or takes one job by id (eager mode)."""
        stmt = (
            sa.update(jobs)
            .where(jobs.c.id.in_(ids), jobs.c.status == PENDING)
            .values(claim_values(worker_id, token, now))
            .returning(*CLAIM_COLUMNS)
        )
        return sorted(conn.execute(stmt).all(), key=claim_order)

    def complete_claimed(
        self, conn: Connection, done: Sequence[Done], now: datetime
    ) -> dict[int, bool]:
        """Complete the running attempts of ``done``, each fenced by its own claim token
        exactly as a single completion is, in one statement; return the ids completed,
        each with whether the job has dependents (its ``has_dependents`` as the write
        found it, under the row's lock: core/features/dependencies.py). A job whose claim was
        lost gets nothing written. Rows are locked in id order (every id of ``done`` is
        distinct, and sorted by the caller). Where the database carries news to waiters
        (:meth:`notify_finished`), the statement tells them too.

        Default: :func:`complete_listed` with ``RETURNING id, has_dependents`` (SQLite).
        """
        completed: dict[int, bool] = {}
        for stmt, params in listed(done, now):
            rows = conn.execute(_returning_id(stmt), params)
            completed.update((job_id, bool(flag)) for job_id, flag in rows)
        return completed

    def insert_jobs(self, conn: Connection, rows: list[JobRow]) -> list[int | None]:
        """Insert jobs in one transaction, in the order of ``rows``; their ids in that
        order, ``None`` for a row whose idempotency key another job holds already (the
        keys of ``rows`` are distinct; a caller looks the holders up).

        Default: each run of rows without a key in multi-row INSERTs
        (:meth:`insert_plain`), each row with a key inserted once (:meth:`insert_job`),
        so that ids keep the order of ``rows``.
        """
        ids: list[int | None] = []
        run: list[JobRow] = []
        for row in rows:
            if row.get("idempotency_key") is None:
                run.append(row)
                continue
            if run:
                ids += self.insert_plain(conn, run)
                run = []
            ids.append(self.insert_job(conn, row))
        if run:
            ids += self.insert_plain(conn, run)
        return ids

    def insert_plain(self, conn: Connection, rows: list[JobRow]) -> list[int]:
        """Insert jobs without idempotency keys, in one transaction; their ids, in the
        order of ``rows``."""
        if conn.dialect.insert_executemany_returning_sort_by_parameter_order:
            # One multi-row INSERT ... RETURNING per page of rows (SQLAlchemy's
            # "insertmanyvalues"), ids matched to rows whatever order the database uses.
            result = conn.execute(
                sa.insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), rows
            )
            return [int(job_id) for job_id in result.scalars()]
        # No RETURNING for many rows (MySQL; MariaDB has it from 10.5): still one
        # transaction, a row at a time.
        return [
            int(conn.execute(sa.insert(jobs), row).inserted_primary_key[0])  # type: ignore[index]
            for row in rows
        ]

    def insert_job(self, conn: Connection, values: JobRow) -> int | None:
        """Insert a job; return its id, or ``None`` if its idempotency key already exists."""
        if values["idempotency_key"] is None:
            # Nothing to collide with: a plain INSERT. SQLite then gives the id without
            # RETURNING, which made its one-row transaction cost about a third more CPU.
            return int(conn.execute(_INSERT_JOB, values).inserted_primary_key[0])  # type: ignore[index]
        return insert_once(type(self).insert, conn, jobs.c.idempotency_key, values)

    def insert_unique(self, conn: Connection, values: JobRow, *, notify: bool = True) -> int | None:
        """Insert a job with a unique key (core/features/uniqueness.py); return its id, or
        ``None`` if its unique key or its idempotency key is held (the caller looks the
        holder up). With ``notify``, tell listening workers on commit if it inserted.

        Default: ``INSERT … ON CONFLICT DO NOTHING RETURNING id``, with no conflict
        target, so that either key's index refuses the row without an error.
        """
        row = conn.execute(_insert_any_once(type(self).insert), values).first()
        if row is None:
            return None
        if notify:
            self.notify(conn)
        return int(row[0])

    def enqueue_job(self, conn: Connection, values: JobRow) -> int | None:
        """:meth:`insert_job`, and tell listening workers on commit if it inserted.
        Default: the insert, then :meth:`notify`."""
        job_id = self.insert_job(conn, values)
        if job_id is not None:
            self.notify(conn)
        return job_id

    def insert_effect(self, conn: Connection, key: str, job_id: int, now: datetime) -> bool:
        """Insert an effect key; ``False`` if it was reserved before."""
        values = {"key": key, "job_id": job_id, "created_at": now}
        return insert_once(type(self).insert, conn, effects.c.key, values) is not None

    # -- one-job enqueues on kept connections (core/inserts.py) -------------------------

    #: The drivers whose connections :class:`~flask_sqlqueue.core.inserts.KeptInserts`
    #: may keep and drive directly; with any other, every enqueue goes through the engine.
    kept_drivers: ClassVar[frozenset[str]] = frozenset()

    def enqueue_statement(self) -> sa.Insert:
        """The INSERT of one plain job that also tells listening workers: what
        :meth:`enqueue_job` runs for a job without a key. Default: a plain INSERT."""
        return sa.insert(jobs)

    def keep_connection(self, dbapi_connection: Any) -> None:
        """Set up a driver connection kept for enqueues. Default: nothing."""

    def kept_alive(self, dbapi_connection: Any) -> bool:
        """Whether a kept connection can still be used (checked before each use, without
        a round trip). Default: ``True`` (a file on this host)."""
        return True

    def run_enqueue(self, dbapi_connection: Any, sql: str, params: Any) -> int:
        """Run :meth:`enqueue_statement`, compiled as ``sql``, with ``params`` in a
        transaction of its own on a kept connection; return the new job's id."""
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(sql, params)
            return int(cursor.lastrowid)
        finally:
            cursor.close()


class ServerOps(DialectOps):
    """A database server (PostgreSQL, MariaDB, MySQL), as opposed to a file on this host."""

    def kept_alive(self, dbapi_connection: Any) -> bool:
        # An idle connection's socket has nothing to read unless the server closed it
        # (or said why it was about to): readable, or gone, means do not use it.
        if getattr(dbapi_connection, "closed", False):
            return False
        sock = getattr(dbapi_connection, "_sock", None)  # PyMySQL
        try:
            fd = sock.fileno() if sock is not None else dbapi_connection.fileno()
        except Exception:  # closed under us, or no socket to look at
            return False
        if fd < 0:
            return False
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)

    def engine_options(self, url: sa.URL, options: Mapping[str, Any]) -> dict[str, Any]:
        found = dict(options)
        found.setdefault("pool_pre_ping", True)
        # The claim's SKIP LOCKED reasoning assumes READ COMMITTED (MariaDB's default is
        # REPEATABLE READ, whose snapshot would hide rows committed meanwhile).
        found.setdefault("isolation_level", "READ COMMITTED")
        return found

    def diagnose(self, conn: Connection) -> list[Finding]:
        """The server's version, or why the queue refuses it (:meth:`check_server`)."""
        version = ".".join(map(str, conn.dialect.server_version_info or ()))
        try:
            self.check_server(conn)
        except SQLQueueError as exc:
            return [Finding(FAIL, str(exc), "upgrade the database server")]
        # dialect.name: the database as the user knows it, not a test of which one it is.
        return [Finding(OK, f"{conn.dialect.name} {version} with SKIP LOCKED")]

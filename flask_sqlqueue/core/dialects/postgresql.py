"""PostgreSQL: row locks with ``FOR UPDATE SKIP LOCKED``, and LISTEN/NOTIFY wake-ups.

The claim's inner SELECT locks the candidate rows and skips rows another worker has
locked, so concurrent claimers take disjoint sets without waiting; a row changed between
the snapshot and the lock is re-checked against the WHERE on its newest version (READ
COMMITTED's rule for locking reads), so only rows still pending are taken.

Every enqueue notifies ``sqlqueue_jobs`` in its own transaction (``pg_notify`` in the
INSERT's RETURNING, no round trip of its own), so it is delivered only if the job
commits. Workers LISTEN for it as a hint to claim at once; polling stays
the truth, so a notification lost while reconnecting costs at most one poll interval.

Every write that finishes jobs notifies ``sqlqueue_finished`` with their ids (at most
:data:`~flask_sqlqueue.core.wakeup.IDS_PER_MESSAGE` per notification), on any host: a
worker's completions in the completing statement itself (``pg_notify`` over its
``RETURNING``, one notification per batch), a failure, a cancellation or a rescue in
one more statement. A process waiting for jobs (``Job.wait``) LISTENs for it while it
waits, and rechecks the database on each notification that names one of its jobs.
"""

from __future__ import annotations

import functools
import json
import logging
import select
import threading
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import date
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import JSON
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from ...exceptions import UnsupportedDatabase
from .. import wakeup
from ..diagnosis import OK
from ..diagnosis import WARN
from ..diagnosis import Finding
from ..models import JobRow
from ..models import jobs
from .base import COMPLETED
from .base import RUNNING
from .base import Done
from .base import ServerOps
from .base import claim_update

CHANNEL = "sqlqueue_jobs"
#: Where writes that finish jobs tell waiters which (``Job.wait``).
FINISHED_CHANNEL = "sqlqueue_finished"
log = logging.getLogger("flask_sqlqueue.worker")
MIN_VERSION = (9, 5)  # FOR UPDATE SKIP LOCKED
# For the rest of the claim's transaction only (is_local), in one round trip. No JIT:
# a plan's cost with a path switched off can pass jit_above_cost, and compiling took
# 160 ms for a claim that runs in 0.3.
_CLAIM_PLANNER = (
    "SELECT set_config('enable_bitmapscan', 'off', {local}), "
    "set_config('enable_sort', 'off', {local}), set_config('jit', 'off', {local})"
)
_PLANNED = "sqlqueue_claim_planner"  # in Connection.info: set for the whole session
# An enqueue's NOTIFY rides on its INSERT: RETURNING evaluates it once per row inserted,
# so a key already held notifies no one, and the enqueue costs no extra round trip.
_NOTIFYING = sa.func.pg_notify(CHANNEL, "")
_ENQUEUE = pg_insert(jobs).returning(jobs.c.id, _NOTIFYING)
_ENQUEUE_ONCE = (
    pg_insert(jobs)
    .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
    .returning(jobs.c.id, _NOTIFYING)
)
# A job with a unique key: no conflict target, so that its unique key's index or its
# idempotency key's refuses the row without an error (core/features/uniqueness.py).
_INSERT_UNIQUE = pg_insert(jobs).on_conflict_do_nothing().returning(jobs.c.id)
_ENQUEUE_UNIQUE = _INSERT_UNIQUE.returning(_NOTIFYING)


class PostgresOps(ServerOps):
    name = "postgresql"
    insert = staticmethod(pg_insert)
    skip_locked = True
    clock_query = "SELECT CURRENT_TIMESTAMP"
    # A text value stops at 1 GB (a varlena's 30-bit length).
    default_value_limit = 2**30 - 1
    value_limit_source = "PostgreSQL"

    def check_server(self, conn: Connection) -> None:
        version = conn.dialect.server_version_info or (0,)
        if tuple(version[:2]) < MIN_VERSION:
            raise UnsupportedDatabase(
                f"PostgreSQL {'.'.join(map(str, version))} (SKIP LOCKED needs 9.5 or newer)",
                supported=["postgresql>=9.5", "mariadb>=10.6", "mysql>=8.0", "sqlite>=3.35"],
            )

    def before_claim(self, conn: Connection) -> None:
        # A queue table's statistics lag behind it (a burst of enqueues, then a drain).
        # Planned from them, a claim could read and sort every pending job, each time;
        # walking the claim index in order suits a claim of a few rows at any size.
        if not conn.info.get(_PLANNED):
            conn.exec_driver_sql(_CLAIM_PLANNER.format(local="true"))

    def claim_statement(self, candidates: sa.Select[tuple[int]]) -> sa.Update:
        return _claim_any(candidates)

    def complete_claimed(
        self, conn: Connection, done: Sequence[Done], now: datetime
    ) -> dict[int, bool]:
        # The statement tells waiters which jobs it completed (see the module's
        # docstring): no round trip of its own.
        # Three arrays, whatever the batch's size: one statement, built once (below).
        params = {
            "b_ids": [job_id for job_id, _, _ in done],
            "b_tokens": [token for _, token, _ in done],
            "b_results": [result for _, _, result in done],
            "b_now": now,
        }
        # has_dependents as the UPDATE writes the row: the newest version, under its
        # lock (a row changed since the statement began is re-read before it is written).
        return {job_id: flag for job_id, flag in conn.execute(_COMPLETE_ARRAYS, params)}

    def insert_jobs(self, conn: Connection, rows: list[JobRow]) -> list[int | None]:
        """``INSERT … SELECT … FROM json_array_elements(:rows) WITH ORDINALITY AS v(r, n)
        ORDER BY n ON CONFLICT (idempotency_key) DO NOTHING RETURNING id,
        idempotency_key``: a statement per :data:`ROWS_PER_INSERT` rows.

        A multi-row VALUES has a parameter per value (280,000 for 20,000 jobs), which
        psycopg parses out of the statement's text, page by page: most of the time the
        insert took. Here the values that differ between rows travel as one JSON text,
        which Python's C encoder writes at once (psycopg's text arrays escape every
        element with a regular expression), each cast back to its column's type; a value
        every row shares (the very same object: the options of a batch) is bound once.

        The sequence gives ids in the order the SELECT sorts its rows, so the ids
        returned, sorted, are those of the rows inserted in the order of ``rows``; a row
        with a key is matched by its key, and one whose key is held gets ``None``.
        """
        ids: list[int | None] = []
        for chunk in _chunks(rows):
            if len(chunk) == 1:  # a row alone, its payload perhaps too large to wrap
                ids += super().insert_jobs(conn, chunk)
                continue
            # Read by column name, which a JobRow's type allows only for literal keys.
            table: Sequence[Mapping[str, Any]] = chunk
            first = table[0]
            names = tuple(first)
            shared = tuple(name for name in names if all(row[name] is first[name] for row in table))
            varying = tuple(name for name in names if name not in shared) or names[:1]
            shared = tuple(name for name in shared if name not in varying)
            params = {f"c_{name}": first[name] for name in shared}
            params["j_rows"] = _json_rows(conn, table, varying)
            returned = sorted(conn.execute(_insert_rows(varying, shared), params).all())
            keyed = {key: job_id for job_id, key in returned if key is not None}
            plain = iter([job_id for job_id, key in returned if key is None])
            for row in chunk:
                key = row.get("idempotency_key")
                ids.append(next(plain) if key is None else keyed.get(key))
        return ids

    def prepare_writer(self, conn: Connection) -> None:
        # The worker's own connection, out of the pool: set once for its whole session.
        conn.exec_driver_sql(_CLAIM_PLANNER.format(local="false"))
        conn.info[_PLANNED] = True

    def is_deadlock(self, exc: BaseException) -> bool:
        return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40P01"

    def refuses_value(self, exc: BaseException) -> bool:
        # Class 54, program_limit_exceeded: a value or statement over a hard limit.
        return str(getattr(getattr(exc, "orig", None), "sqlstate", "")).startswith("54")

    def plan_per_execution(self, conn: Connection) -> None:
        # psycopg prepares a statement on its fifth run, and the server then switches to
        # a generic plan, one for any parameters: blind to a time range, it guesses a
        # third of the table and scans all of it (the dashboard's last-day failures took
        # 30 ms, then 400). plan_cache_mode exists from PostgreSQL 12.
        if tuple(conn.dialect.server_version_info or (0,)) >= (12,):
            conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")

    def add_seconds(
        self, moment: sa.ColumnElement[datetime], seconds: sa.ColumnElement[int]
    ) -> sa.ColumnElement[datetime]:
        return moment + seconds * sa.literal_column("interval '1 second'", sa.Interval)

    def seconds_between(
        self, start: sa.ColumnElement[datetime], end: sa.ColumnElement[datetime]
    ) -> sa.ColumnElement[float]:
        return sa.cast(sa.extract("epoch", end - start), sa.Float)

    def enqueue_job(self, conn: Connection, values: JobRow) -> int | None:
        stmt = _ENQUEUE if values["idempotency_key"] is None else _ENQUEUE_ONCE
        row = conn.execute(stmt, values).first()
        return None if row is None else int(row[0])

    def insert_unique(self, conn: Connection, values: JobRow, *, notify: bool = True) -> int | None:
        # The NOTIFY rides on the INSERT's RETURNING, as a plain enqueue's does.
        row = conn.execute(_ENQUEUE_UNIQUE if notify else _INSERT_UNIQUE, values).first()
        return None if row is None else int(row[0])

    def notify(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"NOTIFY {CHANNEL}")

    kept_drivers = frozenset({"psycopg", "psycopg2"})

    def enqueue_statement(self) -> sa.Insert:
        return _ENQUEUE

    def keep_connection(self, dbapi_connection: Any) -> None:
        # One statement, committed by itself: one round trip per enqueue.
        dbapi_connection.autocommit = True

    def run_enqueue(self, dbapi_connection: Any, sql: str, params: Any) -> int:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(sql, params)
            return int(cursor.fetchone()[0])
        finally:
            cursor.close()

    def diagnose(self, conn: Connection) -> list[Finding]:
        driver = conn.dialect.driver
        if listens(driver):
            wakes = Finding(OK, f"wake-ups: LISTEN/NOTIFY (driver {driver})")
        else:
            wakes = Finding(
                WARN,
                f"the driver {driver} gets no notifications: idle workers find new jobs "
                "only at each poll (--poll-interval)",
                "use postgresql+psycopg:// (psycopg 3) or postgresql+psycopg2://",
            )
        return [*super().diagnose(conn), wakes]

    def listen(self, engine: Engine, wake: threading.Event, stop: threading.Event) -> None:
        _listen(engine, CHANNEL, lambda _payload: wake.set(), stop)

    def notify_finished(self, conn: Connection, ids: Sequence[int]) -> None:
        for payload in wakeup.encode_ids(ids):
            conn.execute(_NOTIFY_FINISHED, {"payload": payload.decode()})

    def listen_finished(
        self, engine: Engine, finished: wakeup.Finished, stop: threading.Event
    ) -> None:
        _listen(
            engine,
            FINISHED_CHANNEL,
            lambda payload: finished(None if payload is None else wakeup.decode_ids(payload)),
            stop,
        )


def _listen(
    engine: Engine, channel: str, heard: Callable[[str | None], None], stop: threading.Event
) -> None:
    """LISTEN on ``channel`` and pass each notification's payload to ``heard`` until
    ``stop`` is set, reconnecting after a failure; ``heard(None)`` each time it starts
    listening, for what came while it was not. Runs on a thread of its own."""
    receive = _RECEIVERS.get(engine.dialect.driver)
    if receive is None:
        log.warning(
            "the driver %s gets no NOTIFY: %s are seen only at each poll; "
            "use postgresql+psycopg:// (psycopg 3) or postgresql+psycopg2://",
            engine.dialect.driver,
            "new jobs" if channel == CHANNEL else "finished jobs",
        )
        return
    pause = 0.5
    while not stop.is_set():
        raw = None
        try:
            raw = engine.raw_connection()
            driver = raw.driver_connection
            driver.autocommit = True  # type: ignore[union-attr]
            driver.cursor().execute(f"LISTEN {channel}")  # type: ignore[union-attr]
            heard(None)  # anything sent while we were not listening
            pause = 0.5
            while not stop.is_set():
                # A short wait: a stopping worker (the end of every --burst run)
                # waits for this thread, so it must notice the stop at once.
                for payload in receive(driver, 0.1):
                    heard(payload)
        except Exception as exc:  # never let a dropped connection end the worker
            log.warning("LISTEN %s failed (%s); polling until it reconnects", channel, exc)
            stop.wait(pause)
            pause = min(pause * 2, 30.0)
        finally:
            if raw is not None:
                raw.invalidate()  # a LISTENing autocommit connection must not be reused


def _psycopg_notices(driver: Any, timeout: float) -> Iterator[str]:
    for notice in driver.notifies(timeout=timeout, stop_after=1):
        yield notice.payload


def _psycopg2_notices(driver: Any, timeout: float) -> Iterator[str]:
    # psycopg2 has no blocking notifies(): wait for the socket, then let it read.
    if select.select([driver], [], [], timeout)[0]:
        driver.poll()
        while driver.notifies:
            yield driver.notifies.pop(0).payload


#: By driver: the notifications that arrive on a LISTENing connection within a timeout.
_RECEIVERS: dict[str, Callable[[Any, float], Iterator[str]]] = {
    "psycopg": _psycopg_notices,
    "psycopg2": _psycopg2_notices,
}


def listens(driver: str) -> bool:
    """Whether workers on this driver are woken by ``NOTIFY`` (others poll)."""
    return driver in _RECEIVERS


@functools.lru_cache(maxsize=64)
def _claim_any(candidates: sa.Select[tuple[int]]) -> sa.Update:
    # ``= ANY(ARRAY(subquery))`` runs the subquery exactly once (an InitPlan).
    # PostgreSQL may re-run an ``IN (subquery)`` for every outer row (a nested-loop
    # semi join), and with SKIP LOCKED each run finds rows the previous one locked
    # past: ``LIMIT 1`` then claimed every pending job.
    # No outer status test: locking a row that changed since the snapshot re-checks
    # the subquery's WHERE on its newest version (and skips it if no longer pending),
    # and the lock keeps it so. A test here also let PostgreSQL, with stale
    # statistics, find the rows by scanning every pending one instead of by id.
    locked = candidates.with_for_update(skip_locked=True).scalar_subquery()
    return claim_update(jobs.c.id == sa.any_(sa.func.array(locked)))


#: Rows per bulk INSERT (its values that differ between rows go in one JSON text).
ROWS_PER_INSERT = 10_000
#: Characters of payload per bulk INSERT: its JSON text, like any value, stops at 1 GB.
PAYLOAD_PER_INSERT = 2**26


def _chunks(rows: list[JobRow]) -> Iterator[list[JobRow]]:
    start, size = 0, 0
    for index, row in enumerate(rows):
        length = len(row.get("payload") or "")
        if index > start and (
            index - start == ROWS_PER_INSERT or size + length > PAYLOAD_PER_INSERT
        ):
            yield rows[start:index]
            start, size = index, 0
        size += length
    if start < len(rows):
        yield rows[start:]


def _json_rows(conn: Connection, rows: Sequence[Mapping[str, Any]], names: tuple[str, ...]) -> str:
    """The values of ``names`` in each of ``rows`` as a JSON array of arrays, each value
    as its column's type binds it (a time: aware, in UTC) and times as ISO 8601 text."""
    dialect = conn.dialect
    binds = [jobs.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in names]
    if any(binds):
        table = [
            [
                value if bind is None else bind(value)
                for bind, value in zip(binds, values, strict=True)
            ]
            for values in ([row[name] for name in names] for row in rows)
        ]
    else:
        table = [[row[name] for name in names] for row in rows]
    return json.dumps(table, ensure_ascii=False, separators=(",", ":"), default=_iso)


def _iso(value: Any) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"{value!r} cannot be written in a bulk insert")


@functools.lru_cache(maxsize=32)
def _insert_rows(varying: tuple[str, ...], shared: tuple[str, ...]) -> sa.Insert:
    """The bulk INSERT of :meth:`PostgresOps.insert_jobs`: ``j_rows`` the JSON array of
    the values of ``varying`` in each row, ``c_<column>`` one value for each of ``shared``."""
    text = sa.bindparam("j_rows", type_=sa.Text)
    rows = (
        sa.func.json_array_elements(sa.cast(text, JSON))
        .table_valued(sa.column("r", JSON), with_ordinality="n")
        .render_derived(name="v")
    )
    values = sa.select(
        *(
            sa.cast(rows.c.r.op("->>")(sa.literal_column(str(index))), jobs.c[name].type)
            for index, name in enumerate(varying)
        ),
        *(sa.bindparam(f"c_{name}", type_=jobs.c[name].type) for name in shared),
    ).order_by(rows.c.n)
    return (
        pg_insert(jobs)
        .from_select([*varying, *shared], values)
        .on_conflict_do_nothing(index_elements=[jobs.c.idempotency_key])
        .returning(jobs.c.id, jobs.c.idempotency_key)
    )


# WITH held AS (SELECT id … ORDER BY id FOR UPDATE) UPDATE … FROM held, unnest(ids,
# tokens, results) AS d … RETURNING id: a batch of completions, each fenced by its own
# token, as one statement whatever the batch's size. ``held`` locks the batch's running
# rows in id order before any is written, as every batch write does, so two never wait
# on each other crosswise; the join's order, which the planner picks, no longer matters.
_IDS = sa.bindparam("b_ids", type_=ARRAY(sa.BigInteger))
_DONE = (
    sa.func.unnest(
        _IDS,
        sa.bindparam("b_tokens", type_=ARRAY(sa.String)),
        sa.bindparam("b_results", type_=ARRAY(sa.Text)),
    )
    .table_valued(
        sa.column("id", sa.BigInteger), sa.column("token", sa.String), sa.column("result", sa.Text)
    )
    .render_derived(name="d")
)
_HELD = (
    sa.select(jobs.c.id)
    .where(jobs.c.id == sa.any_(_IDS), jobs.c.status == RUNNING)
    .order_by(jobs.c.id)
    .with_for_update()
    .cte("held")
)
_NOW = sa.bindparam("b_now", type_=jobs.c.finished_at.type)
_COMPLETED = (
    sa.update(jobs)
    .where(
        jobs.c.id == _HELD.c.id,
        jobs.c.id == _DONE.c.id,
        jobs.c.status == RUNNING,
        jobs.c.claim_token == _DONE.c.token,
    )
    .values(
        status=COMPLETED, result=_DONE.c.result, finished_at=_NOW, updated_at=_NOW, claim_token=None
    )
    .returning(jobs.c.id, jobs.c.has_dependents)
)

# Waiters are told of a batch's completions by one notification per
# wakeup.IDS_PER_MESSAGE ids completed, made by the same statement: WITH done AS (UPDATE
# … RETURNING id), told AS (SELECT pg_notify(…, string_agg(id)) FROM done GROUP BY its
# part) SELECT id FROM done WHERE (SELECT count(*) FROM told) >= 0. The condition only
# makes ``told`` run (once, the first time it is tested); a batch that completes nothing
# tells nothing.
_DONE_IDS = _COMPLETED.cte("done")
_PARTS = sa.select(
    _DONE_IDS.c.id,
    (sa.func.row_number().over() // wakeup.IDS_PER_MESSAGE).label("part"),
).subquery("parts")
_TOLD = (
    sa.select(
        sa.func.pg_notify(
            FINISHED_CHANNEL, sa.func.string_agg(sa.cast(_PARTS.c.id, sa.Text), ",")
        ).label("told")
    )
    .group_by(_PARTS.c.part)
    .cte("told")
)
_COMPLETE_ARRAYS = sa.select(_DONE_IDS.c.id, _DONE_IDS.c.has_dependents).where(
    sa.select(sa.func.count()).select_from(_TOLD).scalar_subquery() >= 0
)
_NOTIFY_FINISHED = sa.select(
    sa.func.pg_notify(FINISHED_CHANNEL, sa.bindparam("payload", type_=sa.Text))
)

"""A partitioned history against DELETE pruning, on PostgreSQL (issue 24): finished jobs
kept in daily partitions and dropped whole, measured against today's batched DELETEs.

    python -m benchmarks.partitions [--history 1000000] [--jobs 20000] [--runs 3]
                                    [--detach concurrently|plain|drop]
                                    [--postgres URL] [--output FILE]

Raw SQL through psycopg (no Flask, no worker process in the measured loops), on two
fresh databases whose tables are made by the queue's own migrations:

- *plain*: ``sqlqueue_jobs`` as the migrations leave it.
- *partitioned*: the same columns, defaults and indexes (by the same names), plus
  ``bucket integer NOT NULL DEFAULT 0``: 0 while a job is pending or running, the UTC
  day number (``floor(epoch / 86400)``) once it finished. The table is ``PARTITION BY
  LIST (bucket)``: one live partition (0) and one per day, from the history's first day
  to tomorrow. PostgreSQL requires a partitioned table's primary key and unique indexes
  to hold the partition column, so they get ``bucket`` as their last column: unique per
  partition only.

Each gets ``--history`` completed jobs spread evenly over the 8 whole UTC days before
today (one ``INSERT … SELECT generate_series``, ids in the order they finished), then
``VACUUM ANALYZE``; then a ``CHECKPOINT``, so that no checkpoint writes the fills' pages
during the drains. Then, the schemas' runs interleaved (their order swapped each run):

- *drain*: ``--jobs`` pending jobs inserted, then one connection claims up to 64 per
  transaction in the queue's form (``UPDATE … WHERE id = ANY(ARRAY(SELECT … ORDER BY
  priority DESC, run_at, id LIMIT 64 FOR UPDATE SKIP LOCKED))``, the claim planner
  settings of the queue's PostgreSQL dialect) and, in the same transaction, completes the
  batch claimed before it, fenced by its claim token; on the partitioned table that sets
  ``bucket`` to today, which moves the row into today's partition. Jobs do nothing.
  Each drain starts from a vacuumed, analyzed table (an untimed ``VACUUM ANALYZE``, as
  autovacuum would keep it). jobs/s = jobs ÷ the loop's wall time
  (``time.perf_counter``), median of ``--runs``.
  The partitioned table's live queries name ``bucket = 0``, as a queue built on it would;
  it is also drained with queries that do not (*no bucket*: what any query of today's
  that does not know the bucket costs). Beside it: the server backend's CPU time per
  1,000 jobs (``/proc``), the WAL written per job (cluster-wide: anything else the server
  does counts too) and the longest claim/complete transaction. Every job must be claimed once and
  end completed with one attempt.
- *prune*: the oldest day of history left (about ``--history`` ÷ 8 rows) removed beside a
  drain. Plain: ``DELETE`` of 500 rows at a time by id (the expired ids in a subquery,
  like a retention round's batch), each its own transaction, back to back until none is
  left, in a second connection (a thread). Partitioned: that day's partition detached
  (``--detach``: ``DETACH PARTITION … CONCURRENTLY``, which takes no lock that stops the
  workers, then ``DROP TABLE``; ``plain``: ``DETACH PARTITION`` and ``DROP TABLE`` in one
  transaction; ``drop``: ``DROP TABLE`` of the partition). The prune begins 2 s into the
  drain; the drain inserts more pending jobs whenever it runs dry, until 2 s after the
  prune's window (the prune, or the 0.5 s from its start if it took less). Figures: the
  seconds the prune took, rows/s, the drain's rate over the window ÷ the same drain's
  rate before and after it (target ≥ 0.9; the same drain, so that the machine's other
  load, which moves from one minute to the next, cancels out), and the longest
  claim/complete transaction in the window. Then, with no drain beside it, a
  ``VACUUM`` of the jobs table, timed: the clean-up a DELETE leaves to (auto)vacuum and a
  dropped partition does not (it also cleans what that run's drain left, on both).
  ``min(--runs, 8)`` runs, each the oldest day left; medians.

The verdict is computed from those figures (see ``verdict``): partitioning is kept only
if it fixes what DELETE pruning misses (the drain while pruning under 0.9 with DELETE,
not with the partitions) at a drain cost within the target, or drains faster by more
than 5 % in every run; a ratio whose runs fall on both sides of 0.9 is named unresolved.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import re
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import LiteralString

import psycopg
from psycopg import sql

from benchmarks.peers import common
from benchmarks.peers.__main__ import postgres_version

TARGET = 0.9
BATCH = 64  # jobs per claim
PRUNE_BATCH = 500  # rows per DELETE, as a retention round's batch
DAYS = 8  # of history, whole UTC days before today
DAY = 86_400
WARMUP = 2.0  # seconds of draining before the prune begins
MIN_WINDOW = 0.5  # seconds a drain is measured over, when the prune is faster
AFTER = 2.0  # seconds of draining after that window
NOISE_FLOOR = 0.05  # a drain ratio within this of 1 never counts as a win
TIMEOUT = 1800.0  # seconds any one drain may take, refills included
FINISHED = "('completed', 'cancelled', 'dead')"
DETACH = {
    "concurrently": "DETACH PARTITION … CONCURRENTLY, then DROP TABLE",
    "plain": "DETACH PARTITION and DROP TABLE in one transaction",
    "drop": "DROP TABLE of the partition",
}

_HISTORY_COLUMNS = (
    "queue, task, payload, status, attempts, max_attempts, rescues, releases, priority, "
    "run_at, created_at, updated_at, started_at, finished_at, worker_id, snoozes, "
    "has_dependents"
)
# Job i of n finished at start + (i - 1) * step: n ÷ 8 jobs on each of the 8 days.
_FILL = (
    "INSERT INTO sqlqueue_jobs ({columns}) "
    "SELECT 'default', 'bench.write', "
    '\'{{"args":[],"kwargs":{{"i":\' || i || \',"email":"user\' || i || \'@example.com"}}}}\', '
    "'completed', 1, 3, 0, 0, 0, t, t, t, t, t, 'history', 0, false{bucket} FROM "
    "(SELECT i, %(start)s + (i - 1) * %(step)s * interval '1 second' AS t "
    "FROM generate_series(1, %(count)s) AS i) AS s"
)
_PENDING = (
    "WITH made AS (INSERT INTO sqlqueue_jobs (queue, task, payload, status, attempts, "
    "max_attempts, priority, run_at, created_at, updated_at) "
    "SELECT 'default', 'bench.write', '{\"args\":[],\"kwargs\":{\"i\":' || i || '}}', "
    "'pending', 0, 3, 0, now(), now(), now() FROM generate_series(1, %(count)s) AS i "
    "RETURNING id) SELECT min(id), max(id), count(*) FROM made"
)
# The queue's PostgreSQL claim planner settings (core/dialects/postgresql.py), for the
# drain's session: walk the claim index in order, never sort or bitmap-scan every pending job.
_PLANNER = (
    "SELECT set_config('enable_bitmapscan', 'off', false), "
    "set_config('enable_sort', 'off', false), set_config('jit', 'off', false)"
)
_TODAY = "floor(extract(epoch FROM now()) / 86400)::int"


@dataclass(frozen=True)
class Schema:
    """One way of draining: which database, and the claim and completion it runs."""

    name: str
    claim: LiteralString
    complete: LiteralString
    partitioned: bool


def _claim(live: LiteralString) -> LiteralString:
    # ``= ANY(ARRAY(subquery))`` runs the subquery once, as the queue's claim does: an
    # ``IN (subquery)`` may be re-run per outer row and, with SKIP LOCKED, take more.
    return (
        "UPDATE sqlqueue_jobs SET status = 'running', started_at = now(), updated_at = now(), "
        "attempts = attempts + 1, worker_id = %(worker)s, claim_token = %(token)s "
        f"WHERE {live}id = ANY(ARRAY(SELECT id FROM sqlqueue_jobs "
        f"WHERE {live}status = 'pending' AND run_at <= now() "
        f"ORDER BY priority DESC, run_at, id LIMIT {BATCH} FOR UPDATE SKIP LOCKED)) "
        "RETURNING id"
    )


def _complete(live: LiteralString, bucket: LiteralString) -> LiteralString:
    return (
        "UPDATE sqlqueue_jobs SET status = 'completed', finished_at = now(), "
        f"updated_at = now(), result = 'null'{bucket} "
        f"WHERE {live}id = ANY(%(ids)s) AND claim_token = %(token)s"
    )


PLAIN = Schema("plain", _claim(""), _complete("", ""), False)
PARTITIONED = Schema(
    "partitioned",
    _claim("bucket = 0 AND "),
    _complete("bucket = 0 AND ", f", bucket = {_TODAY}"),
    True,
)
NO_BUCKET = Schema(
    "partitioned, no bucket", _claim(""), _complete("", f", bucket = {_TODAY}"), True
)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.partitions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--detach", choices=sorted(DETACH), default="concurrently")
    parser.add_argument("--postgres", default=common.DEFAULT_POSTGRES)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    for name in ("history", "jobs", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.history < DAYS * PRUNE_BATCH:
        parser.error(f"--history must be at least {DAYS * PRUNE_BATCH}: a day of it to prune")
    return args


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def today() -> int:
    """The UTC day number, as ``bucket`` counts days."""
    return int(time.time() // DAY)


def day_start(day: int) -> datetime:
    return datetime.fromtimestamp(day * DAY, UTC)


def partition(day: int) -> str:
    return f"sqlqueue_jobs_d{day}"


# -- the two tables ----------------------------------------------------------------------


def migrate(url: str) -> None:
    """The queue's tables, by its own migrations (as benchmarks/history.py makes them)."""
    from benchmarks.peers import app_sqlqueue

    app = app_sqlqueue.create_app(url.replace("postgresql://", "postgresql+psycopg://", 1))
    app_sqlqueue.queue.upgrade_database(app=app)
    app.extensions["sqlqueue"].store.engine.dispose()


_INDEX = re.compile(r"^(CREATE (?:UNIQUE )?INDEX \S+ ON \S+ USING \w+ \()([^()]*)(\).*)$")


def partition_jobs(dsn: str, first_day: int, last_day: int) -> list[str]:
    """Remake the migrated ``sqlqueue_jobs`` as a table partitioned by ``bucket``, with
    the same columns, defaults and indexes (the unique ones with ``bucket`` added, as
    PostgreSQL requires); returns the unique indexes' new definitions."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        indexes = conn.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'sqlqueue_jobs'::regclass ORDER BY c.relname"
        ).fetchall()
        # The id sequence belongs to the old table's column: kept for the new one.
        conn.execute("ALTER SEQUENCE sqlqueue_jobs_id_seq OWNED BY NONE")
        conn.execute("ALTER TABLE sqlqueue_jobs RENAME TO sqlqueue_jobs_unpartitioned")
        conn.execute(
            "CREATE TABLE sqlqueue_jobs (LIKE sqlqueue_jobs_unpartitioned INCLUDING DEFAULTS "
            "INCLUDING CONSTRAINTS, bucket integer NOT NULL DEFAULT 0) PARTITION BY LIST (bucket)"
        )
        conn.execute("DROP TABLE sqlqueue_jobs_unpartitioned")
        conn.execute("ALTER SEQUENCE sqlqueue_jobs_id_seq OWNED BY sqlqueue_jobs.id")
        unique: list[str] = []
        for name, definition, primary, is_unique in indexes:
            match = _INDEX.match(definition)
            if match is None:
                raise common.BenchError(f"index {name}: cannot read {definition!r}")
            head, columns, tail = match.groups()
            if primary:
                ddl = (
                    f'ALTER TABLE sqlqueue_jobs ADD CONSTRAINT "{name}" '
                    f"PRIMARY KEY ({columns}, bucket)"
                )
                unique.append(f"{name}: PRIMARY KEY ({columns}, bucket)")
            elif is_unique:
                ddl = f"{head}{columns}, bucket{tail}"
                unique.append(f"{name}: UNIQUE ({columns}, bucket){tail[1:]}")
            else:
                ddl = definition
            # The text is the server's own pg_get_indexdef, not input from anyone.
            conn.execute(sql.SQL(ddl))
        conn.execute("CREATE TABLE sqlqueue_jobs_live PARTITION OF sqlqueue_jobs FOR VALUES IN (0)")
        for day in range(first_day, last_day + 1):
            conn.execute(
                sql.SQL("CREATE TABLE {} PARTITION OF sqlqueue_jobs FOR VALUES IN ({})").format(
                    sql.Identifier(partition(day)), sql.Literal(day)
                )
            )
    return unique


def layout(dsn: str) -> tuple[list[str], list[str]]:
    """The jobs table's columns and index names, to check the two schemas match."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'sqlqueue_jobs'::regclass "
            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        ).fetchall()
        indexes = conn.execute(
            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = 'sqlqueue_jobs'::regclass ORDER BY c.relname"
        ).fetchall()
    return [row[0] for row in columns], [row[0] for row in indexes]


def fill(dsn: str, count: int, first_day: int, partitioned: bool) -> tuple[float, int]:
    """Write ``count`` completed jobs over the ``DAYS`` days from ``first_day``, then
    ``VACUUM ANALYZE``; returns the seconds the INSERT took and the table's bytes."""
    query = _FILL.format(
        columns=_HISTORY_COLUMNS + (", bucket" if partitioned else ""),
        bucket=", floor(extract(epoch FROM t) / 86400)::int" if partitioned else "",
    )
    params = {"start": day_start(first_day), "step": DAYS * DAY / count, "count": count}
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.perf_counter()
        with conn.transaction():
            conn.execute(query, params)
        took = time.perf_counter() - began
        conn.execute("VACUUM ANALYZE sqlqueue_jobs")
        # A partitioned table's own size is 0: its partitions hold the rows.
        row = conn.execute(
            "SELECT count(*), (SELECT sum(pg_total_relation_size(r)) FROM "
            "(SELECT 'sqlqueue_jobs'::regclass AS r UNION "
            "SELECT relid FROM pg_partition_tree('sqlqueue_jobs')) AS tree) FROM sqlqueue_jobs"
        ).fetchone()
    assert row is not None
    if row[0] != count:
        raise common.BenchError(f"the fill wrote {row[0]:,} rows of {count:,}")
    return took, int(row[1])


# -- the drain ---------------------------------------------------------------------------


@dataclass
class Drain:
    """One drain's record: every transaction's start and commit, the jobs completed by
    each commit, and the pauses to insert more jobs (no drain in them)."""

    jobs: int = 0
    seconds: float = 0.0
    backend_cpu: float | None = None
    wal_bytes: int = 0
    spans: list[tuple[float, float]] = field(default_factory=list)
    done: list[int] = field(default_factory=list)  # completed so far, at each commit
    gaps: list[tuple[float, float]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def longest(self) -> float:
        return max(end - start for start, end in self.spans)

    def between(self, start: float, end: float) -> tuple[int, float]:
        """Jobs completed and seconds spent draining from the last commit at or before
        ``start`` to the last at or before ``end`` (whole transactions), refills left out."""
        commits = [span[1] for span in self.spans]
        first = max(0, bisect.bisect_right(commits, start) - 1)
        last = max(0, bisect.bisect_right(commits, end) - 1)
        a, b = commits[first], commits[last]
        paused = sum(max(0.0, min(b, g1) - max(a, g0)) for g0, g1 in self.gaps)
        return self.done[last] - self.done[first], b - a - paused

    def window(self, start: float, end: float) -> tuple[float, float, float]:
        """Jobs/s over ``start`` … ``end``; jobs/s over the rest of the drain; the longest
        transaction that overlapped the window, in seconds."""
        jobs, seconds = self.between(start, end)
        all_jobs, all_seconds = self.between(self.spans[0][1], self.spans[-1][1])
        if jobs <= 0 or seconds <= 0 or all_seconds - seconds <= 0:
            raise common.BenchError("the drain did not cover the prune and its surroundings")
        longest = max(e - s for s, e in self.spans if e > start and s < end)
        return jobs / seconds, (all_jobs - jobs) / (all_seconds - seconds), longest


def insert_pending(conn: psycopg.Connection[Any], count: int) -> tuple[int, int]:
    with conn.transaction():
        row = conn.execute(_PENDING, {"count": count}).fetchone()
    assert row is not None
    low, high, made = row
    if made != count or high - low + 1 != count:
        raise common.BenchError(f"{made} pending jobs inserted of {count}, ids {low}…{high}")
    return int(low), int(high)


def wal_position(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def drain(dsn: str, schema: Schema, jobs: int, going: Callable[[], bool] | None = None) -> Drain:
    """Insert ``jobs`` pending jobs, then claim and complete until none is left. After
    each transaction ``going()`` is asked whether the caller wants more: if so, a drain
    that ran dry gets ``jobs`` more. Checks that every job was completed once."""
    out = Drain()
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Untimed: every drain starts from a vacuumed, analyzed table, as autovacuum
        # (off on some servers) would keep it; else each drain's dead rows slow the next
        # ones, and today's partition, made empty, has no statistics once it holds
        # hundreds of thousands of rows (a query not naming the bucket then reads all of it).
        conn.execute("VACUUM ANALYZE sqlqueue_jobs")
        conn.execute(_PLANNER)
        pid = conn.info.backend_pid
        ranges = [insert_pending(conn, jobs)]
        worker = f"bench-{uuid.uuid4().hex[:8]}"
        claimed: set[int] = set()
        previous: list[int] = []
        fence = ""
        completed = 0
        wal = wal_position(conn)
        cpu = common.stat_cpu(f"/proc/{pid}/stat")
        began = time.perf_counter()
        while True:
            token = uuid.uuid4().hex
            start = time.perf_counter()
            with conn.transaction():
                if previous:
                    done = conn.execute(schema.complete, {"ids": previous, "token": fence})
                    if done.rowcount != len(previous):
                        raise common.BenchError(
                            f"{schema.name}: {done.rowcount} of {len(previous)} jobs completed"
                        )
                ids = [
                    row[0] for row in conn.execute(schema.claim, {"worker": worker, "token": token})
                ]
            end = time.perf_counter()
            completed += len(previous)
            out.spans.append((start, end))
            out.done.append(completed)
            if len(ids) > BATCH or claimed.intersection(ids):
                raise common.BenchError(f"{schema.name}: a claim took {len(ids)} jobs or one twice")
            claimed.update(ids)
            previous, fence = ids, token
            wanted = going is not None and going()
            if not ids:
                if not wanted:
                    break
                ranges.append(insert_pending(conn, jobs))
                out.gaps.append((end, time.perf_counter()))
            if end - began > TIMEOUT:
                raise common.BenchError(f"{schema.name}: the drain took over {TIMEOUT:.0f} s")
        out.seconds = time.perf_counter() - began
        after = common.stat_cpu(f"/proc/{pid}/stat")
        out.backend_cpu = None if cpu is None or after is None else after - cpu
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", (wal,)
        ).fetchone()
        assert row is not None
        out.wal_bytes = int(row[0])
        out.jobs = completed
        check_completed(conn, schema, ranges, claimed, completed)
    return out


def check_completed(
    conn: psycopg.Connection[Any],
    schema: Schema,
    ranges: list[tuple[int, int]],
    claimed: set[int],
    completed: int,
) -> None:
    """Every job inserted was claimed once and is completed, with one attempt, once."""
    expected = sum(high - low + 1 for low, high in ranges)
    if len(claimed) != expected or completed != expected:
        raise common.BenchError(
            f"{schema.name}: {len(claimed)} claimed, {completed} completed of {expected}"
        )
    for low, high in ranges:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed' AND attempts = 1 "
            "AND finished_at IS NOT NULL), count(DISTINCT id) "
            "FROM sqlqueue_jobs WHERE id BETWEEN %s AND %s",
            (low, high),
        ).fetchone()
        assert row is not None
        if tuple(row) != (high - low + 1,) * 3:
            raise common.BenchError(
                f"{schema.name}: ids {low}…{high}: {row[0]} rows, {row[1]} completed once, "
                f"{row[2]} distinct of {high - low + 1}"
            )
    if schema.partitioned:
        row = conn.execute("SELECT count(*) FROM sqlqueue_jobs_live").fetchone()
        if row is None or row[0] != 0:
            raise common.BenchError(f"{schema.name}: rows left in the live partition")


# -- the prune ---------------------------------------------------------------------------


class Pruner(threading.Thread):
    """Removes one day of history once ``go`` is set; records when it began and ended."""

    def __init__(self, dsn: str, partitioned: bool, method: str, day: int) -> None:
        super().__init__(daemon=True)
        self.dsn, self.partitioned, self.method, self.day = dsn, partitioned, method, day
        self.go = threading.Event()
        self.started_at = self.ended_at = 0.0
        self.rows = self.statements = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                self.go.wait()
                self.started_at = time.perf_counter()
                if self.partitioned:
                    self.drop(conn)
                else:
                    self.delete(conn)
                self.ended_at = time.perf_counter()
        except BaseException as exc:  # reported by the main thread
            self.error = exc
            self.ended_at = time.perf_counter()

    def delete(self, conn: psycopg.Connection[Any]) -> None:
        cutoff = day_start(self.day + 1)  # the days before it are gone already
        query: LiteralString = (
            "DELETE FROM sqlqueue_jobs WHERE id = ANY(ARRAY(SELECT id FROM sqlqueue_jobs "
            f"WHERE status IN {FINISHED} AND finished_at < %(cutoff)s LIMIT {PRUNE_BATCH})) "
            f"AND status IN {FINISHED} AND finished_at < %(cutoff)s"
        )
        while True:
            gone = conn.execute(query, {"cutoff": cutoff}).rowcount
            self.rows += gone
            self.statements += 1
            if gone < PRUNE_BATCH:
                return

    def drop(self, conn: psycopg.Connection[Any]) -> None:
        name = sql.Identifier(partition(self.day))
        detach = sql.SQL("ALTER TABLE sqlqueue_jobs DETACH PARTITION {}").format(name)
        drop = sql.SQL("DROP TABLE {}").format(name)
        if self.method == "concurrently":
            # Not in a transaction block: PostgreSQL runs it as two of its own.
            conn.execute(detach + sql.SQL(" CONCURRENTLY"))
            conn.execute(drop)
        elif self.method == "plain":
            with conn.transaction():
                conn.execute(detach)
                conn.execute(drop)
        else:
            conn.execute(drop)
        self.statements = 2 if self.method != "drop" else 1


def count_day(dsn: str, day: int) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM sqlqueue_jobs WHERE status IN {FINISHED} "
            "AND finished_at >= %s AND finished_at < %s",
            (day_start(day), day_start(day + 1)),
        ).fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Prune:
    rows: int
    seconds: float
    rate: float  # the drain's jobs/s over the prune
    around: float  # the same drain's jobs/s before and after it
    longest: float  # the drain's longest transaction over the prune, seconds
    vacuum: float  # seconds of the VACUUM after it


def prune(dsn: str, schema: Schema, method: str, day: int, jobs: int) -> Prune:
    """Remove ``day`` of history beside a drain (see the module's docs)."""
    rows = count_day(dsn, day)
    if rows == 0:
        raise common.BenchError(f"{schema.name}: no history on day {day} to prune")
    pruner = Pruner(dsn, schema.partitioned, method, day)
    pruner.start()
    first: list[float] = []

    def going() -> bool:
        now = time.perf_counter()
        if not first:
            first.append(now)
        if not pruner.go.is_set():
            if now - first[0] >= WARMUP:
                pruner.go.set()
            return True
        if pruner.is_alive():
            return True
        return now < max(pruner.ended_at, pruner.started_at + MIN_WINDOW) + AFTER

    try:
        record = drain(dsn, schema, jobs, going)
    finally:
        pruner.go.set()  # a drain that failed early must not leave the thread waiting
        pruner.join(TIMEOUT)
    if pruner.error is not None:
        raise common.BenchError(f"{schema.name}: the prune failed: {pruner.error!r}")
    left = count_day(dsn, day)
    if left or (not schema.partitioned and pruner.rows != rows):
        raise common.BenchError(
            f"{schema.name}: day {day}: {rows:,} rows, {pruner.rows:,} deleted, {left:,} left"
        )
    if schema.partitioned:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT to_regclass(%s)", (partition(day),)).fetchone()
        if row is None or row[0] is not None:
            raise common.BenchError(f"{schema.name}: partition {partition(day)} is still there")
    seconds = pruner.ended_at - pruner.started_at
    rate, around, longest = record.window(
        pruner.started_at, max(pruner.ended_at, pruner.started_at + MIN_WINDOW)
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.perf_counter()
        conn.execute("VACUUM sqlqueue_jobs")
        vacuum = time.perf_counter() - began
    return Prune(rows, seconds, rate, around, longest, vacuum)


# -- the report --------------------------------------------------------------------------


@dataclass
class Figures:
    drains: dict[str, list[Drain]] = field(default_factory=dict)
    prunes: dict[str, list[Prune]] = field(default_factory=dict)
    filled: dict[str, tuple[float, int]] = field(default_factory=dict)

    def drain_rate(self, name: str) -> float:
        return statistics.median(d.rate for d in self.drains[name])

    def spread(self, name: str) -> float:
        """The drain runs' range ÷ their median: what a difference must beat to count."""
        rates = [d.rate for d in self.drains[name]]
        return (max(rates) - min(rates)) / statistics.median(rates)

    def prune_median(self, name: str, what: str) -> float:
        return float(statistics.median(getattr(p, what) for p in self.prunes[name]))

    def pairs(self) -> list[float]:
        """Partitioned ÷ plain, run by run: the two drains of a run ran one after the
        other, so a change in the machine's other load between runs falls out."""
        return [
            part.rate / plain.rate
            for part, plain in zip(self.drains["partitioned"], self.drains["plain"], strict=True)
        ]

    def durings(self, name: str) -> list[float]:
        """Drain rate while pruning ÷ the same drain's without, run by run."""
        return [p.rate / p.around for p in self.prunes[name]]

    def during(self, name: str) -> float:
        return float(statistics.median(self.durings(name)))


def verdict(f: Figures, method: str) -> tuple[str, str]:
    """The figures in one line, and whether partitioning wins on them. Each ratio is the
    median of its runs; a conclusion that the runs' range does not support is named
    unresolved rather than drawn."""
    pairs = f.pairs()
    drain_ratio = statistics.median(pairs)
    plain_during, part_during = f.during("plain"), f.during("partitioned")
    drop_s, delete_s = f.prune_median("partitioned", "seconds"), f.prune_median("plain", "seconds")
    vacuums = f.prune_median("partitioned", "vacuum"), f.prune_median("plain", "vacuum")
    summary = (
        f"partitioned drain {times(drain_ratio)} plain (runs {span(pairs)}); prune by "
        f"{DETACH[method]} {drop_s:.2f} s vs DELETE {delete_s:.2f} s; drain while pruning "
        f"{times(part_during)} ({span(f.durings('partitioned'))}) vs {times(plain_during)} "
        f"({span(f.durings('plain'))}), target ≥ {TARGET}x; VACUUM after it "
        f"{vacuums[0]:.2f} s vs {vacuums[1]:.2f} s"
    )
    if part_during < TARGET:
        why = (
            f"it does not win: its own drain while pruning misses the target ({times(part_during)})"
        )
    elif drain_ratio < TARGET:
        why = (
            f"it does not win: its drain costs more than the target allows "
            f"({times(drain_ratio)} plain's, under {TARGET}x)"
        )
    elif plain_during < TARGET:
        why = (
            f"it wins on these figures: DELETE pruning slows the drain to {times(plain_during)}, "
            f"under the target, and the partitioned history keeps {times(part_during)} at a "
            f"drain {times(drain_ratio)} plain's; weigh the costs below before keeping it"
        )
    elif min(pairs) > 1 + NOISE_FLOOR:
        why = (
            f"it wins on these figures: DELETE pruning meets the target too, but the "
            f"partitioned drain was faster by more than {NOISE_FLOOR:.0%} in every run; "
            "weigh the costs below before keeping it"
        )
    else:
        why = (
            f"it does not win: DELETE pruning already keeps the drain at {times(plain_during)} "
            f"(target {TARGET}x), and the partitioned drain is not faster by more than "
            f"{NOISE_FLOOR:.0%} in every run: a faster prune alone buys nothing the workers see"
        )
    unresolved = [
        label
        for label, runs in (
            ("partitioned ÷ plain drain", pairs),
            ("plain's drain while pruning", f.durings("plain")),
            ("partitioned's drain while pruning", f.durings("partitioned")),
        )
        if min(runs) < TARGET <= max(runs)
    ]
    if unresolved:
        why += (
            f". Unresolved at this size: the runs of {', '.join(unresolved)} fall on both sides "
            f"of {TARGET}x; more --runs or --jobs would settle it"
        )
    return summary, why


def span(ratios: list[float]) -> str:
    return f"{times(min(ratios))} to {times(max(ratios))}" if len(ratios) > 1 else "1 run"


def times(ratio: float) -> str:
    """A ratio cut (not rounded) to 2 decimals: 0.898 must not read as 0.90 beside a
    target of 0.9 it misses."""
    return f"{math.floor(ratio * 100) / 100:.2f}x"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


def report(f: Figures, args: argparse.Namespace, header: list[str], unique: list[str]) -> str:
    plain_rate, part_rate = f.drain_rate("plain"), f.drain_rate("partitioned")
    nobucket = f.drain_rate(NO_BUCKET.name)

    def per(name: str, value: Callable[[Drain], float | None]) -> float | None:
        values = [value(d) for d in f.drains[name]]
        known = [v for v in values if v is not None]
        return statistics.median(known) if len(known) == len(values) else None

    def row(figure: str, plain: float | None, part: float | None, fmt: str) -> str:
        def show(v: float | None) -> str:
            return "n/a" if v is None else format(v, fmt)

        ratio = times(part / plain) if plain and part is not None else "—"
        return f"| {figure} | {show(plain)} | {show(part)} | {ratio} |"

    def cpu(d: Drain) -> float | None:
        return None if d.backend_cpu is None else d.backend_cpu * 1e6 / d.jobs

    prune_runs = len(f.prunes["plain"])
    table = [
        "| figure | plain | partitioned | partitioned ÷ plain |",
        "|---|---:|---:|---:|",
        row(f"drain, jobs/s (median of {args.runs})", plain_rate, part_rate, ",.0f"),
        f"| drain, jobs/s, partitioned with live queries not naming `bucket = 0` | — "
        f"| {nobucket:,.0f} | {times(nobucket / plain_rate)} |",
        f"| drain, partitioned ÷ plain run by run (median; range) | | | "
        f"{times(statistics.median(f.pairs()))}; {span(f.pairs())} |",
        row(
            "server backend CPU per 1,000 jobs drained (ms)",
            per("plain", cpu),
            per("partitioned", cpu),
            ",.0f",
        ),
        row(
            "WAL per job drained (bytes, cluster-wide)",
            per("plain", lambda d: d.wal_bytes / d.jobs),
            per("partitioned", lambda d: d.wal_bytes / d.jobs),
            ",.0f",
        ),
        row(
            "longest claim/complete transaction in a drain (ms, median of runs)",
            per("plain", lambda d: d.longest * 1000),
            per("partitioned", lambda d: d.longest * 1000),
            ",.1f",
        ),
        row(
            "jobs table after the fill, indexes included (MB)",
            f.filled["plain"][1] / 2**20,
            f.filled["partitioned"][1] / 2**20,
            ",.0f",
        ),
        row(
            "history fill, one INSERT … SELECT (s)",
            f.filled["plain"][0],
            f.filled["partitioned"][0],
            ",.1f",
        ),
        row(
            f"prune one day: rows (median of {prune_runs})",
            f.prune_median("plain", "rows"),
            f.prune_median("partitioned", "rows"),
            ",.0f",
        ),
        row(
            "prune one day: seconds",
            f.prune_median("plain", "seconds"),
            f.prune_median("partitioned", "seconds"),
            ",.3f",
        ),
        row(
            "prune one day: rows/s",
            statistics.median(p.rows / p.seconds for p in f.prunes["plain"]),
            statistics.median(p.rows / p.seconds for p in f.prunes["partitioned"]),
            ",.0f",
        ),
        row(
            "drain while pruning, jobs/s",
            f.prune_median("plain", "rate"),
            f.prune_median("partitioned", "rate"),
            ",.0f",
        ),
        row(
            "the same drains before and after the prune, jobs/s",
            f.prune_median("plain", "around"),
            f.prune_median("partitioned", "around"),
            ",.0f",
        ),
    ]

    def against(name: str) -> str:
        during = f.during(name)
        status = "met" if during >= TARGET else "**not met**"
        return f"{times(during)} (runs {span(f.durings(name))}), {status}"

    table += [
        f"| drain while pruning ÷ drain (target ≥ {TARGET}x) | {against('plain')} "
        f"| {against('partitioned')} | — |",
        row(
            "longest claim/complete transaction while pruning (ms)",
            f.prune_median("plain", "longest") * 1000,
            f.prune_median("partitioned", "longest") * 1000,
            ",.1f",
        ),
        row(
            "VACUUM of the jobs table after each prune, no drain beside it (s)",
            f.prune_median("plain", "vacuum"),
            f.prune_median("partitioned", "vacuum"),
            ",.2f",
        ),
    ]
    summary, why = verdict(f, args.detach)
    runs = []
    for name, drains in f.drains.items():
        rates = ", ".join(f"{d.rate:,.0f}" for d in drains)
        runs.append(f"- drain {name}: {rates} jobs/s")
    for name, prunes in f.prunes.items():
        each = "; ".join(
            f"{p.rows:,} rows in {p.seconds:.3f} s, drain {p.rate:,.0f} jobs/s "
            f"(around it {p.around:,.0f}), "
            f"longest transaction {ms(p.longest)} ms, VACUUM {p.vacuum:.2f} s"
            for p in prunes
        )
        runs.append(f"- prune {name}: {each}")
    return "\n".join(
        [
            *header,
            "",
            f"{args.history:,} completed jobs of history over {DAYS} days; {args.jobs:,} jobs "
            f"per drain, medians of {args.runs} run(s); one day pruned in each of "
            f"{prune_runs} run(s) (the oldest left). Partitions dropped by {DETACH[args.detach]}.",
            "",
            *table,
            "",
            f"**Verdict**: {summary}. So {why}.",
            "",
            "### Each run",
            "",
            *runs,
            "",
            "### The schemas",
            "",
            "- *plain*: `sqlqueue_jobs` as the queue's migrations make it (primary key `id`, "
            "the partial claim index `WHERE status = 'pending'`, the running-job indexes, "
            "`(status, finished_at)` and the rest); pruned as a retention round prunes, by "
            f"`DELETE … WHERE id = ANY(ARRAY(SELECT id … WHERE status IN {FINISHED} AND "
            f"finished_at < cutoff LIMIT {PRUNE_BATCH}))`, each its own transaction, "
            "back to back.",
            "- *partitioned*: the same columns, defaults and indexes, plus `bucket integer NOT "
            "NULL DEFAULT 0` (0 for a live job, the UTC day number once finished), `PARTITION "
            "BY LIST (bucket)`: `sqlqueue_jobs_live` for 0 and `sqlqueue_jobs_d<day>` per day. "
            "Completing a job sets the bucket, which moves its row (a DELETE from the live "
            "partition and an INSERT into the day's). The claim and completion name "
            "`bucket = 0`. The unique indexes had to take the bucket:",
            *(f"  - {line}" for line in unique),
            "",
            "### What a partitioned history costs the queue beyond these figures",
            "",
            "A partitioned table's primary key and unique indexes must hold the partition "
            "column, so PostgreSQL can no longer enforce that an `idempotency_key` or a "
            "`unique_key` is unique across the table: a key is unique only among the jobs in "
            "the same bucket. `idempotency_key` promises one job per key for as long as the "
            "row exists, whatever its status (docs/uniqueness.md): once the first job has "
            "finished and moved to its day's partition, the same key enqueued again would "
            "make a second job; a `unique_key` whose scope counts finished jobs (at most once "
            "an hour) loses its guard the same way; and `id` is unique by no constraint, the "
            "sequence alone keeps it so. The queue would have to keep its keys in a table of "
            "their own, or check them under locks of its own. An existing table cannot be "
            "made partitioned in place: a migration creates the new table and copies every "
            "row into it (for millions of rows, minutes with the queue stopped, or a dual "
            "write while it runs). Every query on finished jobs (the admin's lists and "
            "counts, result lookups by id, purges, dependencies' checks) has to name the "
            "bucket, or it visits every partition's index: the *no bucket* drain above "
            "shows what that costs live queries, and a lookup by id alone probes one index "
            "per day kept. A new day needs its partition made before the first job finishes "
            "on it (or a default partition, whose rows a new partition then has to be "
            "checked against). And the rows that belong to a job in the queue's other tables "
            "(its tags, dependency edges, a payload kept outside the row), which a retention "
            "round deletes with it, are not dropped with the partition: they need their own "
            "sweep or their own partitions.",
            "",
            "### Errors",
            "",
            "none",
        ]
    )


# -- main --------------------------------------------------------------------------------


@contextlib.contextmanager
def databases(admin: str) -> Iterator[tuple[str, str]]:
    with (
        common.postgres_database(admin, "partitions_plain") as plain,
        common.postgres_database(admin, "partitions_part") as part,
    ):
        yield plain, part


def measure(args: argparse.Namespace, unique: list[str]) -> Figures:
    figures = Figures()
    with databases(args.postgres) as (plain_dsn, part_dsn):
        now = today()
        first_day = now - DAYS
        say(f"migrating {plain_dsn} and {part_dsn}")
        migrate(plain_dsn)
        migrate(part_dsn)
        unique.extend(partition_jobs(part_dsn, first_day, now + 1))
        plain_columns, plain_indexes = layout(plain_dsn)
        part_columns, part_indexes = layout(part_dsn)
        if part_columns != [*plain_columns, "bucket"] or part_indexes != plain_indexes:
            raise common.BenchError("the partitioned table's columns or indexes differ")
        for name, dsn, partitioned in (
            ("plain", plain_dsn, False),
            ("partitioned", part_dsn, True),
        ):
            figures.filled[name] = fill(dsn, args.history, first_day, partitioned)
            say(f"{name}: {args.history:,} jobs of history in {figures.filled[name][0]:.1f} s")
        # The fills' dirty pages written now, not by a checkpoint in the middle of a drain.
        with psycopg.connect(plain_dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        dsns = {"plain": plain_dsn, "partitioned": part_dsn, NO_BUCKET.name: part_dsn}
        schemas = [PLAIN, PARTITIONED, NO_BUCKET]
        for run in range(args.runs):
            for schema in schemas if run % 2 == 0 else schemas[::-1]:
                record = drain(dsns[schema.name], schema, args.jobs)
                figures.drains.setdefault(schema.name, []).append(record)
                say(
                    f"run {run + 1}: drain {schema.name}: {record.rate:,.0f} jobs/s, longest "
                    f"transaction {ms(record.longest)} ms"
                )
        pair = [PLAIN, PARTITIONED]
        for run in range(min(args.runs, DAYS)):
            for schema in pair if run % 2 == 0 else pair[::-1]:
                done = prune(dsns[schema.name], schema, args.detach, first_day + run, args.jobs)
                figures.prunes.setdefault(schema.name, []).append(done)
                say(
                    f"run {run + 1}: prune {schema.name}: {done.rows:,} rows in "
                    f"{done.seconds:.3f} s, drain {done.rate:,.0f} jobs/s"
                )
        if today() != now:
            say("note: the UTC day changed during the run; tomorrow's partition took the jobs")
    return figures


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = parse(given)
    started = time.monotonic()
    # A SIGTERM unwinds like an error, so the databases are dropped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with psycopg.connect(args.postgres, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        autovacuum = row[0] if row else "?"
        header = [
            "# A partitioned history against DELETE pruning (PostgreSQL)",
            "",
            "`python -m benchmarks.partitions " + " ".join(given) + "`",
            "",
            *common.machine(postgres_version(args.postgres), "not run"),
            f"- the server's autovacuum: {autovacuum} (each fill is followed by `VACUUM "
            "ANALYZE`, both by a `CHECKPOINT`)",
        ]
        unique: list[str] = []
        figures = measure(args, unique)
    except (common.BenchError, psycopg.Error) as exc:
        print(f"benchmarks.partitions: {exc}", file=sys.stderr)
        return 1
    header.append(common.closing_line(started))
    common.publish(report(figures, args, header, unique), args.output)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""Drain throughput against worker processes, and what each job costs the database
(issue 14, "Scale beyond one machine").

    python -m benchmarks.scaling --postgres postgresql://postgres@127.0.0.1:5432/test \\
        --mysql mysql+pymysql://root@127.0.0.1:3306/test [--processes 1,2,4,8] \\
        [--jobs 20000] [--concurrency 4] [--runs 1] [--output FILE]

For each server and each number of worker processes: a fresh database, a queue of
``--jobs`` jobs of the peers benchmark's ``write`` task (one line appended to a file; one
bulk enqueue), then ``python -m flask queue work --concurrency C`` in that many processes
until the queue is empty: the peers benchmark's ``drain`` (benchmarks/peers/harness.py),
watched, finished jobs counted as the lines of the output file.

Where the workers and the server share a few cores, jobs per second saturate on CPU, not
on the database; so the report also gives what a job costs the database, whatever the
load, read over the window from the first count after every worker logged its start to
the last:

- the server's CPU: user + system time (``/proc/<pid>/stat``) of the PostgreSQL backends,
  or of the MariaDB threads (``information_schema.PROCESSLIST.TID``), that serve the
  workers' connections to the benchmark's database; and apart, the server's background
  processes or threads (PostgreSQL's checkpointer, WAL writer...; InnoDB's own threads),
  which also work for every other database on the server;
- WAL bytes on PostgreSQL, the records ``pg_walinspect`` attributes to the benchmark's
  database (by block reference, and by transaction id for their commit records), and the
  commit records among them: transactions that wrote;
- redo bytes on MariaDB (``Innodb_os_log_written``, server-wide, less the rate the other
  sessions wrote at in the quiet seconds before the workers started);
- commits per job over the whole run, workers' start and stop included: ``xact_commit``
  of the database less the harness's own counting queries (PostgreSQL); ``Com_commit``,
  the COMMIT statements of the server, less the other sessions' rate (MariaDB). Both count
  every transaction the queue commits, reads included;
- the worker processes' own CPU;
- after the drain, the jobs table's row updates per job and the HOT ones among them
  (PostgreSQL), and its bytes on disk per job, table and indexes apart.

The servers may be shared (the test suites of other checkouts): the load average is
recorded at the end of every drain, and the other sessions' rates before it. The servers
must run on this machine (their processes are read in /proc), the PostgreSQL URL must be
a superuser's (``pg_walinspect``, every session in ``pg_stat_activity``) and the MariaDB
one must see every session (the PROCESS privilege).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.peers import common
from benchmarks.peers import harness
from benchmarks.peers.__main__ import concurrency_list
from benchmarks.peers.__main__ import mysql_version
from benchmarks.peers.__main__ import postgres_version
from benchmarks.peers.__main__ import server_version
from benchmarks.peers.common import DEFAULT_MYSQL
from benchmarks.peers.common import DEFAULT_POSTGRES
from benchmarks.peers.common import BenchError
from benchmarks.peers.common import Workers
from benchmarks.peers.common import close_counters
from benchmarks.peers.common import mysql_connect
from benchmarks.peers.common import pids_named
from benchmarks.peers.common import stat_cpu
from benchmarks.peers.common import temp_dir
from benchmarks.peers.systems import PY
from benchmarks.peers.systems import Context
from benchmarks.peers.systems import Setting
from benchmarks.peers.systems import SQLQueueSystem

#: What a worker logs once it has started (core/worker/__init__.py).
STARTED = " started: queues="
#: Seconds for a PostgreSQL backend to report its transactions (within a second of
#: them, or as it exits) before they are read.
PG_STATS_DELAY = 1.2
NAN = float("nan")  # a figure a store does not have: "—" in the report


class CountedSystem(SQLQueueSystem):
    """flask_sqlqueue, counting the harness's own counting queries: each is a transaction
    of the benchmark's database, which PostgreSQL's ``xact_commit`` counts too."""

    counts = 0

    def _count(self, status: str) -> int:
        self.counts += 1
        return super()._count(status)

    def worker_argv(self, setting: Setting) -> list[str]:
        """``python -m flask queue work --concurrency C`` at its default log level: the
        window opens when every worker has logged its start (``STARTED``)."""
        return [PY, "-m", "flask", "queue", "work", "--concurrency", str(setting.concurrency)]

    def prune_all(self) -> int:
        """Delete every completed job as the workers' retention does: batches of
        ``retention.BATCH`` ids, each in its own write transaction."""
        from benchmarks.peers.app_sqlqueue import queue
        from flask_sqlqueue.core.features import retention

        with self._app.app_context():
            store = queue.state().store
        later = store.now() + timedelta(days=1)
        total = 0

        def batch(conn: Any) -> int:
            return retention.prune_jobs_batch(conn, "completed", later, retention.BATCH)

        while deleted := store.run_write(batch):
            total += deleted
        return total

    @property
    def target(self) -> str:
        """The benchmark's database: a URL, libpq form or ``mysql+pymysql://``."""
        return self._target


@dataclass
class Reading:
    """The server and the workers at one moment."""

    at: float
    count: int  # jobs finished
    cpu: dict[int, float]  # CPU seconds of every server process (PostgreSQL) or thread
    own: set[int]  # of those, the ones serving the workers' connections
    background: set[int]  # of those, the ones serving no connection
    log: int  # WAL or redo bytes written, server-wide, since some origin
    # PostgreSQL's flushed WAL position as text ("" on MariaDB): PostgreSQL 15's
    # pg_walinspect refuses an end past the flush point, where the insert position may be
    lsn: str
    commits: int  # of the benchmark's database (PostgreSQL), of the server (MariaDB)
    rollbacks: int
    others: int  # commits of every other database (PostgreSQL), of the server (MariaDB)
    workers: float = 0.0  # CPU seconds of the worker processes
    load: float = 0.0  # 1-minute load average


def _cpu_spent(a: Reading, b: Reading, members: set[int], new_from_zero: bool) -> float:
    """CPU seconds ``members`` (as of ``b``) spent between two readings. A PostgreSQL
    backend started in between is a new process (from zero); a MariaDB thread may be an
    old one taken from the thread cache, so only threads seen at both count."""
    spent = 0.0
    for member in members & b.cpu.keys():
        if member in a.cpu:
            spent += b.cpu[member] - a.cpu[member]
        elif new_from_zero:
            spent += b.cpu[member]
    return spent


class PostgresServer:
    store = "PostgreSQL"
    backend = "postgres"
    log_name = "WAL"
    new_from_zero = True
    settle = PG_STATS_DELAY
    SETTINGS = (
        "synchronous_commit",
        "fsync",
        "full_page_writes",
        "wal_level",
        "autovacuum",
        "shared_buffers",
        "max_connections",
    )

    def __init__(self, admin_url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(admin_url, autocommit=True, connect_timeout=5)
        self.database = ""
        self.target = ""
        self.version = ""

    def close(self) -> None:
        self.conn.close()

    def _one(self, sql: str, params: Any = None) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        assert row is not None
        return row

    def settings(self) -> str:
        shown = [f"{name}={self._one(f'SHOW {name}')[0]}" for name in self.SETTINGS]
        return ", ".join(shown)

    @contextlib.contextmanager
    def attached(self, target: str) -> Iterator[None]:
        """Read the database at ``target`` meanwhile. ``pg_walinspect`` is created in it
        (and dropped with it) to attribute WAL records to it, and a temporary replication
        slot keeps the WAL from now on until they are read: a checkpoint may otherwise
        recycle it first, on a server the other sessions write to."""
        import psycopg

        self.target = target
        self.database = urlsplit(target).path.lstrip("/")
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        slot = f"sqlqueue_scaling_{uuid.uuid4().hex[:12]}"
        # Temporary: dropped with this session too, should this process die.
        self._one("SELECT pg_create_physical_replication_slot(%s, true, true)", (slot,))
        try:
            yield
        finally:
            self._one("SELECT pg_drop_replication_slot(%s)", (slot,))

    def connections(self) -> set[int]:
        """The backends connected to the database now."""
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,)
        ).fetchall()
        return {int(pid) for (pid,) in rows}

    def read(self, exclude: set[int], count: int) -> Reading:
        at = time.monotonic()
        rows = self.conn.execute("SELECT pid, datname, backend_type FROM pg_stat_activity")
        clients, own = set(), set()
        for pid, datname, backend_type in rows.fetchall():
            if backend_type == "client backend":
                clients.add(pid)
                if datname == self.database and pid not in exclude:
                    own.add(pid)
        lsn, position = self._one(
            "SELECT pg_current_wal_flush_lsn()::text, "
            "pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')"
        )
        commits, rollbacks, others = self._one(
            "SELECT sum(xact_commit) FILTER (WHERE datname = %(db)s), "
            "sum(xact_rollback) FILTER (WHERE datname = %(db)s), "
            "sum(xact_commit) FILTER (WHERE datname IS DISTINCT FROM %(db)s) "
            "FROM pg_stat_database",
            {"db": self.database},
        )
        cpu = {}
        for pid in pids_named(("postgres",)):
            if (seconds := stat_cpu(f"/proc/{pid}/stat")) is not None:
                cpu[pid] = seconds
        background = set(cpu) - clients
        return Reading(
            at,
            count,
            cpu,
            own,
            background,
            int(position),
            lsn,
            *map(int, (commits, rollbacks, others)),
        )

    def attributed(self, start: str, end: str) -> tuple[int, int]:
        """The WAL bytes between two positions whose records touch the database's
        blocks, or commit its transactions; and how many commit records there are."""
        import psycopg

        oid = self._one("SELECT oid FROM pg_database WHERE datname = %s", (self.database,))[0]
        with psycopg.connect(self.target, autocommit=True) as conn:
            row = conn.execute(
                """
                WITH r AS (
                    SELECT xid, resource_manager, record_type,
                        (pg_wal_lsn_diff(end_lsn, start_lsn)::bigint + 7) / 8 * 8 AS bytes,
                        coalesce(block_ref ~ %(rel)s, false) AS ours
                    FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
                ), x AS (SELECT DISTINCT xid FROM r WHERE ours AND xid <> '0')
                SELECT coalesce(sum(bytes) FILTER (WHERE ours OR xid IN (SELECT xid FROM x)), 0),
                    count(*) FILTER (WHERE resource_manager = 'Transaction'
                        AND record_type = 'COMMIT' AND xid IN (SELECT xid FROM x))
                FROM r
                """,
                {"rel": f"rel [0-9]+/{oid}/", "start": start, "end": end},
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def footprint(self) -> tuple[int, int, int, int]:
        """The jobs table's row updates and HOT updates so far, and its bytes on disk:
        the heap (and TOAST), and its indexes."""
        import psycopg

        with psycopg.connect(self.target, autocommit=True) as conn:
            row = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd, pg_table_size(relid), pg_indexes_size(relid) "
                "FROM pg_stat_user_tables WHERE relname = 'sqlqueue_jobs'"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2]), int(row[3])


class MariaDBServer:
    store = "MariaDB"
    backend = "mysql"
    log_name = "redo"
    new_from_zero = False
    settle = 0.0
    SETTINGS = (
        "innodb_flush_log_at_trx_commit",
        "sync_binlog",
        "log_bin",
        "innodb_buffer_pool_size",
        "innodb_log_file_size",
        "thread_handling",
        "max_connections",
    )

    def __init__(self, admin_url: str) -> None:
        self.conn = mysql_connect(admin_url, autocommit=True, connect_timeout=5)
        self.database = ""
        self.target = ""
        self.version = ""

    def close(self) -> None:
        self.conn.close()

    def _rows(self, sql: str, *params: Any) -> list[Any]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params or None)
            return list(cur.fetchall())

    def settings(self) -> str:
        row = self._rows("SELECT " + ", ".join(f"@@{name}" for name in self.SETTINGS))[0]
        return ", ".join(f"{name}={value}" for name, value in zip(self.SETTINGS, row, strict=True))

    @contextlib.contextmanager
    def attached(self, target: str) -> Iterator[None]:
        """Read the database at ``target`` meanwhile."""
        self.target = target
        self.database = urlsplit(target).path.lstrip("/")
        yield

    def connections(self) -> set[int]:
        rows = self._rows(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s", self.database
        )
        return {int(connection) for (connection,) in rows}

    def read(self, exclude: set[int], count: int) -> Reading:
        at = time.monotonic()
        clients, own = set(), set()
        for connection, db, tid in self._rows(
            "SELECT ID, DB, TID FROM information_schema.PROCESSLIST"
        ):
            clients.add(int(tid))
            if db == self.database and connection not in exclude:
                own.add(int(tid))
        status = dict(
            self._rows(
                "SHOW GLOBAL STATUS WHERE Variable_name IN "
                "('Innodb_os_log_written', 'Com_commit', 'Com_rollback')"
            )
        )
        cpu = {}
        for pid in pids_named(("mariadbd", "mysqld")):
            for tid in os.listdir(f"/proc/{pid}/task"):
                if (seconds := stat_cpu(f"/proc/{pid}/task/{tid}/stat")) is not None:
                    cpu[int(tid)] = seconds
        return Reading(
            at,
            count,
            cpu,
            own,
            set(cpu) - clients,
            int(status["Innodb_os_log_written"]),
            "",
            int(status["Com_commit"]),
            int(status["Com_rollback"]),
            int(status["Com_commit"]),
        )

    def attributed(self, start: str, end: str) -> None:
        return None  # InnoDB's redo names no database

    def footprint(self) -> tuple[None, None, int, int]:
        """No row counts (InnoDB's are server-wide); the jobs table's data and index bytes,
        InnoDB's estimates once analyzed."""
        self._rows(f"ANALYZE TABLE `{self.database}`.sqlqueue_jobs")
        data, index = self._rows(
            "SELECT data_length, index_length FROM information_schema.TABLES "
            "WHERE table_schema = %s AND table_name = 'sqlqueue_jobs'",
            self.database,
        )[0]
        return None, None, int(data), int(index)


Server = PostgresServer | MariaDBServer


@dataclass
class Window:
    """The harness's drain watch: a reading once every worker has started and a job has
    finished (or at the first finished job, if the queue empties before every worker
    started), and one at the end."""

    server: Server
    exclude: set[int]
    first: Reading | None = None
    fallback: Reading | None = None
    #: The first poll's reading, before any job may have finished: the window's last
    #: resort when every job finished before the first reading after one did.
    start: Reading | None = None
    last: Reading | None = None
    started: set[int] = field(default_factory=set)

    def _read(self, count: int, workers: Workers) -> Reading:
        reading = self.server.read(self.exclude, count)
        reading.workers = workers.cpu_seconds()
        reading.load = os.getloadavg()[0]
        return reading

    def _all_started(self, workers: Workers) -> bool:
        for index in range(workers.count):
            if index not in self.started:
                path = workers.log_dir / f"worker-{index}.log"
                with contextlib.suppress(OSError):
                    if STARTED in path.read_text(errors="replace"):
                        self.started.add(index)
        return len(self.started) == workers.count

    def poll(self, count: int, workers: Workers) -> None:
        if self.start is None:
            self.start = self._read(count, workers)
        if self.first is not None or count == 0:
            return
        if self._all_started(workers):
            self.first = self._read(count, workers)
        elif self.fallback is None:
            self.fallback = self._read(count, workers)

    def done(self, count: int, workers: Workers) -> None:
        self.last = self._read(count, workers)

    def span(self, jobs: int) -> tuple[Reading, Reading, bool]:
        """The readings the figures are read between, and whether start-up is in."""
        first, last = self.first or self.fallback, self.last
        startup = self.first is None
        span = 0 if first is None or last is None else last.count - first.count
        if last is not None and span < jobs // 10:
            # Every job, or all but a few, finished before the window opened (a loaded
            # machine's slow polls, a late worker): CPU counted in clock ticks reads 0
            # over so few jobs. The window opens at the first finished job, or at the
            # drain's first reading, instead: start-up included.
            for wider in (self.fallback, self.start):
                if wider is not None and last.count - wider.count > span:
                    first, startup = wider, True
                    break
        if first is None or last is None or last.count <= first.count:
            raise BenchError("too few jobs finished between the readings to measure")
        return first, last, startup


def wait_gone(server: Server, keep: set[int], timeout: float = 10.0) -> None:
    """Wait until no connection to the database is left but those in ``keep``."""
    deadline = time.monotonic() + timeout
    while left := server.connections() - keep:
        if time.monotonic() > deadline:
            raise BenchError(f"connections {sorted(left)} still open {timeout:g} s after the drain")
        time.sleep(0.02)


@dataclass
class Run:
    """One drain's figures, by metric name."""

    values: dict[str, float]
    startup_in_window: bool


def measure(
    system: CountedSystem,
    server: Server,
    processes: int,
    sizes: harness.Sizes,
    concurrency: int,
    quiet: float,
    log_dir: Path,
    lifecycle: bool,
) -> Run:
    """One fresh database, filled, drained by ``processes`` workers, read all along;
    with ``lifecycle``, what the fill, the workers' pruning, a VACUUM (PostgreSQL) and
    enqueues of one commit each cost it too."""
    setting = Setting(matched=True, concurrency=concurrency)
    with system.fresh(setting), server.attached(system.target):
        filling = server.read(set(), 0)
        harness.fill(system, sizes.jobs, bulk=True)
        filled = server.read(set(), 0)
        exclude = server.connections()  # the harness's own: the filling app, the counter
        before_quiet = server.read(exclude, 0)
        # The other sessions' rates; and time for the fill's statistics to be reported.
        time.sleep(max(quiet, server.settle))
        before = server.read(exclude, 0)
        # The other sessions' rate of WAL or redo, while nothing of ours ran.
        others = (before.log - before_quiet.log) / (before.at - before_quiet.at)
        counts_before = system.counts
        window = Window(server, exclude)
        scratch = harness.Results()
        harness.drain(system, processes, sizes, scratch, log_dir, watch=window)
        finished = system.finished()
        close_counters()  # a backend reports its last transactions as it exits
        wait_gone(server, exclude)
        after = server.read(exclude, finished)
        counts = system.counts - counts_before
        first, last, startup = window.span(sizes.jobs)
        values = _drain_figures(server, before_quiet, before, first, last, after, counts)
        values["worker_cpu"] = (last.workers - first.workers) * 1e3 / (last.count - first.count)
        rate = scratch.median(system.name, f"steady{processes}", setting)
        values["rate"] = NAN if rate is None else rate
        updates, hot, table_bytes, index_bytes = server.footprint()
        values |= {
            "updates": NAN if updates is None else updates / finished,
            "hot": NAN if hot is None else hot / finished,
            "table_bytes": table_bytes / sizes.jobs,
            "index_bytes": index_bytes / sizes.jobs,
        }
        if lifecycle:
            values |= _phase(server, "fill", filling, filled, sizes.jobs, others)
            values |= _lifecycle(system, server, finished, max(1, sizes.jobs // 20), others)
    return Run(values, startup_in_window=startup)


def _drain_figures(
    server: Server,
    before_quiet: Reading,
    before: Reading,
    first: Reading,
    last: Reading,
    after: Reading,
    counts: int,
) -> dict[str, float]:
    """The drain's figures: over the window (``first`` to ``last``), and its commits
    over the whole run (``before`` to ``after``, less ``counts`` of the harness's own)."""
    jobs, seconds = last.count - first.count, last.at - first.at
    quiet_seconds = before.at - before_quiet.at
    other_log_rate = (before.log - before_quiet.log) / quiet_seconds
    other_commit_rate = (before.others - before_quiet.others) / quiet_seconds
    commits = after.commits - before.commits
    server_log = last.log - first.log
    if isinstance(server, PostgresServer):
        log_bytes, writing = server.attributed(first.lsn, last.lsn)
        commits -= counts  # each count of the harness is a transaction of the database
        writing_per_job = writing / jobs
        rollbacks = (after.rollbacks - before.rollbacks) / after.count
    else:
        log_bytes = round(server_log - other_log_rate * seconds)
        commits = round(commits - other_commit_rate * (after.at - before.at))
        # MariaDB's Com_rollback is server-wide, and mostly the other sessions' here.
        writing_per_job = rollbacks = NAN
    return {
        "steady": jobs / seconds,
        "own_cpu": _cpu_spent(first, last, last.own, server.new_from_zero) * 1e6 / jobs,
        "background_cpu": (
            _cpu_spent(first, last, last.background, server.new_from_zero) * 1e6 / jobs
        ),
        "log": log_bytes / jobs,
        "server_log": server_log / jobs,
        "commits": commits / after.count,
        "writing": writing_per_job,
        "rollbacks": rollbacks,
        "load": last.load,
        "other_log_rate": other_log_rate,
        "other_commit_rate": other_commit_rate,
        "window_jobs": jobs,
    }


def _phase(
    server: Server, name: str, a: Reading, b: Reading, jobs: int, others: float
) -> dict[str, float]:
    """What the database's connections spent between two readings, per job: CPU (ms per
    1,000 jobs) and WAL (attributed) or redo (less the other sessions' rate) bytes."""
    cpu = _cpu_spent(a, b, b.own, server.new_from_zero)
    if isinstance(server, PostgresServer):
        log = server.attributed(a.lsn, b.lsn)[0]
    else:
        log = round(b.log - a.log - others * (b.at - a.at))
    return {f"{name}_cpu": cpu * 1e6 / jobs, f"{name}_log": log / jobs}


def _lifecycle(
    system: CountedSystem, server: Server, finished: int, enqueues: int, others: float
) -> dict[str, float]:
    """After the drain: the workers' pruning of every finished job, a VACUUM of the
    table on PostgreSQL (autovacuum's work), then ``enqueues`` of one commit each."""
    a = server.read(set(), 0)
    pruned = system.prune_all()
    b = server.read(set(), 0)
    if pruned != finished:
        raise BenchError(f"pruning deleted {pruned} jobs of {finished} finished")
    values = _phase(server, "prune", a, b, finished, others)
    values["vacuum_cpu"] = values["vacuum_log"] = NAN
    if isinstance(server, PostgresServer):
        import psycopg

        with psycopg.connect(server.target, autocommit=True) as conn:
            a = server.read(set(), 0)
            conn.execute("VACUUM sqlqueue_jobs")
            b = server.read(set(), 0)
        values |= _phase(server, "vacuum", a, b, finished, others)
    a = server.read(set(), 0)
    system.enqueue_each(enqueues)
    b = server.read(set(), 0)
    return values | _phase(server, "enqueue", a, b, enqueues, others)


def record(
    table: Table,
    system: CountedSystem,
    server: Server,
    processes: int,
    sizes: harness.Sizes,
    args: argparse.Namespace,
    log_dir: Path,
) -> None:
    lifecycle = processes == args.processes[0]  # once per server and run
    run = measure(
        system, server, processes, sizes, args.concurrency, args.quiet, log_dir, lifecycle
    )
    table.runs.setdefault((server.store, processes), []).append(run)


# -- the report ----------------------------------------------------------------------------


@dataclass
class Table:
    """Every run's figures, by (store, processes); medians in the report."""

    runs: dict[tuple[str, int], list[Run]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def median(self, store: str, processes: int, metric: str) -> float | None:
        if metric in ("life_cpu", "life_log"):  # a sum of medians
            parts = ["enqueue", "drain", "prune", "vacuum"]
            kind = metric.removeprefix("life_")
            drain = "own_cpu" if kind == "cpu" else "log"
            found_parts = [
                self.median(store, processes, drain if part == "drain" else f"{part}_{kind}")
                for part in parts
            ]
            return sum(part for part in found_parts if part is not None) or None
        found = [
            value
            for run in self.runs.get((store, processes), [])
            if (value := run.values.get(metric, NAN)) == value  # not NaN
        ]
        return statistics.median(found) if found else None

    def cell(self, store: str, processes: int, metric: str) -> str:
        return _fmt(self.median(store, processes, metric), METRICS[metric][1])

    def startup(self, store: str, processes: int) -> bool:
        return any(run.startup_in_window for run in self.runs.get((store, processes), []))


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def projection(table: Table, store: str, processes: int) -> float | None:
    """Jobs per second one core of the database would sustain at the measured CPU per
    job (its connections and its background work): 1,000,000 ÷ ms per 1,000 jobs."""
    own = table.median(store, processes, "own_cpu")
    background = table.median(store, processes, "background_cpu")
    if not own:
        return None
    return 1e6 / (own + (background or 0.0))


def store_table(table: Table, server: Server, processes: list[int]) -> list[str]:
    store = server.store
    headings = [METRICS[metric][0] for metric in ("rate", "steady", *STORE_COLUMNS)]
    headings = [h.replace("WAL or redo", server.log_name) for h in headings]
    headings = ["worker processes", *headings, "projection: jobs/s per DB core"]
    out = [f"### {store}", "", "| " + " | ".join(headings) + " |"]
    out.append("|" + "---:|" * len(headings))
    for count in processes:
        steady = table.cell(store, count, "steady")
        if steady != "—" and table.startup(store, count):
            steady += " †"
        cells = [
            str(count),
            table.cell(store, count, "rate"),
            steady,
            *(table.cell(store, count, metric) for metric in STORE_COLUMNS),
            _fmt(projection(table, store, count)),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return [*out, ""]


#: Every figure a table shows: its column heading in the tables below the stores', and
#: its decimals.
METRICS = {
    "rate": ("jobs/s from the first job", 0),
    "steady": ("jobs/s, every worker started", 0),
    "own_cpu": ("DB CPU, its connections (ms / 1,000 jobs)", 0),
    "background_cpu": ("DB CPU, background (ms / 1,000 jobs)", 0),
    "log": ("WAL or redo bytes / job", 0),
    "commits": ("commits / job", 3),
    "writing": ("of them writing", 3),
    "worker_cpu": ("worker CPU (ms / job)", 3),
    "load": ("load average (1 min) at the end", 2),
    "updates": ("row updates / job", 2),
    "hot": ("of them HOT", 2),
    "table_bytes": ("table bytes / job", 0),
    "index_bytes": ("index bytes / job", 0),
    "server_log": ("server-wide WAL or redo bytes / job", 0),
    "other_log_rate": ("others' WAL or redo bytes/s before", 0),
    "other_commit_rate": ("others' commits/s before", 1),
    "rollbacks": ("rollbacks / job", 3),
    "window_jobs": ("jobs in the window", 0),
    "enqueue_cpu": ("enqueue, one commit each: DB CPU (ms / 1,000 jobs)", 0),
    "enqueue_log": ("WAL or redo bytes / job", 0),
    "fill_cpu": ("bulk enqueue: DB CPU", 0),
    "fill_log": ("WAL or redo bytes / job", 0),
    "prune_cpu": ("pruning: DB CPU", 0),
    "prune_log": ("WAL or redo bytes / job", 0),
    "vacuum_cpu": ("VACUUM: DB CPU", 0),
    "vacuum_log": ("WAL bytes / job", 0),
    "life_cpu": ("a job's life: DB CPU", 0),
    "life_log": ("WAL or redo bytes / job", 0),
}
#: The figures of a store's table after the rates.
STORE_COLUMNS = ("own_cpu", "background_cpu", "log", "commits", "writing", "worker_cpu", "load")


@dataclass(frozen=True)
class Section:
    """A table with a row per store and process count."""

    title: str
    note: str
    columns: tuple[str, ...]  # metrics
    first_only: bool = False  # measured at the first process count only

    def lines(self, table: Table, servers: list[Server], processes: list[int]) -> list[str]:
        headings = ["store", "worker processes", *(METRICS[m][0] for m in self.columns)]
        out = [f"### {self.title}", "", self.note, "", "| " + " | ".join(headings) + " |"]
        out.append("|---|" + "---:|" * (len(headings) - 1))
        for server in servers:
            for count in processes[:1] if self.first_only else processes:
                cells = [table.cell(server.store, count, metric) for metric in self.columns]
                out.append(f"| {server.store} | {count} | " + " | ".join(cells) + " |")
        return [*out, ""]


LIFE = Section(
    "A job's life: enqueue, prune, vacuum",
    "Measured once per server and run, on the database of the first process count: the "
    "bulk enqueue that filled it; after the drain, the workers' pruning of every job "
    "(`retention.prune_jobs_batch`, batches of 500 ids, each its own transaction), then "
    "on PostgreSQL a `VACUUM sqlqueue_jobs`, the work autovacuum does in the background "
    "(see the settings above), then enqueues of one commit each (`write.enqueue(i=..., "
    "email=...)` in an app context of its own, a twentieth of `--jobs`). DB CPU: every "
    "connection to the benchmark's database, in ms per 1,000 jobs; WAL attributed as above, "
    "redo less the other sessions' rate. *A job's life*: the sum of the medians of a "
    "one-commit enqueue, the drain at that process count (its connections), the pruning "
    "and the VACUUM.",
    (
        "enqueue_cpu",
        "enqueue_log",
        "fill_cpu",
        "fill_log",
        "prune_cpu",
        "prune_log",
        "vacuum_cpu",
        "vacuum_log",
        "life_cpu",
        "life_log",
    ),
    first_only=True,
)
ROWS = Section(
    "Rows and space",
    "After each drain: the jobs table's row updates per job finished, and the HOT ones "
    "among them (PostgreSQL's `pg_stat_user_tables`; every job was inserted once before), "
    "and its size on disk per job: PostgreSQL's heap and its indexes as they are "
    "(nothing vacuumed: the dead versions of each row are in), InnoDB's estimates of "
    "its clustered index and its secondary indexes after `ANALYZE TABLE`.",
    ("updates", "hot", "table_bytes", "index_bytes"),
)
CONTEXT = Section(
    "What else the servers did meanwhile",
    "Server-wide figures, the other sessions on the server included: the WAL or redo "
    "written over the same window, per job of ours; the other sessions' rates in the "
    "quiet seconds before the workers started (subtracted from MariaDB's redo and "
    "commits above; PostgreSQL's figures above are the database's own); on PostgreSQL, "
    "the database's rollbacks per job (a connection handed back to its pool is rolled "
    "back).",
    ("server_log", "other_log_rate", "other_commit_rate", "rollbacks", "window_jobs"),
)


def report(
    table: Table,
    servers: list[Server],
    args: argparse.Namespace,
    header: list[str],
) -> str:
    out = [*header, ""]
    out += [
        "Each row: a fresh database, "
        f"{args.jobs:,} jobs of the peers benchmark's `write` task (one line appended to a "
        "file) in one bulk enqueue, then "
        f"`python -m flask queue work --concurrency {args.concurrency}` in that many "
        "processes until the queue is empty; "
        f"medians of {args.runs} run(s). *jobs/s from the first job* is the peers "
        "benchmark's steady drain rate (its window opens while later workers may still be "
        "starting); every other figure is read over the window from the first count after "
        "every worker logged its start to the last count (`†`: fewer than a tenth of the "
        "jobs were left once every worker had started, too few for CPU counted in clock "
        "ticks, so the window opens at the first finished job, or at the drain's first "
        "reading if every job finished before the next, and includes start-up).",
        "",
        "- *DB CPU, its connections*: user + system CPU of the server processes "
        "(PostgreSQL backends) or threads (MariaDB, `PROCESSLIST.TID`) serving the workers' "
        "connections to the benchmark's database, found by name in /proc; the harness's "
        "own connections are left out. *background*: the server's processes or threads "
        "that serve no connection (PostgreSQL's WAL writer, checkpointer...; InnoDB's "
        "own threads), which also serve every other database of the server.",
        "- *WAL bytes / job* (PostgreSQL): the WAL records `pg_walinspect` attributes to the "
        "benchmark's database (block references, and its transactions' commit records). "
        "*redo bytes / job* (MariaDB): `Innodb_os_log_written`, server-wide, less the other "
        "sessions' rate measured just before.",
        "- *commits / job*: over the whole run, every worker's start and stop included, per "
        "job finished. PostgreSQL: `xact_commit` of the database, less the harness's own "
        "counting queries. MariaDB: `Com_commit` (COMMIT statements, server-wide), less the "
        "other sessions' rate measured just before. Both count every transaction the queue "
        "commits, read-only ones included. *of them writing* (PostgreSQL): commit records "
        "in the WAL, i.e. transactions that wrote, over the window.",
        "- *worker CPU*: user + system CPU of the worker processes over the window.",
        "- *projection: jobs/s per DB core* = 1,000,000 ÷ (connections + background ms per "
        "1,000 jobs): a **projection** from the measured CPU per job, not a measurement; "
        "it assumes the server's CPU is the limit and that the cost per job stays as "
        "measured (no disk, lock or connection limit on the way).",
        "",
    ]
    for server in servers:
        out += store_table(table, server, args.processes)
    out += LIFE.lines(table, servers, args.processes)
    out += ROWS.lines(table, servers, args.processes)
    out += CONTEXT.lines(table, servers, args.processes)
    out += ["### Errors", "", *(table.errors or ["none"]), ""]
    return "\n".join(out)


# -- the command ---------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__)
    parser.add_argument(
        "--postgres", default=DEFAULT_POSTGRES, help="a PostgreSQL admin URL (a superuser's)"
    )
    parser.add_argument("--mysql", default=DEFAULT_MYSQL, help="a MariaDB admin URL")
    parser.add_argument("--only", choices=["postgres", "mysql"], help="one server only")
    parser.add_argument(
        "--processes",
        type=concurrency_list,
        default=[1, 2, 4, 8],
        help="worker processes, a comma list (1,2,4,8)",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (20000)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="each worker's --concurrency (4)"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs; the tables show medians")
    parser.add_argument(
        "--quiet",
        type=float,
        default=2.0,
        help="seconds the other sessions' rates are measured for before each drain (2)",
    )
    parser.add_argument(
        "--drain-cap", type=float, default=120.0, help="seconds a drain may take (120)"
    )
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    for key in ("jobs", "concurrency", "runs"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be at least 1")
    if args.quiet <= 0:
        parser.error("--quiet must be more than 0")
    args.postgres = libpq(args.postgres)
    return args


def libpq(url: str) -> str:
    """A PostgreSQL URL as libpq takes it: SQLAlchemy's ``postgresql+psycopg://…`` (the
    test suite's form) becomes ``postgresql://…``."""
    scheme, sep, rest = url.partition("://")
    return scheme.split("+", 1)[0] + sep + rest


@contextlib.contextmanager
def servers_of(args: argparse.Namespace, skipped: list[str]) -> Iterator[list[Server]]:
    """A reading connection to each server asked for and reachable."""
    wanted: list[tuple[str, str, Callable[[str], Server], Callable[[str], str]]] = [
        ("postgres", args.postgres, PostgresServer, postgres_version),
        ("mysql", args.mysql, MariaDBServer, mysql_version),
    ]
    found: list[Server] = []
    try:
        for backend, url, make, read_version in wanted:
            if args.only and args.only != backend:
                continue
            name = "PostgreSQL" if backend == "postgres" else "MariaDB"
            version, problem = server_version(name, url, read_version)
            if problem:
                skipped.append(problem)
                print(f"skipping {name}: {problem}", file=sys.stderr)
                continue
            found.append(make(url))
            found[-1].version = version
        yield found
    finally:
        for server in found:
            server.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.monotonic()
    skipped: list[str] = []
    table = Table()
    with temp_dir("sqlqueue-scaling-") as folder, servers_of(args, skipped) as servers:
        ctx = Context(folder, args.postgres, args.mysql, None)
        versions = {s.backend: s.version for s in servers}
        header = [
            "## flask_sqlqueue against worker processes: PostgreSQL and MariaDB",
            "",
            "`python -m benchmarks.scaling " + shlex.join(argv) + "`",
            "",
            *common.machine(versions.get("postgres", "not run"), versions.get("mysql", "not run")),
            common.compile_checkout(),
            *(f"- {s.store} settings: {s.settings()}" for s in servers),
        ]
        sizes = harness.Sizes(jobs=args.jobs, samples=0, drain_cap=args.drain_cap)
        for run in range(1, args.runs + 1):
            for server in servers:
                system = CountedSystem(ctx, server.backend)
                for processes in args.processes:
                    log_dir = folder / f"logs-{server.backend}-{processes}-{run}"
                    log_dir.mkdir()
                    error = common.step(
                        f"run {run} {server.store:10} {processes} processes",
                        partial(record, table, system, server, processes, sizes, args, log_dir),
                    )
                    if error is not None:
                        table.errors.append(
                            f"- {server.store}, {processes} processes, run {run}: {error}"
                        )
        header.append(common.closing_line(started))
        if skipped:
            header += ["", "Skipped: " + "; ".join(skipped)]
        text = report(table, servers, args, header)
    common.publish(text, args.output)
    return 1 if table.errors else 0


if __name__ == "__main__":
    sys.exit(main())

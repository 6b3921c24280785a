"""Cost that does not grow with history: enqueue and drain rates with millions of
finished jobs in the tables, against the same rates on empty tables, in one run.

    python -m benchmarks.history [--history 5000000] [--prune 1000000] [--jobs 10000]
                                 [--enqueues 3000]
                                 [--only sqlite,postgresql,mariadb] [--runs 2]
                                 [--postgres URL] [--mysql URL] [--output FILE]

For each backend, a fresh database (SQLite: a file in a temporary folder). First on
empty tables, then after ``--history`` completed jobs are written in one ``INSERT …
SELECT`` inside the database (ids in the order they finished, over the last 6.9 days,
within the default ``SQLQUEUE_KEEP_COMPLETED`` of 7 days, so no worker prunes them
meanwhile), the same measurements again:

- *enqueue*: ``--enqueues`` calls of ``write.enqueue(i=..., email=...)``, each in an app
  context of its own and its own transaction, as a web request makes them; jobs/s.
- *drain*: ``--jobs`` jobs written with ``enqueue_many``, then ``flask queue work --burst``
  at its defaults (the benchmark's peer app, ``benchmarks/peers/app_sqlqueue.py``, the job
  ``write(i, email)`` appending a line to a file); *from spawn*: jobs ÷ the worker
  process's wall time, start-up and exit included; *steady*: jobs ÷ (the last job's
  ``finished_at`` - the first one's ``started_at``). Every job must be completed once.

Then *pruning*: the oldest ``--prune`` of those jobs are made 8 days old (past the
retention), and a process runs the workers' own retention rounds (``Worker.prune()``:
at most 20 batches of 500 rows, each a short transaction of its own) while drains of
``--jobs`` jobs run one after another beside it (at most 5), twice: first *at the
workers' pace*, a round and then a heartbeat interval while more is due, as a worker's
upkeep runs them (stopped after the drains, whatever is left), then *back to back*
until none of ``--prune`` freshly aged jobs is left. The figures are those drains'
median ÷ the drain with history (target ≥ 0.9: pruning does not block the workers)
and the rows pruned per second.

On PostgreSQL the fill is followed by ``VACUUM ANALYZE`` of the jobs table, what
autovacuum does to a table of that age (the figures name the server's ``autovacuum``
setting); SQLite is left as the queue leaves it (nothing runs ``ANALYZE`` there).
Each state's figure is the median of ``--runs`` runs; the ratio is history ÷ empty, and
the target (issue 24) is at least 0.9 for each.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from benchmarks.peers import common
from benchmarks.peers import workload
from benchmarks.peers.__main__ import mysql_version
from benchmarks.peers.__main__ import postgres_version

TARGET = 0.9
#: How the expired jobs are pruned beside the drains, as the table names it.
_PACES = {"paced": "at the workers' pace", "back-to-back": "back to back"}
#: Seconds the history spans, newest now: inside the default 7 days of retention.
SPAN = 6.9 * 86400

_HISTORY_COLUMNS = (
    "queue, task, payload, status, attempts, max_attempts, rescues, releases, priority, "
    "run_at, created_at, updated_at, started_at, finished_at, worker_id, snoozes, "
    "has_dependents"
)

# Each row: job i of n finished (n - i) * SPAN / n seconds ago, payload like the drain's.
_FILL = {
    "sqlite": (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count) "
        f"INSERT INTO sqlqueue_jobs ({_HISTORY_COLUMNS}) "
        "SELECT 'default', 'bench.write', "
        '\'{"args":[],"kwargs":{"i":\' || i || \',"email":"user\' || i || \'@example.com"}}\', '
        "'completed', 1, 3, 0, 0, 0, t, t, t, t, t, 'history', 0, 0 FROM "
        "(SELECT i, strftime('%Y-%m-%d %H:%M:%S', 'now', "
        "'-' || CAST((:count - i) * :span / :count AS INTEGER) || ' seconds') || '.000000' AS t "
        "FROM n)"
    ),
    "postgresql": (
        f"INSERT INTO sqlqueue_jobs ({_HISTORY_COLUMNS}) "
        "SELECT 'default', 'bench.write', "
        '\'{"args":[],"kwargs":{"i":\' || i || \',"email":"user\' || i || \'@example.com"}}\', '
        "'completed', 1, 3, 0, 0, 0, t, t, t, t, t, 'history', 0, false FROM "
        "(SELECT i, now() - ((:count - i) * :span / :count) * interval '1 second' AS t "
        "FROM generate_series(1, :count) AS i) AS s"
    ),
    "mysql": (
        f"INSERT INTO sqlqueue_jobs ({_HISTORY_COLUMNS}) "
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :count) "
        "SELECT 'default', 'bench.write', "
        'CONCAT(\'{"args":[],"kwargs":{"i":\', i, \',"email":"user\', i, \'@example.com"}}\'), '
        "'completed', 1, 3, 0, 0, 0, t, t, t, t, t, 'history', 0, 0 FROM "
        "(SELECT i, UTC_TIMESTAMP(6) - INTERVAL FLOOR((:count - i) * :span / :count) SECOND AS t "
        "FROM n) AS s"
    ),
}


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.history", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--prune", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--enqueues", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--only", default="sqlite,postgresql")
    parser.add_argument("--postgres", default=common.DEFAULT_POSTGRES)
    parser.add_argument("--mysql", default=common.DEFAULT_MYSQL)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    for name in ("history", "prune", "jobs", "enqueues", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.prune > args.history:
        parser.error("--prune cannot be more than --history")
    args.only = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = set(args.only) - {"sqlite", "postgresql", "mariadb"}
    if unknown:
        parser.error(f"--only: unknown backend(s) {', '.join(sorted(unknown))}")
    return args


@contextlib.contextmanager
def database(backend: str, args: argparse.Namespace, folder: Path) -> Iterator[str]:
    """A fresh database for ``backend``, as a SQLAlchemy URL."""
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'history.db'}"
    elif backend == "postgresql":
        with common.postgres_database(args.postgres, "history") as url:
            yield url.replace("postgresql://", "postgresql+psycopg://", 1)
    else:
        with common.mysql_database(args.mysql, "history") as url:
            yield url


def enqueue_rate(url: str, count: int, start: int) -> float:
    """One-commit enqueues per second, each in an app context of its own."""
    from benchmarks.peers import app_sqlqueue

    app = app_sqlqueue.create_app(url)
    store = app.extensions["sqlqueue"].store
    try:
        with app.app_context():
            first = app_sqlqueue.write.enqueue(i=start, email=workload.email_of(start))  # warm
        began = time.perf_counter()
        for i in range(start + 1, start + 1 + count):
            with app.app_context():
                app_sqlqueue.write.enqueue(i=i, email=workload.email_of(i))
        rate = count / (time.perf_counter() - began)
        # Not the drain's: taken out again, so the drain runs exactly its own jobs.
        with store.engine.begin() as conn:
            gone = conn.execute(
                sa.text("DELETE FROM sqlqueue_jobs WHERE id >= :first"), {"first": first.id}
            ).rowcount
        if gone != count + 1:
            raise common.BenchError(f"{gone} of the {count + 1} jobs enqueued were found")
        return rate
    finally:
        store.engine.dispose()


def drain_rates(url: str, jobs: int, folder: Path) -> tuple[float, float]:
    """``jobs`` jobs drained by ``flask queue work --burst``: (from spawn, steady) jobs/s."""
    from benchmarks.peers import app_sqlqueue
    from flask_sqlqueue import Call

    app = app_sqlqueue.create_app(url)
    store = app.extensions["sqlqueue"].store
    try:
        with store.engine.connect() as conn:
            floor = conn.execute(sa.text("SELECT coalesce(max(id), 0) FROM sqlqueue_jobs")).scalar()
        with app.app_context():
            for start in range(0, jobs, 5_000):
                calls = [
                    Call(kwargs={"i": i, "email": workload.email_of(i)})
                    for i in range(start, min(jobs, start + 5_000))
                ]
                app_sqlqueue.write.enqueue_many(calls)
    finally:
        store.engine.dispose()
    output = folder / f"drain-{time.monotonic_ns()}.out"
    output.touch()
    env = common.base_env(
        FLASK_APP="benchmarks.peers.app_sqlqueue:create_app",
        BENCH_DATABASE_URI=url,
        **{workload.OUTPUT: str(output)},
    )
    log = folder / "worker.log"
    with open(log, "ab") as sink:
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "flask", "queue", "work", "--burst"],
            env=env,
            cwd=common.ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
        wall = time.perf_counter() - began
    if done.returncode != 0:
        raise common.BenchError(f"the worker exited with {done.returncode}: see {log}")
    lines = output.read_text().splitlines()
    if len(lines) != jobs or len(set(lines)) != jobs:
        raise common.BenchError(f"{len(lines)} lines ({len(set(lines))} distinct) for {jobs} jobs")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            completed, first, last = conn.execute(
                sa.text(
                    "SELECT count(*), min(started_at), max(finished_at) FROM sqlqueue_jobs "
                    "WHERE id > :floor AND status = 'completed'"
                ),
                {"floor": floor},
            ).one()
    finally:
        engine.dispose()
    if completed != jobs:
        raise common.BenchError(f"{completed} of {jobs} jobs completed")
    if isinstance(first, str):  # SQLite keeps times as text
        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    return jobs / wall, jobs / (last - first).total_seconds()


def fill_history(url: str, backend: str, count: int) -> tuple[float, str]:
    """Write ``count`` completed jobs; returns the seconds it took and what ran after."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    kind = "mysql" if backend == "mariadb" else backend
    after = "nothing"
    try:
        began = time.perf_counter()
        with engine.begin() as conn:
            if kind == "mysql":
                conn.exec_driver_sql(f"SET SESSION max_recursive_iterations = {count + 1}")
            conn.execute(sa.text(_FILL[kind]), {"count": count, "span": SPAN})
        took = time.perf_counter() - began
        if kind == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE sqlqueue_jobs")
                setting = conn.exec_driver_sql("SHOW autovacuum").scalar()
            after = f"`VACUUM ANALYZE sqlqueue_jobs` (the server's autovacuum: {setting})"
        elif kind == "mysql":
            with engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE TABLE sqlqueue_jobs")
            after = "`ANALYZE TABLE sqlqueue_jobs`, as InnoDB's statistics update does"
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT count(*) FROM sqlqueue_jobs")).scalar()
        if rows is None or rows < count:
            raise common.BenchError(f"the fill wrote {rows} rows of {count}")
        return took, after
    finally:
        engine.dispose()


_AGE = {
    "sqlite": (
        "UPDATE sqlqueue_jobs SET finished_at = strftime('%Y-%m-%d %H:%M:%S', finished_at, "
        "'-8 days') || '.000000', updated_at = finished_at WHERE id BETWEEN :low AND :high"
    ),
    "postgresql": (
        "UPDATE sqlqueue_jobs SET finished_at = finished_at - interval '8 days', "
        "updated_at = finished_at - interval '8 days' WHERE id BETWEEN :low AND :high"
    ),
    "mysql": (
        "UPDATE sqlqueue_jobs SET finished_at = finished_at - INTERVAL 8 DAY, "
        "updated_at = finished_at WHERE id BETWEEN :low AND :high"
    ),
}

# The workers' own retention rounds until one finds nothing to prune: back to back, or
# ("paced") as a worker's upkeep runs them, a heartbeat interval apart while more is due,
# until SIGTERM. Prints the rows pruned and the seconds it took.
_PRUNER = """
import random, signal, sys, threading, time
from benchmarks.peers import app_sqlqueue
app = app_sqlqueue.create_app()
worker = app_sqlqueue.queue.worker(None, app)
paced = sys.argv[1] == "paced"
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
began, total = time.perf_counter(), 0
while not stop.is_set():
    pruned = worker.prune()
    total += pruned.total
    if not pruned.more:
        break
    if paced:
        stop.wait(worker.options.heartbeat_interval * random.uniform(0.9, 1.1))
print(total, time.perf_counter() - began)
"""


def pruning(
    url: str, backend: str, args: argparse.Namespace, folder: Path, *, paced: bool
) -> dict[str, float]:
    """Drains while ``args.prune`` expired jobs are pruned beside them (see the module's
    docs): the drains' median rates, and the rows pruned per second. ``paced``: at the
    workers' own pace, stopped after the drains (the rows need not all be pruned)."""
    kind = "mysql" if backend == "mariadb" else backend
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            low = conn.execute(
                sa.text("SELECT min(id) FROM sqlqueue_jobs WHERE worker_id = 'history'")
            ).scalar_one()
            conn.execute(sa.text(_AGE[kind]), {"low": low, "high": low + args.prune - 1})
        if kind == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE sqlqueue_jobs")
    finally:
        engine.dispose()
    env = common.base_env(FLASK_APP="", BENCH_DATABASE_URI=url)
    pruner = subprocess.Popen(
        [sys.executable, "-c", _PRUNER, "paced" if paced else "back-to-back"],
        env=env,
        cwd=common.ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    spawns: list[float] = []
    steadies: list[float] = []
    try:
        while pruner.poll() is None and len(spawns) < 5:
            spawn, steady = drain_rates(url, args.jobs, folder)
            spawns.append(spawn)
            steadies.append(steady)
        if paced:
            pruner.terminate()
        out, _ = pruner.communicate(timeout=3600)
    finally:
        if pruner.poll() is None:
            pruner.kill()
            pruner.wait()
    if pruner.returncode != 0:
        raise common.BenchError(f"the pruning process exited with {pruner.returncode}")
    total, seconds = out.split()
    # The drains' workers prune too, as every worker does now and then: what counts is
    # that none of the expired jobs is left.
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            left = conn.execute(
                sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE id BETWEEN :low AND :high"),
                {"low": low, "high": low + args.prune - 1},
            ).scalar_one()
    finally:
        engine.dispose()
    if left and not paced:
        raise common.BenchError(f"{left:,} of the {args.prune:,} expired jobs were not pruned")
    if not spawns:
        raise common.BenchError("pruning ended before the first drain began")
    return {
        "drain from spawn": statistics.median(spawns),
        "drain steady": statistics.median(steadies),
        "pruned rows/s": int(total) / float(seconds),
        "drains": len(spawns),
        "pruned": int(total),
    }


def measure(url: str, args: argparse.Namespace, folder: Path, start: int) -> dict[str, float]:
    enqueues, spawns, steadies = [], [], []
    for run in range(args.runs):
        enqueues.append(enqueue_rate(url, args.enqueues, start + run * (args.enqueues + 1)))
        spawn, steady = drain_rates(url, args.jobs, folder)
        spawns.append(spawn)
        steadies.append(steady)
    return {
        "enqueue": statistics.median(enqueues),
        "drain from spawn": statistics.median(spawns),
        "drain steady": statistics.median(steadies),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    header = [
        "# flask_sqlqueue with a long history",
        "",
        "`python -m benchmarks.history " + " ".join(sys.argv[1:] if argv is None else argv) + "`",
        "",
        *common.machine(
            postgres_version(args.postgres) if "postgresql" in args.only else "not run",
            mysql_version(args.mysql) if "mariadb" in args.only else "not run",
        ),
        common.compile_checkout(),
    ]
    table = [
        "| backend | figure | empty tables | with history | history ÷ empty | target |",
        "|---|---|---:|---:|---:|---|",
    ]
    notes: list[str] = []
    errors: list[str] = []
    for backend in args.only:
        with common.temp_dir("sqlqueue-history-") as folder, database(backend, args, folder) as url:
            try:
                from benchmarks.peers import app_sqlqueue

                app = app_sqlqueue.create_app(url)
                app_sqlqueue.queue.upgrade_database(app=app)
                app.extensions["sqlqueue"].store.engine.dispose()
                empty = measure(url, args, folder, 10_000_000)
                took, after = fill_history(url, backend, args.history)
                notes.append(
                    f"- {backend}: {args.history:,} completed jobs written in {took:.0f} s; "
                    f"then {after}"
                )
                full = measure(url, args, folder, 20_000_000)
                pruned = {
                    pace: pruning(url, backend, args, folder, paced=pace == "paced")
                    for pace in ("paced", "back-to-back")
                }
            except common.BenchError as exc:
                errors.append(f"- {backend}: {exc}")
                continue
        for figure, value in empty.items():
            ratio = full[figure] / value
            status = "met" if ratio >= TARGET else "**not met**"
            table.append(
                f"| {backend} | {figure} (jobs/s) | {value:,.0f} | {full[figure]:,.0f} | "
                f"{ratio:.2f}x | ≥ {TARGET}x: {status} |"
            )
        for pace, during in pruned.items():
            for figure in ("drain from spawn", "drain steady"):
                ratio = during[figure] / full[figure]
                status = "met" if ratio >= TARGET else "**not met**"
                table.append(
                    f"| {backend} | {figure} while pruning {_PACES[pace]} (jobs/s) | — | "
                    f"{during[figure]:,.0f} | {ratio:.2f}x of history | ≥ {TARGET}x: {status} |"
                )
        paced, rounds = pruned["paced"], pruned["back-to-back"]
        notes.append(
            f"- {backend}: at the workers' pace (a retention round, then a heartbeat interval "
            f"while more is due), {paced['pruned']:,.0f} of the {args.prune:,} expired jobs "
            f"pruned at {paced['pruned rows/s']:,.0f} rows/s beside {paced['drains']:.0f} "
            f"drain(s); then {rounds['pruned']:,.0f} back to back (the rest and more, aged "
            f"anew), at {rounds['pruned rows/s']:,.0f} rows/s "
            f"(and now and then by the drains' workers), beside {rounds['drains']:.0f} drain(s)"
        )
    header.append(common.closing_line(started))
    text = "\n".join(
        [
            *header,
            "",
            f"{args.jobs:,} jobs per drain, {args.enqueues:,} enqueues, medians of {args.runs} "
            f"run(s) per state; {args.history:,} completed jobs of history.",
            "",
            *table,
            "",
            *notes,
            "",
            "### Errors",
            "",
            *(errors or ["none"]),
        ]
    )
    common.publish(text, args.output)
    return 1 if errors else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

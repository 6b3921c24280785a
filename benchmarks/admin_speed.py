"""Admin speed: how long the admin's pages take with 1,000,000 jobs in the table.

    python benchmarks/admin_speed.py [--jobs 1000000] [--requests 7]
        [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
        [--sqlite-file PATH] [--postgres-schema NAME] [--reuse]
        [--no-sqlite] [--page SUBSTRING]... [--explain]

Fills a fresh SQLite file and, when ``--postgres`` or ``SQLQUEUE_BENCH_POSTGRES_URL``
gives a server, a fresh PostgreSQL schema (dropped afterwards) with a realistic mix: 30
days of history, mostly completed, a recent backlog of pending jobs, some running, dead
(with error histories) and cancelled, scheduled jobs, retried-then-completed jobs, four
queues, eight tasks, reserved effects and live and gone workers. Rows go in by bulk
inserts (``executemany`` on SQLite, ``COPY`` on PostgreSQL) with the plain indexes
dropped and built again afterwards, then the tables are analysed, as a database that
has been running for a while would be.

``--sqlite-file`` / ``--postgres-schema`` keep the filled database; with ``--reuse`` a
later run skips the fill where it already holds ``--jobs`` jobs (to iterate on queries;
its recent-activity figures age with the fill, so quote a fresh run). ``--explain``
prints every statement each page runs with the database's plan for it.

Each page is requested through Flask's test client (so the time includes routing,
authorisation, the queries and rendering the template): one warm-up request, then the
median of ``--requests`` more. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flask import Flask  # noqa: E402

from flask_sqlqueue import SQLQueue  # noqa: E402
from flask_sqlqueue import schema  # noqa: E402

TASKS = {
    "app.mail.send_email": "mail",
    "app.mail.send_digest": "mail",
    "app.billing.charge": "default",
    "app.billing.refund": "default",
    "app.search.reindex": "default",
    "app.reports.build_report": "reports",
    "app.hooks.deliver_webhook": "webhooks",
    "app.hooks.retry_webhook": "webhooks",
}
WEIGHTS = [30, 5, 20, 2, 13, 10, 15, 5]
COLUMNS = [
    "id",
    "queue",
    "task",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "rescues",
    "releases",
    "priority",
    "run_at",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "worker_id",
    "claim_token",
    "last_error",
    "errors",
    "result",
    "idempotency_key",
]
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/hooks.py", line 42, in deliver_webhook\n'
    "    response.raise_for_status()\n"
    "requests.exceptions.HTTPError: 503 Server Error: Service Unavailable\n"
)
#: The pages timed, by label; ``{dead_id}`` is a dead job's id.
PAGES = [
    ("dashboard `GET /`", "/"),
    ("dashboard, last day `GET /?span=24h`", "/?span=24h"),
    ("job list `GET /jobs`", "/jobs"),
    ("dead letters `GET /jobs?status=dead`", "/jobs?status=dead"),
    ("`GET /jobs?status=dead&queue=webhooks`", "/jobs?status=dead&queue=webhooks"),
    ("`GET /jobs?task=app.billing.refund`", "/jobs?task=app.billing.refund"),
    ("`GET /jobs?task=app.mail.send_email`", "/jobs?task=app.mail.send_email"),
    ("`GET /jobs?q=<idempotency key>`", "/jobs?q=order-123456"),
    ("metrics `GET /metrics` (24 h)", "/metrics"),
    ("metrics, 7 days `GET /metrics?window=7d`", "/metrics?window=7d"),
    ("workers `GET /workers`", "/workers"),
    ("one dead job `GET /jobs/<id>`", "/jobs/{dead_id}"),
    ("replay confirmation `GET /jobs/retry-dead`", "/jobs/retry-dead"),
]


# -- the data -----------------------------------------------------------------------------


def generate(n: int, now: datetime, seed: int = 5) -> Iterator[tuple[Any, ...]]:
    """``n`` job rows as tuples in ``COLUMNS`` order, oldest first, ending at ``now``."""
    rng = random.Random(seed)
    tasks = list(TASKS)
    cumulative = list(itertools.accumulate(WEIGHTS))
    span = timedelta(days=30).total_seconds()
    for i in range(1, n + 1):
        task = rng.choices(tasks, cum_weights=cumulative)[0]
        created = now - timedelta(seconds=span * (1 - i / n))
        age = (now - created).total_seconds()
        run_at = created
        started = finished = worker = last_error = errors = result = None
        attempts, max_attempts = 0, 5
        roll = rng.random()
        if age < 1800 and roll < 0.35:
            status = "pending"  # a backlog built up over the last half hour
        elif age < 600 and roll < 0.36:
            status = "running"
        elif roll < 0.004:
            status = "pending"  # scheduled for later
            run_at = created + timedelta(days=rng.uniform(1, 40))
        elif roll < 0.014:
            status = "dead"
        elif roll < 0.024:
            status = "cancelled"
        else:
            status = "completed"
        if status in ("running", "completed", "dead"):
            wait = rng.expovariate(1 / 1.5)
            duration = rng.lognormvariate(-1.5, 1.2)
            attempts = 1
            if status == "completed" and rng.random() < 0.03:
                attempts = 2  # failed once, then completed
            if status == "dead":
                attempts = max_attempts
            started = created + timedelta(seconds=wait + 60 * (attempts - 1))
            if status != "running":
                finished = started + timedelta(seconds=duration)
            worker = f"worker-{rng.randrange(8)}"
        if attempts > 1 or status == "dead":
            failed = attempts if status == "dead" else attempts - 1
            records = [
                {
                    "attempt": k + 1,
                    "type": "HTTPError",
                    "message": "503 Server Error",
                    "traceback": TRACEBACK,
                    "worker": worker,
                    "at": (created + timedelta(seconds=60 * k + 2)).isoformat(),
                }
                for k in range(failed)
            ]
            errors = json.dumps(records)
            last_error = "HTTPError: 503 Server Error"
        if status == "completed":
            result = '{"ok": true}'
        if status == "cancelled":
            finished = created + timedelta(seconds=30)
        updated = finished or started or created
        yield (
            i,
            TASKS[task],
            task,
            # What json.dumps gives, without its cost per row.
            f'{{"args": [{i}, "user-{i % 50_000}@example.com"], "kwargs": {{}}}}',
            status,
            attempts,
            max_attempts,
            0,
            0,
            0,
            run_at,
            created,
            updated,
            started,
            finished,
            worker,
            uuid.UUID(int=i).hex if status == "running" else None,
            last_error,
            errors,
            result,
            f"order-{i}" if task == "app.billing.charge" else None,
        )


def _sqlite_time(value: Any) -> Any:
    # The format SQLAlchemy's SQLite DateTime stores (naive UTC): text compares in order.
    # Every generated time is UTC already; isoformat is many times faster than strftime.
    if isinstance(value, datetime):
        return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")
    return value


def _sqlite_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        v.replace(tzinfo=None).isoformat(" ", "microseconds") if isinstance(v, datetime) else v
        for v in row
    )


def fill_sqlite(path: str, n: int, now: datetime) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous = OFF")
    db.execute("PRAGMA cache_size = -200000")  # 200 MB for the index builds
    # Plain indexes are built once after the rows are in, not updated row by row.
    indexes = db.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'sqlqueue_jobs'"
        " AND name LIKE 'ix_%'"
    ).fetchall()
    for name, _ in indexes:
        db.execute(f"DROP INDEX {name}")
    insert = (
        f"INSERT INTO sqlqueue_jobs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    )
    rows = generate(n, now)
    while batch := [_sqlite_row(row) for row in itertools.islice(rows, 100_000)]:
        db.executemany(insert, batch)
    for _, sql in indexes:
        db.execute(sql)
    db.executemany(
        "INSERT INTO sqlqueue_job_effects (key, job_id, created_at) VALUES (?, ?, ?)",
        [
            (f"effect-{job_id}", job_id, _sqlite_time(now))
            for job_id in range(1, n + 1, max(n // 50_000, 1))
        ],
    )
    db.executemany(
        "INSERT INTO sqlqueue_workers (id, host, pid, queues, concurrency, started_at,"
        " last_heartbeat_at, stopped_at, stop_reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [tuple(_sqlite_time(v) for v in w) for w in workers(now)],
    )
    db.commit()
    db.execute("ANALYZE")
    db.close()


def fill_postgres(engine: sa.Engine, n: int, now: datetime) -> None:
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        # Plain indexes are built once after the rows are in, not updated row by row.
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'sqlqueue_jobs'"
            " AND schemaname = current_schema() AND indexname LIKE 'ix_%%'"
        )
        indexes = cur.fetchall()
        for name, _ in indexes:
            cur.execute(f"DROP INDEX {name}")
        with cur.copy(f"COPY sqlqueue_jobs ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in generate(n, now):
                copy.write_row(row)
        cur.execute("SET maintenance_work_mem = '256MB'")
        for _, sql in indexes:
            cur.execute(sql)
        # COPY with explicit ids leaves the sequence behind.
        cur.execute("SELECT setval(pg_get_serial_sequence('sqlqueue_jobs', 'id'), %s)", (n,))
        with cur.copy("COPY sqlqueue_job_effects (key, job_id, created_at) FROM STDIN") as copy:
            for job_id in range(1, n + 1, max(n // 50_000, 1)):
                copy.write_row((f"effect-{job_id}", job_id, now))
        cur.executemany(
            "INSERT INTO sqlqueue_workers (id, host, pid, queues, concurrency, started_at,"
            " last_heartbeat_at, stopped_at, stop_reason) VALUES (%s, %s, %s, %s, %s, %s, %s,"
            " %s, %s)",
            workers(now),
        )
        raw.commit()
    finally:
        raw.close()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")


def workers(now: datetime) -> list[tuple[Any, ...]]:
    alive = (None, None)  # stopped_at, stop_reason
    live = [
        (f"worker-{k}", f"host-{k // 2}", 1000 + k, "", 4, now - timedelta(hours=5), now, *alive)
        for k in range(8)
    ]
    gone = [
        (
            f"gone-{k}",
            "host-9",
            2000 + k,
            "mail",
            2,
            now - timedelta(hours=30),
            now - timedelta(hours=k + 1),
            now - timedelta(hours=k + 1),
            "lost" if k % 3 == 0 else "stopped",
        )
        for k in range(12)
    ]
    return live + gone


# -- the measurement ----------------------------------------------------------------------


def admin_app(url: str) -> Flask:
    app = Flask("admin_speed")
    app.secret_key = "admin speed benchmark"
    app.config["SQLQUEUE_DATABASE_URI"] = url
    queue = SQLQueue(app)
    app.register_blueprint(queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue")
    return app


def time_pages(app: Flask, requests: int, dead_id: int, only: list[str]) -> dict[str, float]:
    client = app.test_client()
    timings: dict[str, float] = {}
    for label, path in pages(only):
        url = "/queue" + path.format(dead_id=dead_id)
        samples = []
        for i in range(requests + 1):
            started = time.perf_counter()
            response = client.get(url)
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                raise RuntimeError(f"{url} answered {response.status_code}")
            if i:  # the first request warms caches and compiles the statements
                samples.append(elapsed)
        timings[label] = statistics.median(samples) * 1000
        print(f"  {label}: {timings[label]:.1f} ms", file=sys.stderr)
    return timings


def pages(only: list[str]) -> list[tuple[str, str]]:
    return [(label, path) for label, path in PAGES if not only or any(o in path for o in only)]


def explain(app: Flask, dead_id: int, only: list[str]) -> None:
    """Print every statement each page runs, with the database's plan for it."""
    engine = app.extensions["sqlqueue"].store.engine
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    client = app.test_client()
    prefix = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    for label, path in pages(only):
        url = "/queue" + path.format(dead_id=dead_id)
        sa.event.listen(engine, "before_cursor_execute", record)
        try:
            client.get(url)
        finally:
            sa.event.remove(engine, "before_cursor_execute", record)
        print(f"\n## {engine.dialect.name}: {label}", file=sys.stderr)
        statements, seen[:] = list(seen), []
        with engine.connect() as conn:
            for statement, parameters in statements:
                if not statement.lstrip().upper().startswith(("SELECT", "WITH")):
                    continue
                print("\n" + " ".join(statement.split())[:600], file=sys.stderr)
                plan = conn.exec_driver_sql(prefix + statement, parameters).all()
                for row in plan:
                    print("    " + str(row[-1]), file=sys.stderr)


def filled(url: str, n: int) -> datetime | None:
    """When the database was filled with ``n`` jobs (its newest job's ``created_at``),
    or ``None`` if it holds some other number of jobs."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("sqlqueue_jobs"):
                return None
            count, newest = conn.exec_driver_sql(
                "SELECT count(*), max(created_at) FROM sqlqueue_jobs"
            ).one()
    finally:
        engine.dispose()
    if count != n or newest is None:
        return None
    if isinstance(newest, str):
        newest = datetime.fromisoformat(newest)
    return newest if newest.tzinfo else newest.replace(tzinfo=UTC)


def dead_job_id(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.exec_driver_sql(
                    "SELECT max(id) FROM sqlqueue_jobs WHERE status = 'dead'"
                ).scalar_one()
            )
    finally:
        engine.dispose()


@contextmanager
def postgres_schema(base: str, name: str | None) -> Iterator[str]:
    """A schema first in every connection's ``search_path``: a fresh one, dropped
    afterwards, or ``name``, created if missing and kept."""
    url = sa.make_url(base)
    keep = name is not None
    name = name or f"sqlqueue_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {name}")
    try:
        yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        admin.dispose()


def run(
    label: str, url: str, fill: Callable[[sa.Engine, datetime], None], args: Any
) -> dict[str, float]:
    at = filled(url, args.jobs) if args.reuse else None
    if at is not None:
        age = datetime.now(UTC) - at
        print(f"{label}: reusing {args.jobs:,} jobs filled {age} ago", file=sys.stderr)
    else:
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                if sa.inspect(conn).has_table("sqlqueue_jobs"):
                    raise SystemExit(f"{label}: {url} holds other jobs; give an empty database")
            schema.upgrade(engine, "heads")
            now = datetime.now(UTC)
            started = time.perf_counter()
            fill(engine, now)
            took = time.perf_counter() - started
            print(f"{label}: {args.jobs:,} jobs in {took:.0f} s", file=sys.stderr)
        finally:
            engine.dispose()
    app = admin_app(url)
    try:
        dead_id = dead_job_id(url)
        timings = time_pages(app, args.requests, dead_id, args.page)
        if args.explain:
            explain(app, dead_id, args.page)
        return timings
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=7, help="timed requests per page")
    parser.add_argument("--postgres", default=os.environ.get("SQLQUEUE_BENCH_POSTGRES_URL"))
    parser.add_argument("--sqlite-file", help="fill this file (kept) instead of a temporary one")
    parser.add_argument(
        "--postgres-schema", help="fill this schema (kept) instead of a temporary one"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="skip the fill where --sqlite-file / --postgres-schema already hold --jobs jobs"
        " (their times are as old as the fill: recent-activity figures age)",
    )
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument(
        "--page", action="append", default=[], help="time only pages whose path contains this"
    )
    parser.add_argument(
        "--explain", action="store_true", help="print each page's statements and their plans"
    )
    args = parser.parse_args()

    results: dict[str, dict[str, float]] = {}
    if not args.no_sqlite:
        with tempfile.TemporaryDirectory() as folder:
            path = args.sqlite_file or str(Path(folder) / "admin-speed.db")
            results["SQLite"] = run(
                "SQLite",
                f"sqlite:///{path}",
                lambda _engine, now: fill_sqlite(path, args.jobs, now),
                args,
            )
    if args.postgres:
        with postgres_schema(args.postgres, args.postgres_schema) as url:
            results["PostgreSQL"] = run(
                "PostgreSQL", url, lambda engine, now: fill_postgres(engine, args.jobs, now), args
            )

    backends = list(results)
    print(
        f"| page ({args.jobs:,} jobs; median of {args.requests}, ms) | "
        + " | ".join(backends)
        + " |"
    )
    print("|---|" + "---:|" * len(backends))
    for label, _ in pages(args.page):
        print(f"| {label} | " + " | ".join(f"{results[b][label]:.0f}" for b in backends) + " |")


if __name__ == "__main__":
    main()

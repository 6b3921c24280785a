"""The ceilings: a queue written straight on sqlite3, psycopg or PyMySQL, with batched claims.

    python -m benchmarks.peers.raw_worker sqlite PATH
    python -m benchmarks.peers.raw_worker postgres DSN
    python -m benchmarks.peers.raw_worker mysql mysql://USER@HOST:PORT/DATABASE

A worker claims up to 100 jobs in one transaction, runs them, and records all of them
completed in one transaction. When a claim finds nothing, a PostgreSQL worker waits for a
``NOTIFY raw_jobs`` (the raw producer's insert sends one in its own transaction); a SQLite
or MariaDB worker claims again 1 ms later. SQLite runs in WAL mode with
``synchronous=FULL`` and takes its write lock up front (``BEGIN IMMEDIATE``); PostgreSQL
claims with ``FOR UPDATE SKIP LOCKED`` in one statement. MariaDB has no ``UPDATE …
RETURNING``, so its claim is a ``SELECT … FOR UPDATE SKIP LOCKED`` and an ``UPDATE`` of
those ids (READ COMMITTED, as flask_sqlqueue's engine), and its completions are one
``UPDATE`` per distinct result (PyMySQL's ``executemany`` would send an ``UPDATE`` per
row). There is no heartbeat, retry, rescue or fencing: this is what the database allows,
not a queue to use.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp

BATCH = 100

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    result TEXT
);
CREATE INDEX IF NOT EXISTS raw_jobs_claim ON raw_jobs (queue, status, priority DESC, run_at, id);
"""

POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    task TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    result TEXT
);
CREATE INDEX IF NOT EXISTS raw_jobs_claim ON raw_jobs (queue, status, priority DESC, run_at, id);
"""

MYSQL_SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    queue VARCHAR(64) NOT NULL,
    task VARCHAR(200) NOT NULL,
    payload TEXT NOT NULL,
    status VARCHAR(16) NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at DATETIME(6) NOT NULL,
    created_at DATETIME(6) NOT NULL,
    started_at DATETIME(6) NULL,
    finished_at DATETIME(6) NULL,
    result TEXT NULL,
    INDEX raw_jobs_claim (queue, status, priority DESC, run_at, id)
) ENGINE=InnoDB
"""

INSERT_SQLITE = (
    "INSERT INTO raw_jobs (queue, task, payload, status, run_at, created_at) "
    "VALUES ('default', ?, ?, 'pending', ?, ?)"
)
# The NOTIFY rides on the INSERT's RETURNING, in its transaction (one per transaction:
# PostgreSQL folds the same notification sent again in one transaction into one).
CHANNEL = "raw_jobs"
INSERT_POSTGRES = (
    "INSERT INTO raw_jobs (queue, task, payload, status, run_at, created_at) "
    "VALUES ('default', %s, %s, 'pending', now(), now()) "
    f"RETURNING pg_notify('{CHANNEL}', '')"
)
INSERT_MYSQL = (
    "INSERT INTO raw_jobs (queue, task, payload, status, run_at, created_at) "
    "VALUES ('default', %s, %s, 'pending', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
)

CLAIM_SQLITE = f"""
UPDATE raw_jobs SET status = 'running', attempts = attempts + 1, started_at = ?
WHERE id IN (
    SELECT id FROM raw_jobs
    WHERE queue = 'default' AND status = 'pending' AND run_at <= ?
    ORDER BY priority DESC, run_at, id LIMIT {BATCH}
)
RETURNING id, task, payload
"""
CLAIM_POSTGRES = f"""
UPDATE raw_jobs SET status = 'running', attempts = attempts + 1, started_at = now()
WHERE id IN (
    SELECT id FROM raw_jobs
    WHERE queue = 'default' AND status = 'pending' AND run_at <= now()
    ORDER BY priority DESC, run_at, id LIMIT {BATCH}
    FOR UPDATE SKIP LOCKED
)
RETURNING id, task, payload
"""
LOCK_MYSQL = f"""
SELECT id, task, payload FROM raw_jobs
WHERE queue = 'default' AND status = 'pending' AND run_at <= UTC_TIMESTAMP(6)
ORDER BY priority DESC, run_at, id LIMIT {BATCH}
FOR UPDATE SKIP LOCKED
"""
COMPLETE_SQLITE = (
    "UPDATE raw_jobs SET status = 'completed', finished_at = ?, result = ? "
    "WHERE id = ? AND status = 'running'"
)
COMPLETE_POSTGRES = (
    "UPDATE raw_jobs SET status = 'completed', finished_at = now(), result = %s "
    "WHERE id = %s AND status = 'running'"
)

# Then "WHERE id IN (…)" with the batch's ids: see work_mysql.
MARK_MYSQL = (
    "UPDATE raw_jobs SET status = 'running', attempts = attempts + 1, "
    "started_at = UTC_TIMESTAMP(6) WHERE status = 'pending' AND id IN "
)
COMPLETE_MYSQL = (
    "UPDATE raw_jobs SET status = 'completed', finished_at = UTC_TIMESTAMP(6), result = %s "
    "WHERE status = 'running' AND id IN "
)


TASKS: dict[str, Callable[..., Any]] = {"write": workload.write, "probe": stamp}
IDLE_POLL = 0.001  # seconds between claims while none finds a job (SQLite, MariaDB)


def payload(*args: Any, **kwargs: Any) -> str:
    """A job's payload: its arguments as JSON."""
    return json.dumps({"args": args, "kwargs": kwargs})


def sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def sqlite_setup(path: str) -> None:
    conn = sqlite_connect(path)
    conn.executescript(SQLITE_SCHEMA)
    conn.close()


def run(rows: list[Any]) -> list[tuple[str | None, int]]:
    done: list[tuple[str | None, int]] = []
    for job_id, task, text in rows:
        body = json.loads(text)
        value = TASKS[task](*body["args"], **body["kwargs"])
        done.append((json.dumps(value), job_id))
    return done


def work_sqlite(path: str, stopping: list[bool]) -> None:
    conn = sqlite_connect(path)
    while not stopping:
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM_SQLITE, (now, now)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            time.sleep(IDLE_POLL)
            continue
        done = run(rows)
        finished = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(COMPLETE_SQLITE, [(finished, result, job_id) for result, job_id in done])
        conn.execute("COMMIT")


def work_postgres(dsn: str, stopping: list[bool]) -> None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            conn.execute(f"LISTEN {CHANNEL}")
        while not stopping:
            with conn.transaction():
                rows = conn.execute(CLAIM_POSTGRES).fetchall()
            if not rows:
                # A NOTIFY sent while the claim ran waits in psycopg's backlog: none is lost.
                for _ in conn.notifies(timeout=0.5, stop_after=1):
                    pass
                continue
            done = run(rows)
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(COMPLETE_POSTGRES, done)


def mysql_setup(url: str) -> None:
    from benchmarks.peers.common import mysql_connect

    conn = mysql_connect(url, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(MYSQL_SCHEMA)
    conn.close()


def _in(ids: list[int]) -> str:
    return "(" + ", ".join(str(int(job_id)) for job_id in ids) + ")"


def work_mysql(url: str, stopping: list[bool]) -> None:
    from benchmarks.peers.common import mysql_connect

    conn = mysql_connect(url, autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        while not stopping:
            cur.execute(LOCK_MYSQL)
            rows = list(cur.fetchall())
            if not rows:
                conn.commit()
                time.sleep(IDLE_POLL)
                continue
            cur.execute(MARK_MYSQL + _in([row[0] for row in rows]))
            conn.commit()
            by_result: dict[str | None, list[int]] = {}
            for result, job_id in run(rows):
                by_result.setdefault(result, []).append(job_id)
            for result, ids in by_result.items():
                cur.execute(COMPLETE_MYSQL + _in(ids), (result,))
            conn.commit()
    conn.close()


def main() -> None:
    kind, target = sys.argv[1], sys.argv[2]
    stopping: list[bool] = []
    # Finish the batch in hand, then exit: a claimed batch is never left running.
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    if kind == "sqlite":
        work_sqlite(target, stopping)
    elif kind == "mysql":
        work_mysql(target, stopping)
    else:
        work_postgres(target, stopping)


if __name__ == "__main__":
    main()

"""Scenario 6, database outage: the database goes away while workers run."""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from benchmarks import chaos_app
from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import first_match
from benchmarks.chaos.analysis import self_exits
from benchmarks.chaos.harness import SELF_STOP
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import kill_mysql_connections
from benchmarks.chaos.harness import most_claimed
from benchmarks.chaos.harness import wait_for


@contextlib.contextmanager
def _outage(h: Harness) -> Iterator[Callable[[], None]]:
    """Make the database unavailable to every other connection until the block ends.

    Yields a function to call periodically during the outage (servers: keep killing).
    """
    url = sa.make_url(h.url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        holder = sqlite3.connect(url.database or "", timeout=60, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            yield lambda: None
            holder.execute("ROLLBACK")
        finally:
            holder.close()
        return
    name = url.database
    admin = sa.create_engine(
        sa.make_url(h.base_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.exec_driver_sql(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")

                def terminate() -> None:
                    conn.execute(
                        sa.text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    )

                try:
                    terminate()
                    yield terminate
                finally:
                    conn.exec_driver_sql(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
            else:
                conn.exec_driver_sql(f"ALTER USER '{name}'@'127.0.0.1' ACCOUNT LOCK")
                try:
                    kill_mysql_connections(conn, name or "")

                    def kill_connections() -> None:
                        kill_mysql_connections(conn, name or "")

                    yield kill_connections
                finally:
                    conn.exec_driver_sql(f"ALTER USER '{name}'@'127.0.0.1' ACCOUNT UNLOCK")
    finally:
        admin.dispose()


def outage(
    base_url: str,
    workdir: Path,
    *,
    jobs: int | None = None,
    job_ms: float = 200.0,
    seconds: float = 10.0,
    lead: float = 2.0,
    workers: int = 4,
    threads: int = 2,
    stale_after: float = 2.0,
    timeout: float = 180.0,
) -> ScenarioResult:
    """The database is unavailable for ``seconds`` while workers run: they survive, no
    attempt is consumed, nothing is lost.

    The jobs are enqueued once every worker has started, ``lead`` seconds before the
    outage; by default there are enough to keep every thread busy for ``lead + 6`` s of
    claiming (no claim succeeds during the outage), so jobs run before, across and after it.
    """
    slots = workers * threads
    jobs = jobs or max(slots, math.ceil(slots * (lead + 6) / (job_ms / 1000)))
    result = ScenarioResult("Database outage", backend_of(base_url))
    with Harness("outage", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        how = {
            "sqlite": "another connection holds BEGIN EXCLUSIVE",
            "postgresql": "ALLOW_CONNECTIONS false + pg_terminate_backend of every connection "
            "(repeated every 0.2 s)",
            "mysql": "the database's own account locked (ACCOUNT LOCK) + KILL CONNECTION of "
            "every connection it has (repeated every 0.1 s)",
        }[h.backend]
        result.add("outage", f"{seconds:g} s: {how}")
        result.add(
            "load",
            f"{jobs} jobs x {job_ms:g} ms, {workers} workers x {threads} threads, "
            f"STALE_AFTER={stale_after:g} s",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        if not wait_for(lambda: all(p.ready() for p in pool) or any(not p.alive for p in pool), 60):
            raise ChaosError("workers did not start")
        ids = h.enqueue([(chaos_app.work, (job_ms,)) for _ in range(jobs)])
        time.sleep(lead)
        running_before = h.counts()
        most = most_claimed(workers, threads)
        result.check(
            running_before.get("running", 0) <= most,
            f"{running_before.get('running', 0)} jobs running with at most {most} claimed by "
            "the workers: a claim took more jobs than its limit",
        )
        died_during: list[str] = []
        interval = 0.2 if h.backend == "postgresql" else 0.1
        with _outage(h) as keep_down:
            began = time.time()
            while time.time() - began < seconds:
                keep_down()
                for p in pool:
                    if p.poll() is not None and not any(str(p.pid) in d for d in died_during):
                        died_during.append(
                            f"pid {p.pid} exited {p.popen.returncode} during the outage: {p.tail()}"
                        )
                time.sleep(interval)
        ended = time.time()
        result.add(
            "jobs completed before the outage / running at its start",
            f"{running_before.get('completed', 0)} / {running_before.get('running', 0)}",
        )

        def settled() -> bool:
            counts = h.counts()
            finished = counts.get("completed", 0) + counts.get("dead", 0) >= jobs
            return finished or all(not p.alive for p in pool)

        finished = wait_for(settled, timeout, 0.2)
        done_at = time.time()
        died = self_exits(pool)
        alive = sum(p.alive for p in pool)
        result.add("workers alive after the outage", f"{alive} of {workers}")
        result.add("time to finish after the outage", f"{done_at - ended:.1f} s")
        result.check(
            finished, f"jobs unfinished {timeout:.0f} s after the outage: {dict(h.counts())}"
        )
        result.check(
            not died,
            "workers exited because of the outage: "
            + "; ".join(
                f"pid {p.pid} exited {p.popen.returncode} at +{(p.ended or 0) - began:.1f} s: "
                f"{first_match(SELF_STOP, p.text()) or p.tail(3)}"
                for p in died
            ),
        )
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        rows = h.rows()
        marks, _ = h.marks()
        check_completed(result, rows, marks, ids, once=True)
        rescued = [r for r in rows if r.rescues]
        result.add("jobs rescued (attempt consumed by the outage)", len(rescued))
        db_errors = sum(p.text().count("database error during") for p in pool)
        unrecorded = sum(p.text().count("could not record the outcome") for p in pool)
        late = sum(p.text().count("outcome recorded once the database was back") for p in pool)
        result.add(
            "worker log: 'database error during ...' / 'could not record the outcome' / "
            "'outcome recorded once the database was back'",
            f"{db_errors} / {unrecorded} / {late}",
        )
        check_logs(result, h.procs)
    return result

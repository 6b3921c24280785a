"""Scenario 5, busy storm: producers, workers and a status poller on one database."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import self_exits
from benchmarks.chaos.harness import FLASK
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import most_claimed


def busy_storm(
    base_url: str,
    workdir: Path,
    *,
    producers: int = 4,
    per_producer: int = 2500,
    workers: int = 4,
    threads: int = 2,
    poll_every: float = 0.5,
    stale_after: float = 10.0,
    timeout: float | None = None,
) -> ScenarioResult:
    """Producers, workers and a status poller on one database: no "database is locked",
    every job exactly once, and an intact SQLite file."""
    total = producers * per_producer
    timeout = timeout or 120 + total * 0.05
    result = ScenarioResult("Busy storm", backend_of(base_url))
    with Harness("busy", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        result.add(
            "load",
            f"{producers} producers x {per_producer} enqueues (one transaction each), "
            f"{workers} workers x {threads} threads, "
            f"`flask queue status` every {poll_every:g} s",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        makers = [
            h.spawn("producer", [*FLASK, "chaos-produce", "--count", str(per_producer)])
            for _ in range(producers)
        ]
        polls: list[Proc] = []
        poller: Proc | None = None
        next_poll = 0.0
        deadline = time.monotonic() + timeout
        produced_at: float | None = None
        finished = False
        most_running = 0
        while time.monotonic() < deadline:
            if poller is not None and poller.poll() is not None:
                poller, next_poll = None, time.monotonic() + poll_every
            if poller is None and time.monotonic() >= next_poll:
                poller = h.spawn("status", [*FLASK, "queue", "status"])
                polls.append(poller)
            if produced_at is None and all(p.poll() is not None for p in makers):
                produced_at = time.time()
            counts = h.counts()
            most_running = max(most_running, counts.get("running", 0))
            if produced_at is not None and counts.get("completed", 0) >= total:
                finished = True
                break
            if any(p.poll() is not None for p in pool):
                break  # a worker died: reported below
            time.sleep(0.1)
        end = time.time()
        for proc in polls:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=60)
        died = self_exits(pool)
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        result.check(
            finished, f"not all {total} jobs completed within {timeout:.0f} s: {dict(h.counts())}"
        )
        outputs = []
        for proc in makers:
            text = proc.text().strip().splitlines()
            try:
                outputs.append(json.loads(text[-1]))
            except (IndexError, ValueError):
                outputs.append({})
        bad_makers = [
            (p.pid, p.popen.returncode, p.tail(3))
            for p, o in zip(makers, outputs, strict=True)
            if p.popen.returncode != 0 or o.get("enqueued") != per_producer
        ]
        result.check(not bad_makers, f"producers failed: {bad_makers[:4]}")
        produce_s = max((o.get("seconds", 0.0) for o in outputs), default=0.0)
        result.add(
            "enqueue rate (all producers)",
            f"{total / max(produce_s, 1e-9):.0f} jobs/s (slowest producer {produce_s:.1f} s)",
        )
        result.add(
            "throughput (completed jobs / total time)",
            f"{total / max(end - started, 1e-9):.1f} jobs/s over {end - started:.1f} s",
        )
        most = most_claimed(workers, threads)
        result.add(
            "most jobs running at once (sampled)",
            f"{most_running} (threads: {workers * threads}; with claims ahead: {most})",
        )
        result.check(
            most_running <= most,
            f"{most_running} jobs running with at most {most} claimed by the workers: "
            "a claim took more jobs than its limit",
        )
        failed_polls = [p for p in polls if p.popen.returncode != 0]
        result.add("status polls (failed)", f"{len(polls)} ({len(failed_polls)})")
        result.check(
            not failed_polls, f"flask queue status failed: {[p.tail(3) for p in failed_polls[:3]]}"
        )
        result.check(
            not died,
            "workers exited during the storm: "
            f"{[(p.pid, p.popen.returncode, p.tail()) for p in died]}",
        )
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        rows = h.rows()
        marks, bad = h.marks()
        result.check(len(rows) == total, f"{len(rows)} job rows for {total} enqueues")
        check_completed(result, rows, marks, [r.id for r in rows], once=True)
        result.check(bad == 0, f"{bad} malformed side-file line(s)")
        check_logs(result, h.procs)
        if h.backend == "sqlite":
            h.store.engine.dispose()
            path = sa.make_url(h.url).database or ""
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
                integrity = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
            result.add("PRAGMA integrity_check", ", ".join(integrity))
            result.check(integrity == ["ok"], f"integrity_check: {integrity[:5]}")
        else:
            result.add("PRAGMA integrity_check", "n/a (server database)")
    return result

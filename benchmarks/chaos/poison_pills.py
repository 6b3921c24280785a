"""Scenario 4, poison pills: jobs that kill their own worker end dead after max_attempts."""

from __future__ import annotations

import collections
import random
import time
from pathlib import Path
from typing import Any

from benchmarks import chaos_app
from benchmarks.chaos.analysis import analyze_runs
from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import explain_figures
from benchmarks.chaos.analysis import rescue_delays
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import error_records
from benchmarks.chaos.harness import seconds_text
from benchmarks.chaos.harness import worker_pid

POISONS = {
    "os._exit(1)": (chaos_app.poison_exit, "WorkerLost: worker lost"),
    "SIGKILL self": (chaos_app.poison_kill, "WorkerLost: worker lost"),
    "memory exhaustion": (chaos_app.poison_memory, "MemoryError: chaos: out of memory"),
}


def poison_pills(
    base_url: str,
    workdir: Path,
    *,
    healthy: int = 200,
    workers: int = 4,
    threads: int = 2,
    healthy_ms: tuple[float, float] = (50.0, 300.0),
    stale_after: float = 2.0,
    seed: int = 2,
    timeout: float = 180.0,
) -> ScenarioResult:
    """Poison pills end dead after exactly max_attempts; healthy jobs beside them complete."""
    rng = random.Random(seed)
    result = ScenarioResult("Poison pills", backend_of(base_url))
    with Harness("poison", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        items: list[tuple[Any, tuple[Any, ...]]] = [(task, ()) for task, _ in POISONS.values()]
        items += [(chaos_app.work, (round(rng.uniform(*healthy_ms), 1),)) for _ in range(healthy)]
        ids = h.enqueue(items)
        poison_ids = dict(zip(POISONS, ids[: len(POISONS)], strict=True))
        healthy_ids = ids[len(POISONS) :]
        result.add(
            "jobs",
            f"{len(POISONS)} poison pills (max_attempts {chaos_app.POISON_ATTEMPTS}) "
            f"+ {healthy} healthy ({healthy_ms[0]:g}-{healthy_ms[1]:g} ms)",
        )
        result.add(
            "workers",
            f"{workers} x {threads} threads, STALE_AFTER={stale_after:g} s; "
            "restarted when they die",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        deaths: list[str] = []
        deadline = time.monotonic() + timeout
        finished = False
        while time.monotonic() < deadline:
            for i, proc in enumerate(pool):
                if proc.poll() is not None:
                    deaths.append(str(proc.popen.returncode))
                    pool[i] = h.spawn_worker(threads)
            counts = h.counts()
            if counts.get("completed", 0) + counts.get("dead", 0) >= len(ids):
                finished = True
                break
            time.sleep(0.1)
        elapsed = time.time() - started
        result.check(finished, f"jobs still unfinished after {timeout:.0f} s: {dict(h.counts())}")
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        rows = {r.id: r for r in h.rows()}
        marks, _ = h.marks()
        crashed = {p.pid: p for p in h.workers if p.crashed}
        crashers = {
            m.pid
            for m in marks
            if m.kind == "start"
            and m.job in (poison_ids["os._exit(1)"], poison_ids["SIGKILL self"])
        }
        for label, job_id in poison_ids.items():
            row = rows[job_id]
            own = {m.attempt: m for m in marks if m.job == job_id and m.kind == "start"}
            expected_error = POISONS[label][1]
            # Account for every attempt: its own run's failure, or a WorkerLost from a worker
            # that crashed (on this pill, or on another pill it shared a process with).
            collateral = 0
            unaccounted = []
            for record in error_records(row):
                attempt, kind = record.get("attempt"), str(record.get("type"))
                pid = worker_pid(record.get("worker"))
                mine = own.get(attempt) if isinstance(attempt, int) else None
                if kind == "WorkerLost" and pid in crashed:
                    collateral += mine is None or mine.pid != pid
                elif kind == expected_error.partition(":")[0] and mine is not None:
                    pass
                else:
                    unaccounted.append(f"attempt {attempt}: {kind} on pid {pid}")
            result.add(
                f"poison {label}: status / attempts / own runs (+ lost beside another pill) "
                "/ last_error",
                f"{row.status} / {row.attempts} / {len(own)} (+{collateral}) / {row.last_error}",
            )
            result.check(
                row.status == "dead"
                and row.attempts == chaos_app.POISON_ATTEMPTS
                and len(error_records(row)) == chaos_app.POISON_ATTEMPTS,
                f"poison {label}: {row.status} after {row.attempts} attempts "
                f"({len(error_records(row))} error records); "
                f"expected dead after exactly {chaos_app.POISON_ATTEMPTS}",
            )
            result.check(
                not unaccounted and len(own) + collateral == row.attempts,
                f"poison {label}: attempts not explained by its own runs or a crashed worker: "
                f"{unaccounted}, {len(own)} own runs + {collateral} collateral "
                f"for {row.attempts} attempts",
            )
            result.check(
                (row.last_error or "").startswith(expected_error)
                or (row.last_error or "").startswith("WorkerLost"),
                f"poison {label}: last_error {row.last_error!r}, expected {expected_error!r}...",
            )
        result.add(
            "worker deaths (exit codes)",
            ", ".join(f"{c}: {n}" for c, n in sorted(collections.Counter(deaths).items()))
            or "none",
        )
        result.check(
            set(crashed) == crashers,
            f"worker deaths do not match the os._exit/SIGKILL runs: died {sorted(crashed)}, "
            f"ran a crashing pill {sorted(crashers)} (memory exhaustion must not kill a worker)",
        )
        check_completed(result, list(rows.values()), marks, healthy_ids)
        runs = analyze_runs(marks, h.workers, healthy_ids)
        explain_figures(result, runs)
        result.add(
            "healthy jobs with more than one attempt (collateral of a crash)",
            sum(rows[i].attempts > 1 for i in healthy_ids),
        )
        result.add(
            "crash -> job rescued p50 / p95 / max (pending again, or dead)",
            seconds_text(rescue_delays(h.procs)),
        )
        result.add("time until every job was finished", f"{elapsed:.1f} s")
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        check_logs(result, h.procs)
    return result

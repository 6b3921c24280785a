"""Scenario 1, kill storm: workers SIGKILLed and restarted at random while jobs run."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from benchmarks import chaos_app
from benchmarks.chaos.analysis import analyze_runs
from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import explain_figures
from benchmarks.chaos.analysis import false_rescues
from benchmarks.chaos.analysis import rescue_delays
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import Mark
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import seconds_text
from benchmarks.chaos.harness import wait_for


def kill_storm(
    base_url: str,
    workdir: Path,
    *,
    jobs: int = 2000,
    duration: float = 60.0,
    workers: int = 4,
    threads: int = 2,
    kill_every: float = 0.5,
    target: str = "any",
    job_ms: tuple[float, float] = (20.0, 200.0),
    stale_after: float = 2.0,
    max_attempts: int = 20,
    seed: int = 1,
    settle_timeout: float | None = None,
    graph: int = 0,
) -> ScenarioResult:
    """SIGKILL a random worker every ``kill_every`` s (and restart it) during ``duration``
    seconds or until every job is done; then let the queue finish without kills.

    ``target="any"`` picks among all worker processes, including ones still starting up;
    ``"ready"`` only among those that have logged that they started (a tick with none
    ready is skipped), so that every kill lands on a worker that may be running jobs.

    ``graph=N``: the jobs are a graph, each depending on 0 to ``N`` (at random) of the
    :data:`GRAPH_WINDOW` jobs enqueued just before it; besides the usual checks, none
    may be left waiting, and every run of a job must start after each of its
    dependencies' last run ended (the run that completed it).
    """
    if target not in ("any", "ready"):
        raise ValueError(f"target must be 'any' or 'ready', not {target!r}")
    rng = random.Random(seed)
    result = ScenarioResult("Kill storm", backend_of(base_url))
    with Harness(
        "kill-storm", base_url, workdir, stale_after=stale_after, max_attempts=max_attempts
    ) as h:
        result.workdir = h.dir
        durations = [rng.uniform(*job_ms) for _ in range(jobs)]
        # A random of its own: the kills of a seed are the same with a graph or without.
        edges = random_graph(jobs, graph, random.Random(seed)) if graph else None
        ids = h.enqueue([(chaos_app.work, (round(ms, 1),)) for ms in durations], edges)
        result.add(
            "jobs",
            f"{jobs} x {job_ms[0]:g}-{job_ms[1]:g} ms "
            f"(mean {sum(durations) / max(jobs, 1):.0f} ms)",
        )
        if edges is not None:
            result.add("jobs with dependencies", sum(1 for e in edges if e))
            result.add(
                "dependencies (edges)",
                f"{sum(map(len, edges))} (each job on 0-{graph} of the "
                f"{GRAPH_WINDOW} jobs before it; longest chain {_longest_chain(edges)})",
            )
        result.add("workers", f"{workers} x {threads} threads, STALE_AFTER={stale_after:g} s")
        if settle_timeout is None:
            work_s = sum(durations) / 1000 / (workers * threads)
            settle_timeout = 60 + 4 * work_s + 10 * stale_after
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        # The kill window opens once the first workers are up: killing a fleet that is
        # still importing would test nothing.
        if not wait_for(lambda: all(p.ready() or not p.alive for p in pool), 120, 0.05):
            raise ChaosError(f"workers did not start within 120 s: {pool[0].tail()}")
        opened = time.time()
        result.add("workers up after", f"{opened - started:.1f} s (the kill window opens)")
        kills: list[tuple[float, Proc]] = []
        skipped = 0
        self_exits: list[str] = []
        kill_end = time.monotonic() + duration
        next_kill = time.monotonic() + kill_every
        hard_end = kill_end + settle_timeout
        next_count = 0.0
        finished_at: float | None = None
        kill_window_end: float | None = None
        while True:
            now = time.monotonic()
            for i, proc in enumerate(pool):
                if proc.poll() is not None:  # died without our help: record, replace
                    self_exits.append(
                        f"pid {proc.pid} exited {proc.popen.returncode}: {proc.tail()}"
                    )
                    pool[i] = h.spawn_worker(threads)
            if now >= next_count:
                counts = h.counts()
                next_count = now + 0.25
                ended = ("completed", "dead", "cancelled")
                if sum(counts.get(status, 0) for status in ended) >= jobs:
                    finished_at = time.time()
                    break
            if now >= kill_end and kill_window_end is None:
                kill_window_end = time.time()
            if now < kill_end and now >= next_kill:
                next_kill += kill_every
                choices = [
                    i for i, p in enumerate(pool) if target == "any" or (p.alive and p.ready())
                ]
                if choices:
                    i = rng.choice(choices)
                    kills.append((h.kill(pool[i]), pool[i]))
                    pool[i] = h.spawn_worker(threads)
                else:
                    skipped += 1
            if now >= hard_end:
                result.violations.append(
                    f"not every job finished within {settle_timeout:.0f} s after the kill window"
                )
                break
            time.sleep(0.02)
        if kill_window_end is None:
            kill_window_end = finished_at or time.time()
        end = finished_at or time.time()
        survivors = [p for p in pool if p.alive]
        codes = h.stop(survivors, timeout=30)
        rows = h.rows()
        marks, bad = h.marks()
        runs = analyze_runs(marks, h.workers, ids)

        window = kill_window_end - opened
        why = (
            "all jobs done"
            if finished_at and finished_at <= kill_window_end + 0.5
            else "--duration"
        )
        result.add("kill window", f"{window:.1f} s (ended by {why}); total {end - started:.1f} s")
        result.add(
            "SIGKILLs (each worker restarted)",
            f"{len(kills)} (every {kill_every:g} s, target: {target} worker"
            + (f"; {skipped} ticks skipped, no worker ready" if target == "ready" else "")
            + ")",
        )
        result.add("runs interrupted by a kill", runs.interrupted)
        check_completed(result, rows, marks, ids)
        if edges is not None:
            check_graph(result, rows, marks, ids, edges)
        explain_figures(result, runs)
        result.add("rescues recorded (sum of rescues)", sum(r.rescues for r in rows))
        result.add("crashes counted (sum of crashes)", sum(r.crashes for r in rows))
        alive = false_rescues(h.procs)
        result.add("rescues from a worker that was alive then", len(alive))
        result.check(not alive, f"{len(alive)} rescue(s) of a live worker's jobs: {alive[:5]}")
        quarantined = [
            r.id
            for r in rows
            if r.status == "dead" and r.last_error and r.last_error.startswith("Quarantined")
        ]
        result.add("jobs quarantined", len(quarantined))
        result.add(
            "rescue latency p50 / p95 / max: kill -> job rescued (pending again)",
            seconds_text(rescue_delays(h.procs)),
        )
        result.add(
            "rescue latency p50 / p95 / max: kill -> job's next start", seconds_text(runs.latencies)
        )
        result.add(
            "throughput (completed jobs / total time)",
            f"{sum(r.status == 'completed' for r in rows) / max(end - started, 1e-9):.1f} jobs/s",
        )
        result.add("workers that exited on their own", len(self_exits))
        result.check(not self_exits, f"workers exited without being killed: {self_exits[:5]}")
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.add(
            "final SIGTERM: workers exiting 0", f"{len(codes) - len(bad_stop)} of {len(codes)}"
        )
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        result.check(bad == 0, f"{bad} malformed side-file line(s)")
        check_logs(result, h.procs)
        result.notes.append(
            "Rescue latency, kill -> rescued: from the SIGKILL to the rescuing worker's log line "
            "'job=N rescued from lost worker W' for every job W held (claimed, started or "
            "not); it spans STALE_AFTER and the rescuer's heartbeat period. Kill -> next "
            "start: to the next start line of each job the killed worker had started and not "
            "finished; it adds the wait for a free thread (a rescued job keeps its run_at, "
            "so it goes ahead of jobs that became due later)."
        )
        if edges is not None:
            result.notes.append(
                "A graph: a dependent is released in the transaction that completes its "
                "last dependency, so a run starting before that is a violation; a release "
                "made twice would show as a run no kill explains (an unexplained duplicate)."
            )
        result.notes.append(
            (
                f"Kills pick any of the {workers} worker processes at random, including ones "
                "still starting up (about 1.5 s of CPU each on this machine)"
                if target == "any"
                else f"Kills pick at random among the {workers} workers that have started"
            )
            + f"; SQLQUEUE_MAX_ATTEMPTS is {max_attempts} so that a job killed repeatedly "
            "is not sent dead."
        )
    return result


#: A job of a graph depends on jobs among this many enqueued just before it.
GRAPH_WINDOW = 50


def random_graph(jobs: int, most: int, rng: random.Random) -> list[list[int]]:
    """For each of ``jobs`` jobs, the indexes of 0 to ``most`` earlier jobs it depends on,
    among the :data:`GRAPH_WINDOW` before it."""
    edges: list[list[int]] = []
    for index in range(jobs):
        window = range(max(0, index - GRAPH_WINDOW), index)
        edges.append(sorted(rng.sample(window, min(len(window), rng.randint(0, most)))))
    return edges


def _longest_chain(edges: list[list[int]]) -> int:
    depth: list[int] = []
    for before in edges:
        depth.append(1 + max((depth[i] for i in before), default=0))
    return max(depth, default=0)


def check_graph(
    result: ScenarioResult,
    rows: list[Any],
    marks: list[Mark],
    ids: list[int],
    edges: list[list[int]],
) -> None:
    """No job left waiting, and every run of a dependent started after each of its
    dependencies' last run ended."""
    waiting = sorted(row.id for row in rows if row.status == "waiting")
    result.add("jobs left waiting", len(waiting))
    result.check(not waiting, f"{len(waiting)} job(s) left waiting: {waiting[:10]}")
    last_done: dict[int, float] = {}
    starts: dict[int, list[float]] = {}
    for mark in marks:
        if mark.kind == "done":
            last_done[mark.job] = max(mark.at, last_done.get(mark.job, mark.at))
        elif mark.kind == "start":
            starts.setdefault(mark.job, []).append(mark.at)
    early = []
    for index, before in enumerate(edges):
        job = ids[index]
        for dependency in (ids[i] for i in before):
            ended = last_done.get(dependency)
            for at in starts.get(job, []):
                if ended is None or at < ended:
                    early.append(
                        f"job {job} started at {at:.3f}, its dependency {dependency} "
                        + ("never ended" if ended is None else f"ended at {ended:.3f}")
                    )
    result.add("dependents started before a dependency completed", len(early))
    result.check(not early, f"{len(early)} run(s) started before a dependency: {early[:5]}")

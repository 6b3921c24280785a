"""Scenario 1, kill storm: workers SIGKILLed and restarted at random while jobs run; with
``signal_name="term"`` a SIGTERM storm: workers stopped gracefully, and replaced, at random."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

from benchmarks import chaos_app
from benchmarks.chaos.analysis import RunAnalysis
from benchmarks.chaos.analysis import analyze_runs
from benchmarks.chaos.analysis import attempts_mismatch
from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import explain_figures
from benchmarks.chaos.analysis import false_rescues
from benchmarks.chaos.analysis import hand_backs_logged
from benchmarks.chaos.analysis import release_delays
from benchmarks.chaos.analysis import rescue_delays
from benchmarks.chaos.analysis import rescues_logged
from benchmarks.chaos.analysis import unrecorded_successes
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import Mark
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import seconds_text
from benchmarks.chaos.harness import wait_for

#: A SIGTERMed worker must exit within its ``--grace`` plus this many seconds, counted
#: from the signal to the process's exit: the hand-back of its unstarted jobs before the
#: grace starts, the release of the unfinished ones after it, the last outcomes, its row
#: marked stopped, the listener's and the heartbeat's threads joined, the interpreter's
#: teardown.
STOP_BOUND = 5.0
#: A run a SIGTERMed worker records may have finished up to its ``--grace`` plus this many
#: seconds after the signal: the worker's grace starts once it has noticed the signal and
#: handed back the jobs it claimed ahead (a write). One recorded later was kept past the
#: grace.
GRACE_SLACK = 1.0
#: A SIGTERMed worker still running this long after its bound is SIGKILLed, so that the
#: storm can end (it counts as a stop over the bound, and its jobs are rescued).
STUCK_AFTER = 30.0
#: The SIGTERM storm's long jobs last this many times ``grace`` (uniformly at random):
#: longer than the grace, so a stop hands them back unfinished.
LONG_JOBS = (1.5, 3.0)


def kill_storm(
    base_url: str,
    workdir: Path,
    *,
    jobs: int = 2000,
    duration: float = 60.0,
    workers: int = 4,
    threads: int = 2,
    kill_every: float = 0.5,
    target: str | None = None,
    job_ms: tuple[float, float] = (20.0, 200.0),
    stale_after: float = 2.0,
    max_attempts: int = 20,
    seed: int = 1,
    settle_timeout: float | None = None,
    graph: int = 0,
    signal_name: str = "kill",
    grace: float = 2.0,
    long_share: float | None = None,
    long_s: tuple[float, float] | None = None,
    slack: float = 0.0,
    worker_grace: float | None = None,
    broken: str | None = None,
) -> ScenarioResult:
    """SIGKILL a random worker every ``kill_every`` s (and restart it) during ``duration``
    seconds or until every job is done; then let the queue finish without kills.

    ``target="any"`` (the default) picks among all worker processes, including ones still
    starting up; ``"ready"`` only among those that have logged that they started (a tick
    with none ready is skipped), so that every kill lands on a worker that may be running
    jobs.

    ``graph=N``: the jobs are a graph, each depending on 0 to ``N`` (at random) of the
    :data:`GRAPH_WINDOW` jobs enqueued just before it; besides the usual checks, none
    may be left waiting, and every run of a job must start after each of its
    dependencies' last run ended (the run that completed it).

    ``signal_name="term"``, a SIGTERM storm: the same loop and checks, but each tick sends
    SIGTERM (a graceful stop) to a random started worker (``target`` must be ``"ready"``,
    its default then) and spawns its replacement at once, while the stopping one finishes
    within its ``grace``. A share ``long_share`` of the jobs (5 % unless given) lasts
    :data:`LONG_JOBS` times ``grace`` (or ``long_s`` seconds), so that stops hand jobs
    back. Besides the kill storm's checks: every stopped worker exits 0 within ``grace``
    + :data:`STOP_BOUND` seconds; no success is lost (a run that finished before its
    worker's stop began is the run recorded); every re-run is explained by a hand-back,
    which spends no attempt (``attempts`` = runs - hand-backs of a started run, that is
    1) and is counted in ``releases``; no job needed a rescue; no run recorded finished
    later than ``grace`` + :data:`GRACE_SLACK` after its worker's SIGTERM.

    :param slack: seconds a loaded machine may add to the SIGTERM storm's time bounds (the
        test suite's, beside other work); the benchmark holds them exactly (0).
    :param worker_grace: the ``--grace`` the workers are given, if not ``grace``: a fleet
        that overstays the grace the checks hold it to, to show that they catch it.
    :param broken: a deliberately broken mode of the workers (``CHAOS_BROKEN``, see
        ``benchmarks/chaos_app.py``), to show that the checks catch it.
    """
    if signal_name not in ("kill", "term"):
        raise ValueError(f"signal_name must be 'kill' or 'term', not {signal_name!r}")
    term = signal_name == "term"
    target = target or ("ready" if term else "any")
    if target not in ("any", "ready"):
        raise ValueError(f"target must be 'any' or 'ready', not {target!r}")
    if term and target != "ready":
        # Before the CLI installs its handler, SIGTERM just ends the process (-15).
        raise ValueError("a SIGTERM storm stops only workers that have started: target 'ready'")
    if long_share is None:
        long_share = 0.05 if term else 0.0
    if not 0 <= long_share <= 1:
        raise ValueError(f"long_share must be within 0-1, not {long_share!r}")
    rng = random.Random(seed)
    result = ScenarioResult("SIGTERM storm" if term else "Kill storm", backend_of(base_url))
    with Harness(
        "term-storm" if term else "kill-storm",
        base_url,
        workdir,
        stale_after=stale_after,
        max_attempts=max_attempts,
        broken=broken,
    ) as h:
        result.workdir = h.dir
        durations = [rng.uniform(*job_ms) for _ in range(jobs)]
        # Randoms of their own: the kills of a seed are the same with a graph or without,
        # with long jobs or without.
        low, high = long_s or (LONG_JOBS[0] * grace, LONG_JOBS[1] * grace)
        long_ms = (low * 1000, high * 1000)
        long_rng = random.Random(f"long-{seed}")
        longs = 0
        if long_share:
            for index in range(jobs):
                if long_rng.random() < long_share:
                    durations[index] = long_rng.uniform(*long_ms)
                    longs += 1
        edges = random_graph(jobs, graph, random.Random(seed)) if graph else None
        ids = h.enqueue([(chaos_app.work, (round(ms, 1),)) for ms in durations], edges)
        result.add(
            "jobs",
            f"{jobs} x {job_ms[0]:g}-{job_ms[1]:g} ms (mean {sum(durations) / max(jobs, 1):.0f} ms)"
            if not longs
            else f"{jobs - longs} x {job_ms[0]:g}-{job_ms[1]:g} ms and {longs} x "
            f"{long_ms[0] / 1000:g}-{long_ms[1] / 1000:g} s (longer than --grace), shuffled "
            f"(mean {sum(durations) / max(jobs, 1):.0f} ms)",
        )
        if edges is not None:
            result.add("jobs with dependencies", sum(1 for e in edges if e))
            result.add(
                "dependencies (edges)",
                f"{sum(map(len, edges))} (each job on 0-{graph} of the "
                f"{GRAPH_WINDOW} jobs before it; longest chain {_longest_chain(edges)})",
            )
        result.add(
            "workers",
            f"{workers} x {threads} threads, STALE_AFTER={stale_after:g} s, --grace {grace:g} s",
        )
        if settle_timeout is None:
            work_s = sum(durations) / 1000 / (workers * threads)
            settle_timeout = 60 + 4 * work_s + 10 * stale_after
        given = grace if worker_grace is None else worker_grace
        pool = [h.spawn_worker(threads, grace=given) for _ in range(workers)]
        started = time.time()
        # The kill window opens once the first workers are up: killing a fleet that is
        # still importing would test nothing.
        if not wait_for(lambda: all(p.ready() or not p.alive for p in pool), 120, 0.05):
            raise ChaosError(f"workers did not start within 120 s: {pool[0].tail()}")
        opened = time.time()
        result.add("workers up after", f"{opened - started:.1f} s (the kill window opens)")
        victims: list[Proc] = []  # SIGKILLed, or SIGTERMed, by the storm
        stopping: list[Proc] = []  # SIGTERMed and not exited yet
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
                    pool[i] = h.spawn_worker(threads, grace=given)
            stopping = _reap(h, stopping, given)
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
                    victims.append(pool[i])
                    if term:
                        h.send(pool[i], signal.SIGTERM)  # it stops on its own, meanwhile...
                        stopping.append(pool[i])
                    else:
                        h.kill(pool[i])
                    pool[i] = h.spawn_worker(threads, grace=given)  # ...its replacement starts
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
        # The last workers SIGTERMed by the storm may still be in their grace.
        wait_for(lambda: not _reap(h, stopping, given), given + STOP_BOUND + STUCK_AFTER, 0.02)
        for proc in _reap(h, stopping, given):
            h.kill(proc)
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
            "SIGTERMs (each worker replaced at once)"
            if term
            else "SIGKILLs (each worker restarted)",
            f"{len(victims)} (every {kill_every:g} s, target: {target} worker"
            + (f"; {skipped} ticks skipped, no worker ready" if target == "ready" else "")
            + ")",
        )
        if term:
            check_stops(result, victims, grace, slack)
        else:
            result.add("runs interrupted by a kill", runs.interrupted)
        check_completed(result, rows, marks, ids)
        if edges is not None:
            check_graph(result, rows, marks, ids, edges)
        explain_figures(result, runs)
        if term:
            check_hand_backs(result, h, rows, marks, ids, runs, grace, slack)
        rescued = sum(r.rescues for r in rows)
        result.add("rescues recorded (sum of rescues)", rescued)
        if term:
            logged = rescues_logged(h.procs)
            result.add("rescues logged by the workers", logged)
            result.check(
                rescued == 0 and logged == 0,
                f"{rescued} rescue(s) recorded, {logged} logged: a stop that was not graceful "
                "(a graceful stop hands its jobs back; no one should need rescuing)",
            )
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
        if not term:
            result.add(
                "rescue latency p50 / p95 / max: kill -> job rescued (pending again)",
                seconds_text(rescue_delays(h.procs)),
            )
            result.add(
                "rescue latency p50 / p95 / max: kill -> job's next start",
                seconds_text(runs.latencies),
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
        if term:
            result.notes.append(
                f"Stop time: from the harness's SIGTERM to the process's exit (polled every "
                f"20 ms), held to --grace + {STOP_BOUND:g} s: the grace itself, then the "
                "release of the unfinished jobs, the last outcomes, the worker's row marked "
                "stopped, its threads joined and the interpreter's teardown. A worker still "
                f"running {STUCK_AFTER:g} s past that bound is SIGKILLed (and counted over it)."
            )
            result.notes.append(
                "A success lost: a run whose task finished (a done line) before its worker's "
                "SIGTERM, yet is not the run the job's row records (the job ran again, or "
                "ended otherwise). Runs that finished during the grace are counted apart: one "
                "finishing in the grace's last instants may rightly be handed back."
            )
            result.notes.append(
                "A hand-back gives its attempt back: each job's attempts must equal its runs "
                "(start lines) minus its runs handed back unfinished (the worker's log line "
                "'job=N released unfinished at shutdown'), which is 1 here since no job is "
                "killed or rescued; and the sum of releases must equal the hand-backs the "
                "workers logged, of started runs and of jobs claimed ahead and not started."
            )
            result.notes.append(
                f"SIGTERMs pick at random among the {workers} workers that have started "
                "(before the CLI installs its handler a SIGTERM just ends a process); the "
                "replacement is spawned at once, beside the worker still stopping."
            )
        else:
            result.notes.append(
                "Rescue latency, kill -> rescued: from the SIGKILL to the rescuing worker's "
                "log line 'job=N rescued from lost worker W' for every job W held (claimed, "
                "started or not); it spans STALE_AFTER and the rescuer's heartbeat period. "
                "Kill -> next start: to the next start line of each job the killed worker had "
                "started and not finished; it adds the wait for a free thread (a rescued job "
                "keeps its run_at, so it goes ahead of jobs that became due later)."
            )
        if edges is not None:
            result.notes.append(
                "A graph: a dependent is released in the transaction that completes its "
                "last dependency, so a run starting before that is a violation; a release "
                "made twice would show as a run no kill explains (an unexplained duplicate)."
            )
        if not term:
            result.notes.append(
                (
                    f"Kills pick any of the {workers} worker processes at random, including "
                    "ones still starting up (about 1.5 s of CPU each on this machine)"
                    if target == "any"
                    else f"Kills pick at random among the {workers} workers that have started"
                )
                + f"; SQLQUEUE_MAX_ATTEMPTS is {max_attempts} so that a job killed repeatedly "
                "is not sent dead."
            )
    return result


def _reap(h: Harness, stopping: list[Proc], grace: float) -> list[Proc]:
    """The SIGTERMed workers still running (polling each records its exit time); one
    running :data:`STUCK_AFTER` s past its bound is SIGKILLed."""
    left = []
    for proc in stopping:
        if proc.poll() is not None:
            continue
        if time.time() - (proc.terminated_at or 0.0) > grace + STOP_BOUND + STUCK_AFTER:
            h.kill(proc)
            continue
        left.append(proc)
    return left


def check_stops(result: ScenarioResult, victims: list[Proc], grace: float, slack: float) -> None:
    """Every worker SIGTERMed by the storm exited 0 within ``grace`` + :data:`STOP_BOUND`
    (+ ``slack``) seconds of the signal."""
    bound = grace + STOP_BOUND + slack
    times: dict[Proc, float] = {}
    over = []
    for proc in victims:
        if proc.killed_at is not None or proc.ended is None or proc.terminated_at is None:
            over.append(f"pid {proc.pid} still running after {bound + STUCK_AFTER:g} s (SIGKILLed)")
            continue
        times[proc] = proc.ended - proc.terminated_at
        if times[proc] > bound:
            over.append(f"pid {proc.pid} after {times[proc]:.2f} s: {proc.tail(3)}")
    failed = {proc.pid: proc.popen.returncode for proc in times if proc.popen.returncode != 0}
    result.add("SIGTERMed workers exiting 0", f"{len(times) - len(failed)} of {len(victims)}")
    result.add(
        "stop time p50 / p95 / max: SIGTERM -> process exit", seconds_text(list(times.values()))
    )
    result.add(f"stops over --grace + {STOP_BOUND:g} s", len(over))
    result.check(not over, f"{len(over)} worker(s) took over {bound:g} s to stop: {over[:5]}")
    result.check(not failed, f"SIGTERMed workers exited non-zero: {failed}")


def check_hand_backs(
    result: ScenarioResult,
    h: Harness,
    rows: list[Any],
    marks: list[Mark],
    ids: list[int],
    runs: RunAnalysis,
    grace: float,
    slack: float,
) -> None:
    """No success lost at a stop, none recorded past the grace; every hand-back counted in
    ``releases`` and spending no attempt."""
    unfinished, ahead = hand_backs_logged(h.procs)
    result.add("runs handed back unfinished at a stop (logged)", unfinished)
    result.add("jobs claimed ahead handed back before they started (logged)", ahead)
    releases = sum(r.releases for r in rows)
    result.add(
        "hand-backs recorded (sum of releases) / logged", f"{releases} / {unfinished + ahead}"
    )
    result.check(
        releases == unfinished + ahead,
        f"the rows count {releases} hand-back(s) (releases), the workers logged "
        f"{unfinished + ahead}",
    )
    result.add("re-runs explained by a hand-back", runs.causes.get("released", 0))
    wrong = attempts_mismatch(rows, marks, h.procs, ids)
    result.add("jobs whose attempts != runs - runs handed back (i.e. != 1)", len(wrong))
    result.check(
        not wrong,
        f"{len(wrong)} job(s) whose hand-backs spent an attempt or were not counted: {wrong[:5]}",
    )
    successes = unrecorded_successes(rows, marks, h.procs, ids)
    result.add(
        "successes lost: runs done before their worker's SIGTERM, not the run recorded",
        f"{len(successes.lost_before)} of {successes.before}",
    )
    result.check(
        not successes.lost_before,
        f"{len(successes.lost_before)} success(es) lost (done before the stop began, yet "
        f"not the run recorded): {successes.lost_before[:5]}",
    )
    result.add(
        "runs done during a grace: recorded / not (handed back as they finished)",
        f"{successes.in_grace - len(successes.lost_in_grace)} / {len(successes.lost_in_grace)}",
    )
    result.add(
        "runs recorded that finished after their worker's SIGTERM: SIGTERM -> done",
        seconds_text([after for after, _ in successes.recorded_after]),
    )
    late = [text for after, text in successes.recorded_after if after > grace + GRACE_SLACK + slack]
    result.add(f"of them kept past --grace + {GRACE_SLACK:g} s", len(late))
    result.check(
        not late,
        f"{len(late)} run(s) kept past the grace (finished more than --grace + "
        f"{GRACE_SLACK + slack:g} s after the SIGTERM, yet recorded): {late[:5]}",
    )
    result.add(
        "SIGTERM -> next start of each job handed back unfinished, p50 / p95 / max",
        seconds_text(release_delays(marks, h.procs, ids)),
    )


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

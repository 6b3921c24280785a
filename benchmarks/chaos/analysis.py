"""What every scenario checks: runs and duplicates from the marks, rescue delays, completed
jobs against the attempt holding the claim, and the workers' logs."""

from __future__ import annotations

import collections
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from benchmarks.chaos.harness import DONE_BEFORE_KILL
from benchmarks.chaos.harness import FENCED
from benchmarks.chaos.harness import HANDED_BACK
from benchmarks.chaos.harness import LOCKED
from benchmarks.chaos.harness import POOL_RESET
from benchmarks.chaos.harness import RELEASED
from benchmarks.chaos.harness import TRACEBACK
from benchmarks.chaos.harness import Mark
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import error_records
from benchmarks.chaos.harness import job_result
from benchmarks.chaos.harness import worker_pid

# -- analysis shared by the scenarios ----------------------------------------------------------


@dataclass
class RunAnalysis:
    """How the task runs in the side file relate to what the harness did."""

    starts: int = 0
    duplicates: int = 0  # start lines beyond the first of each job
    jobs_rerun: int = 0
    causes: collections.Counter[str] = field(default_factory=collections.Counter)
    unexplained: list[str] = field(default_factory=list)
    attempt_twice: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    interrupted: int = 0  # runs cut short by a kill or a crash
    not_restarted: int = 0  # interrupted runs whose job never started again


def owner(mark: Mark, procs: Sequence[Proc]) -> Proc | None:
    """The process that wrote ``mark``: same pid, alive at that time (pids get reused)."""
    best = None
    for proc in procs:
        if proc.pid != mark.pid or proc.spawned > mark.at + 0.5:
            continue
        if proc.ended is not None and proc.ended < mark.at - 0.5:
            continue
        if best is None or proc.spawned > best.spawned:
            best = proc
    return best


def log_events(procs: Sequence[Proc]) -> tuple[set[tuple[int, int, int]], set[tuple[int, int]]]:
    """From worker logs: fenced outcomes ``(job, attempt, pid)`` and releases ``(job, pid)``."""
    fenced: set[tuple[int, int, int]] = set()
    released: set[tuple[int, int]] = set()
    for proc in procs:
        text = proc.text()
        fenced |= {(int(j), int(a), proc.pid) for j, a in FENCED.findall(text)}
        released |= {(int(j), proc.pid) for j in RELEASED.findall(text)}
    return fenced, released


def analyze_runs(
    marks: Sequence[Mark], procs: Sequence[Proc], job_ids: Sequence[int]
) -> RunAnalysis:
    """Count duplicate executions of ``job_ids`` and explain each one, or not.

    An earlier run of a job (every start but the last) is explained by:

    - ``kill``: its worker was SIGKILLed by the harness after the start, and the run
      wrote no done line or wrote it at most ``DONE_BEFORE_KILL`` s before the kill;
    - ``crash``: its worker died on its own (a poison pill) after the start;
    - ``released``: its worker released the job on SIGTERM (logged);
    - ``fenced``: its worker was alive but lost the claim (a late heartbeat got it
      rescued) and its worker logged that its outcome was dropped.

    Anything else is unexplained. Two starts with the same attempt number are only
    allowed across a release (which gives the attempt back).
    """
    wanted = set(job_ids)
    starts: dict[int, list[Mark]] = collections.defaultdict(list)
    dones: dict[tuple[int, int, int], Mark] = {}
    for mark in marks:
        if mark.job not in wanted:
            continue
        if mark.kind == "start":
            starts[mark.job].append(mark)
        elif mark.kind == "done":
            dones[(mark.job, mark.attempt, mark.pid)] = mark
    fenced, released = log_events(procs)
    result = RunAnalysis()
    for job in sorted(wanted):
        runs = sorted(starts.get(job, []), key=lambda m: m.at)
        result.starts += len(runs)
        if len(runs) > 1:
            result.duplicates += len(runs) - 1
            result.jobs_rerun += 1
        seen: dict[int, Mark] = {}
        for run in runs:
            earlier = seen.get(run.attempt)
            if earlier is not None and (job, earlier.pid) not in released:
                result.attempt_twice.append(
                    f"job {job} attempt {run.attempt} started twice "
                    f"(pid {earlier.pid} at {earlier.at:.3f}, pid {run.pid} at {run.at:.3f})"
                )
            seen[run.attempt] = run
        for run in runs[:-1]:
            cause = _explain(run, owner(run, procs), dones, fenced, released)
            result.causes[cause] += 1
            if cause == "unexplained":
                proc = owner(run, procs)
                result.unexplained.append(
                    f"job {job} attempt {run.attempt} ran on pid {run.pid} at {run.at:.3f} and "
                    f"again later, with no kill, crash, release or fenced outcome to explain it "
                    f"(process: {'unknown' if proc is None else proc.role}, "
                    f"done line: {'yes' if (job, run.attempt, run.pid) in dones else 'no'})"
                )
    # Rescue latency: from each kill or crash to the next start of every interrupted job.
    by_pid: dict[int, list[Mark]] = collections.defaultdict(list)
    for runs in starts.values():
        for run in runs:
            by_pid[run.pid].append(run)
    for proc in procs:
        if proc.role != "worker":
            continue
        died = proc.killed_at
        if died is None and proc.crashed:
            died = proc.ended
        if died is None:
            continue
        for run in by_pid.get(proc.pid, []):
            if run.at > died or owner(run, procs) is not proc:
                continue
            done = dones.get((run.job, run.attempt, run.pid))
            if done is not None and done.at <= died:
                continue
            result.interrupted += 1
            later = [m.at for m in starts[run.job] if m.at > died]
            if later:
                result.latencies.append(min(later) - died)
            else:
                result.not_restarted += 1
    return result


RESCUE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ flask_sqlqueue\.worker: "
    r"job=(\d+) rescued from lost worker (\S+): now (\w+)",
    re.MULTILINE,
)


def _rescues(procs: Sequence[Proc]) -> list[tuple[float, str, Proc | None]]:
    """Each rescue a worker logged ("job=N rescued from lost worker ID"): when, the job,
    and the worker process it names (the newest of that pid spawned by then), if any."""
    by_pid: dict[int, list[Proc]] = collections.defaultdict(list)
    for proc in procs:
        if proc.role == "worker":
            by_pid[proc.pid].append(proc)
    found = []
    for proc in procs:
        for stamp, job, worker, _status in RESCUE_LINE.findall(proc.text()):
            at = (
                time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
            )
            pid = worker_pid(worker)
            lost = [p for p in by_pid.get(pid or -1, []) if p.spawned <= at]
            found.append((at, job, max(lost, key=lambda p: p.spawned) if lost else None))
    return found


def _died(proc: Proc) -> float | None:
    return proc.killed_at if proc.killed_at is not None else proc.ended


def rescue_delays(procs: Sequence[Proc]) -> list[float]:
    """From each harness SIGKILL (or crash) of a worker to the rescue of each of its jobs,
    as logged by the rescuing worker ("job=N rescued from lost worker ID")."""
    delays = []
    for at, _job, victim in _rescues(procs):
        died = None if victim is None else _died(victim)
        if died is not None and died <= at:
            delays.append(at - died)
    return delays


def false_rescues(procs: Sequence[Proc]) -> list[str]:
    """The rescues of a job from a worker process that was alive then: neither killed
    nor exited before the rescue (``job N from pid P``)."""
    alive = []
    for at, job, victim in _rescues(procs):
        died = None if victim is None else _died(victim)
        if victim is not None and (died is None or died > at):
            alive.append(f"job {job} from pid {victim.pid}")
    return alive


def rescues_logged(procs: Sequence[Proc]) -> int:
    """How many rescues the workers logged ("job=N rescued from lost worker ID")."""
    return len(_rescues(procs))


# -- graceful stops (the SIGTERM storm) ---------------------------------------------------------


def hand_backs_logged(procs: Sequence[Proc]) -> tuple[int, int]:
    """The hand-backs the workers logged: runs released unfinished at shutdown ("job=N
    released unfinished at shutdown", one line each) and jobs claimed ahead and handed
    back before they started ("handed back N job(s) claimed ahead and not started")."""
    unfinished = ahead = 0
    for proc in procs:
        text = proc.text()
        unfinished += len(RELEASED.findall(text))
        ahead += sum(int(n) for n in HANDED_BACK.findall(text))
    return unfinished, ahead


def _starts(marks: Sequence[Mark], wanted: set[int]) -> dict[int, list[Mark]]:
    """The start marks of each job of ``wanted``, in the order they were written."""
    starts: dict[int, list[Mark]] = collections.defaultdict(list)
    for mark in marks:
        if mark.kind == "start" and mark.job in wanted:
            starts[mark.job].append(mark)
    return starts


def attempts_mismatch(
    rows: Sequence[Any], marks: Sequence[Mark], procs: Sequence[Proc], job_ids: Sequence[int]
) -> list[str]:
    """The jobs whose ``attempts`` is not their runs (start lines) minus their runs handed
    back unfinished (logged by the releasing worker), or whose ``releases`` is below the
    latter: a hand-back that spent an attempt, or was not counted. Holds when no job was
    killed or rescued (the SIGTERM storm); a kill or a rescue spends an attempt."""
    wanted = set(job_ids)
    starts = _starts(marks, wanted)
    _, released = log_events(procs)
    wrong = []
    for row in rows:
        if row.id not in wanted:
            continue
        runs = starts.get(row.id, [])
        handed = sum(1 for run in runs if (run.job, run.pid) in released)
        if row.attempts != len(runs) - handed or row.releases < handed:
            wrong.append(
                f"job {row.id}: attempts {row.attempts}, {len(runs)} run(s), {handed} of "
                f"them handed back unfinished, releases {row.releases}"
            )
    return wrong


@dataclass
class StopSuccesses:
    """The runs that finished (a done line) on a worker SIGTERMed later or never, and on
    one in its grace, and which of them are not the run their job's row records."""

    before: int = 0
    lost_before: list[str] = field(default_factory=list)
    in_grace: int = 0
    lost_in_grace: list[str] = field(default_factory=list)
    #: For each run recorded that finished after its worker's SIGTERM: how long after.
    recorded_after: list[tuple[float, str]] = field(default_factory=list)


def unrecorded_successes(
    rows: Sequence[Any], marks: Sequence[Mark], procs: Sequence[Proc], job_ids: Sequence[int]
) -> StopSuccesses:
    """Each run with a done line is the run its job's row records (the job completed with
    that run's ``pid:attempt`` as its result, and never started again after it), or a
    success was lost. Split by when the run finished: before its worker's SIGTERM (or on
    a worker never SIGTERMed), or during the grace that followed it."""
    wanted = set(job_ids)
    by_id = {row.id: row for row in rows if row.id in wanted}
    last_start: dict[int, float] = {}
    for mark in marks:
        if mark.kind == "start" and mark.job in wanted:
            last_start[mark.job] = max(mark.at, last_start.get(mark.job, mark.at))
    found = StopSuccesses()
    for mark in marks:
        if mark.kind != "done" or mark.job not in wanted:
            continue
        row = by_id.get(mark.job)
        recorded = (
            row is not None
            and row.status == "completed"
            and str(job_result(row)) == f"{mark.pid}:{mark.attempt}"
            and last_start.get(mark.job, 0.0) <= mark.at
        )
        proc = owner(mark, procs)
        stop = None if proc is None else proc.terminated_at
        text = (
            f"job {mark.job} attempt {mark.attempt} done on pid {mark.pid} at {mark.at:.3f}"
            + ("" if stop is None else f" (its SIGTERM at {stop:.3f})")
            + ("" if row is None else f"; the job is {row.status}, result {job_result(row)!r}")
        )
        if stop is None or mark.at < stop:
            found.before += 1
            if not recorded:
                found.lost_before.append(text)
        else:
            found.in_grace += 1
            if not recorded:
                found.lost_in_grace.append(text)
            else:
                found.recorded_after.append((mark.at - stop, text))
    return found


def release_delays(
    marks: Sequence[Mark], procs: Sequence[Proc], job_ids: Sequence[int]
) -> list[float]:
    """From each worker's SIGTERM to the next start of every job it handed back unfinished
    (logged as released), wherever that job ran next. A run may have started just after
    the signal, before the worker noticed it."""
    wanted = set(job_ids)
    starts = _starts(marks, wanted)
    _, released = log_events(procs)
    delays = []
    for runs in starts.values():
        for run in runs:
            proc = owner(run, procs)
            stop = None if proc is None else proc.terminated_at
            if (run.job, run.pid) not in released or stop is None:
                continue
            later = [m.at for m in runs if m.at > max(stop, run.at)]
            if later:
                delays.append(min(later) - stop)
    return delays


def _explain(
    run: Mark,
    proc: Proc | None,
    dones: dict[tuple[int, int, int], Mark],
    fenced: set[tuple[int, int, int]],
    released: set[tuple[int, int]],
) -> str:
    if proc is None:
        return "unexplained"
    done = dones.get((run.job, run.attempt, run.pid))
    if proc.killed_at is not None and proc.killed_at >= run.at:
        if done is None or proc.killed_at - done.at <= DONE_BEFORE_KILL:
            return "kill"
    if proc.crashed and proc.ended is not None and proc.ended >= run.at:
        return "crash"
    if (run.job, run.pid) in released:
        return "released"
    if (run.job, run.attempt, run.pid) in fenced:
        return "fenced"
    return "unexplained"


def check_completed(
    result: ScenarioResult,
    rows: Sequence[Any],
    marks: Sequence[Mark],
    job_ids: Sequence[int],
    *,
    once: bool = False,
) -> None:
    """Every job in ``job_ids`` completed, its outcome recorded by the attempt holding the
    claim; every attempt beyond the first left an error record. With ``once``: exactly one
    attempt, one start and one done line per job."""
    wanted = set(job_ids)
    by_id = {row.id: row for row in rows if row.id in wanted}
    done_marks = {(m.job, m.attempt, m.pid) for m in marks if m.kind == "done"}
    starts = collections.Counter(m.job for m in marks if m.kind == "start" and m.job in wanted)
    dones = collections.Counter(m.job for m in marks if m.kind == "done" and m.job in wanted)
    statuses = collections.Counter(row.status for row in by_id.values())
    missing = wanted - set(by_id)
    result.add("jobs completed", f"{statuses.get('completed', 0)} of {len(wanted)}")
    lost = len(wanted) - statuses.get("completed", 0)
    result.add("jobs lost (not completed)", lost)
    result.add(
        "left pending / running / dead",
        f"{statuses.get('pending', 0)} / {statuses.get('running', 0)} / {statuses.get('dead', 0)}",
    )
    result.check(not missing, f"{len(missing)} job row(s) disappeared: {sorted(missing)[:10]}")
    not_completed = sorted(r.id for r in by_id.values() if r.status != "completed")
    result.check(
        not not_completed,
        f"{len(not_completed)} job(s) not completed: "
        + ", ".join(f"{i} ({by_id[i].status}, {by_id[i].last_error})" for i in not_completed[:10]),
    )
    wrong_outcome = []
    bad_history = []
    for row in by_id.values():
        if row.status != "completed":
            continue
        value = job_result(row)
        pid, _, attempt = str(value).partition(":")
        if (
            not attempt.isdigit()
            or int(attempt) != row.attempts
            or (row.id, row.attempts, int(pid or 0)) not in done_marks
        ):
            wrong_outcome.append(f"{row.id} (result {value!r}, attempts {row.attempts})")
        if len(error_records(row)) != row.attempts - 1 or row.rescues > row.attempts - 1:
            bad_history.append(
                f"{row.id} (attempts {row.attempts}, rescues {row.rescues}, "
                f"errors {len(error_records(row))})"
            )
    result.add(
        "outcome recorded by the attempt holding the claim",
        f"{len(by_id) - len(wrong_outcome)} of {len(by_id)}",
    )
    result.check(
        not wrong_outcome,
        f"{len(wrong_outcome)} job(s) completed with an outcome not from their latest "
        f"attempt (a stale run's completion got through): {wrong_outcome[:10]}",
    )
    result.check(
        not bad_history,
        f"{len(bad_history)} job(s) whose extra attempts left no error record: {bad_history[:10]}",
    )
    if once:
        twice = sorted(i for i in wanted if starts[i] != 1 or dones[i] != 1)
        result.add("jobs run exactly once", f"{len(wanted) - len(twice)} of {len(wanted)}")
        result.check(
            not twice,
            f"{len(twice)} job(s) not run exactly once: "
            + ", ".join(f"{i} ({starts[i]} starts, {dones[i]} dones)" for i in twice[:10]),
        )
        more = sorted(r.id for r in by_id.values() if r.attempts != 1)
        result.add("jobs with attempts == 1", f"{len(by_id) - len(more)} of {len(by_id)}")
        result.check(
            not more,
            f"{len(more)} job(s) consumed more than one attempt: "
            + ", ".join(f"{i} ({by_id[i].attempts}: {by_id[i].last_error})" for i in more[:10]),
        )


def check_logs(result: ScenarioResult, procs: Sequence[Proc], *, tracebacks: bool = True) -> None:
    """No "database is locked" in any process's output; no traceback in a worker's."""
    locked = [p for p in procs if LOCKED.search(p.text())]
    result.add("processes that saw 'database is locked'", f"{len(locked)} of {len(procs)}")
    result.check(
        not locked,
        "'database is locked' reached: "
        + "; ".join(f"{p.role} pid {p.pid}: {first_match(LOCKED, p.text())}" for p in locked[:5]),
    )
    if tracebacks:
        benign = 0
        traced = []
        for proc in procs:
            lines = proc.text().splitlines()
            spots = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
            pool = [i for i in spots if i and POOL_RESET in lines[i - 1]]
            benign += len(pool)
            if len(spots) > len(pool):
                traced.append(proc)
        result.add("processes with a traceback in their output", len(traced))
        if benign:
            result.add("SQLAlchemy pool tracebacks (rollback on a killed connection)", benign)
        result.check(
            not traced,
            "tracebacks in: "
            + "; ".join(f"{p.role} pid {p.pid} ({p.log.name}): {p.tail(3)}" for p in traced[:5]),
        )


def first_match(pattern: re.Pattern[str], text: str) -> str:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:300]
    return ""


def explain_figures(result: ScenarioResult, runs: RunAnalysis) -> None:
    result.add("task executions (start lines)", runs.starts)
    result.add(
        "duplicate executions (jobs run more than once)", f"{runs.duplicates} ({runs.jobs_rerun})"
    )
    explained = ", ".join(f"{cause}: {n}" for cause, n in sorted(runs.causes.items())) or "-"
    result.add("duplicates by cause", explained)
    result.check(
        not runs.unexplained,
        f"{len(runs.unexplained)} unexplained duplicate execution(s): {runs.unexplained[:5]}",
    )
    result.check(not runs.attempt_twice, f"same attempt run twice: {runs.attempt_twice[:5]}")


def self_exits(procs: Sequence[Proc]) -> list[Proc]:
    return [
        p
        for p in procs
        if p.role == "worker"
        and p.poll() is not None
        and p.killed_at is None
        and p.terminated_at is None
    ]

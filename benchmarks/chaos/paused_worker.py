"""Scenario 2, paused worker: a worker SIGSTOPped past STALE_AFTER, rescued, then resumed."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

from benchmarks import chaos_app
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.harness import SELF_STOP
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import Mark
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import job_result
from benchmarks.chaos.harness import wait_for


def paused_worker(
    base_url: str,
    workdir: Path,
    *,
    job_seconds: float = 3.0,
    stale_after: float = 2.0,
    broken: str | None = None,
) -> ScenarioResult:
    """SIGSTOP a worker mid-job past STALE_AFTER; a second worker rescues and completes the
    job; on SIGCONT the paused worker's late completion must be fenced."""
    title = "Paused worker" + (f" [broken: {broken}]" if broken else "")
    result = ScenarioResult(title, backend_of(base_url))
    with Harness("paused", base_url, workdir, stale_after=stale_after, broken=broken) as h:
        result.workdir = h.dir
        h.enqueue([(chaos_app.work, (job_seconds * 1000,))])
        a = h.spawn_worker(1, grace=job_seconds + 5)

        def start_by(proc: Proc) -> Mark | None:
            marks, _ = h.marks()
            return next((m for m in marks if m.kind == "start" and m.pid == proc.pid), None)

        if not wait_for(lambda: start_by(a) is not None or not a.alive, 60):
            raise ChaosError(f"worker A never started the job: {a.tail()}")
        if not a.alive:
            raise ChaosError(f"worker A exited: {a.tail()}")
        stopped = h.send(a, signal.SIGSTOP)
        b = h.spawn_worker(1)
        limit = 10 * stale_after + job_seconds + 60
        completed = wait_for(lambda: h.counts().get("completed", 0) == 1 or not b.alive, limit, 0.1)
        b_start = start_by(b)
        rescued_in = None if b_start is None else b_start.at - stopped
        result.add("job", f"1 x {job_seconds:g} s, STALE_AFTER={stale_after:g} s")
        result.add(
            "SIGSTOP -> second worker starts the job",
            "never" if rescued_in is None else f"{rescued_in:.2f} s",
        )
        result.check(
            completed and b_start is not None,
            f"the second worker did not complete the job within {limit:.0f} s: {b.tail()}",
        )
        (row,) = h.rows()
        first = (row.status, row.attempts, row.rescues, job_result(row))
        resumed = h.send(a, signal.SIGCONT)
        late = wait_for(
            lambda: any(m.kind == "done" and m.pid == a.pid for m in h.marks()[0]), job_seconds + 30
        )
        # The late outcome is written just after the done line: wait for the worker to log it.
        outcome = re.compile(r"job=\d+ task=\S+ attempt=1/\d+: (?:lost its claim|completed)")
        wait_for(lambda: outcome.search(a.text()) is not None or not a.alive, 15, 0.1)
        # The paused worker's own row was removed by the rescue: it may stop, or carry on
        # under a new id. Either is fine; crashing is not.
        a_exited = wait_for(lambda: not a.alive, 3, 0.1)
        a_exit_after = (a.ended or time.time()) - resumed
        (row,) = h.rows()
        text = a.text()
        result.add(
            "after the rescue: status / attempts / rescues / result", " / ".join(map(str, first))
        )
        result.add("paused worker's late run finished (done line)", "yes" if late else "no")
        result.add(
            "after SIGCONT: status / attempts / rescues / crashes / result",
            f"{row.status} / {row.attempts} / {row.rescues} / {row.crashes} / {job_result(row)}",
        )
        fenced_line = "lost its claim" in text
        result.add("paused worker logged 'lost its claim'", "yes" if fenced_line else "no")
        how = "; ".join(m.group(0) for m in SELF_STOP.finditer(text)) or "no log line about it"
        result.add(
            "paused worker after SIGCONT",
            f"exited {a.popen.returncode} after {a_exit_after:.1f} s ({how})"
            if a_exited
            else f"still running ({how})",
        )
        expected = f"{b.pid}:2"
        result.check(
            late,
            "the paused worker never finished its run after SIGCONT, so its late completion "
            "was not exercised",
        )
        result.check(
            row.status == "completed" and row.attempts == 2 and row.rescues == 1,
            f"job row after SIGCONT is {row.status}, attempts {row.attempts}, rescues "
            f"{row.rescues}; expected completed, 2, 1",
        )
        result.check(
            row.crashes == 0,
            f"the paused worker reported in again, yet its rescue counts as a crash: crashes "
            f"{row.crashes}",
        )
        result.check(
            job_result(row) == expected,
            f"the paused worker's late completion changed the job: result {job_result(row)!r}, "
            f"expected {expected!r} from the rescuing worker's second attempt",
        )
        result.check(fenced_line, "the paused worker did not log that it lost its claim")
        result.check(
            not a_exited or a.popen.returncode == 0,
            f"the paused worker crashed after SIGCONT: exit {a.popen.returncode}: {a.tail()}",
        )
        result.check(b.alive, f"the rescuing worker died: {b.tail()}")
        h.stop([p for p in (a, b) if p.alive], timeout=20)
        check_logs(result, h.procs)
    return result

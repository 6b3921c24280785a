"""Scenario 3, SIGTERM: short jobs finish, long ones are handed back, idle workers exit."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from benchmarks import chaos_app
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.harness import ChaosError
from benchmarks.chaos.harness import Harness
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.harness import backend_of
from benchmarks.chaos.harness import wait_for


def sigterm(
    base_url: str,
    workdir: Path,
    *,
    short_s: float = 0.5,
    long_s: float = 4.0,
    grace: float = 2.0,
    poll: float = 1.0,
    stale_after: float = 2.0,
    slack: float = 0.0,
) -> ScenarioResult:
    """A short job finishes within --grace; a long one is handed back with attempts
    unchanged and runs exactly once later; an idle worker exits within one poll interval.

    :param slack: seconds a loaded machine may add to the idle worker's time bounds (the
        test suite's, beside other work); the benchmark holds them exactly (0).
    """
    result = ScenarioResult("SIGTERM", backend_of(base_url))
    with Harness("sigterm", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        short, long = h.enqueue(
            [(chaos_app.work, (short_s * 1000,)), (chaos_app.work, (long_s * 1000,))]
        )
        result.add(
            "jobs",
            f"short {short_s:g} s, long {long_s:g} s; "
            f"--grace {grace:g} s, --poll-interval {poll:g} s",
        )
        w = h.spawn_worker(2, grace=grace, poll=poll)
        both = wait_for(
            lambda: (
                {m.job for m in h.marks()[0] if m.kind == "start"} == {short, long} or not w.alive
            ),
            60,
        )
        if not both or not w.alive:
            raise ChaosError(f"the worker did not start both jobs: {w.tail()}")
        signalled = h.send(w, signal.SIGTERM)
        try:
            code: int | None = w.popen.wait(timeout=grace + 20)
        except subprocess.TimeoutExpired:
            h.kill(w)
            code = None
        w.poll()
        stop_s = (w.ended or time.time()) - signalled
        by_id = {r.id: r for r in h.rows()}
        s, lg = by_id[short], by_id[long]
        result.add("worker exit code / time after SIGTERM", f"{code} / {stop_s:.2f} s")
        result.check(code == 0, f"the worker exited {code} on SIGTERM: {w.tail()}")
        result.check(
            stop_s < grace + 10, f"the worker took {stop_s:.1f} s to stop (grace {grace:g} s)"
        )
        result.add("short job: status / attempts", f"{s.status} / {s.attempts}")
        result.check(
            s.status == "completed" and s.attempts == 1,
            f"the short job is {s.status} with attempts {s.attempts}; expected completed, 1",
        )
        result.add(
            "long job after SIGTERM: status / attempts / releases / last_error",
            f"{lg.status} / {lg.attempts} / {lg.releases} / {lg.last_error}",
        )
        result.check(
            lg.status == "pending"
            and lg.attempts == 0
            and lg.releases == 1
            and lg.last_error is None
            and lg.worker_id is None,
            f"the long job was not handed back cleanly: {lg.status}, attempts {lg.attempts}, "
            f"releases {lg.releases}, last_error {lg.last_error!r}, worker {lg.worker_id!r}",
        )
        result.check(
            "released unfinished at shutdown" in w.text(), "the worker did not log the release"
        )

        w2 = h.spawn_worker(2, poll=poll)
        done = wait_for(
            lambda: h.counts().get("completed", 0) == 2 or not w2.alive, long_s + 60, 0.1
        )
        result.check(done, f"the released long job did not complete later: {w2.tail()}")
        # w2 is idle now (both jobs completed): it must stop within one poll interval. Its
        # row disappearing is the worker stopping; the process exit adds the interpreter's
        # own teardown (reported, bounded, not held to the poll interval).
        time.sleep(min(poll, 0.5))

        def has_row() -> bool:
            with h.store.read() as conn:
                found = conn.execute(
                    sa.text("SELECT COUNT(*) FROM sqlqueue_workers WHERE pid = :pid"),
                    {"pid": w2.pid},
                ).scalar_one()
            return bool(found)

        registered = has_row()
        idle_signal = h.send(w2, signal.SIGTERM)
        wait_for(lambda: not has_row() or not w2.alive, poll + 20, 0.01)
        row_gone_s = time.time() - idle_signal
        try:
            idle_code: int | None = w2.popen.wait(timeout=poll + 20)
        except subprocess.TimeoutExpired:
            h.kill(w2)
            idle_code = None
        w2.poll()
        idle_s = (w2.ended or time.time()) - idle_signal
        result.add(
            "idle worker after SIGTERM: row removed / process exited (code)",
            f"{row_gone_s:.2f} s / {idle_s:.2f} s ({idle_code})",
        )
        result.check(registered, "the idle worker had no row in sqlqueue_workers")
        result.check(
            row_gone_s <= poll + slack,
            f"the idle worker took {row_gone_s:.2f} s to stop (remove its row); "
            f"expected within one poll interval ({poll:g} s, {slack:g} s of slack)",
        )
        result.check(
            idle_code == 0 and idle_s <= poll + 5 + slack,
            f"the idle worker exited {idle_code} after {idle_s:.2f} s",
        )
        lg = {r.id: r for r in h.rows()}[long]
        marks, _ = h.marks()
        long_starts = [m for m in marks if m.job == long and m.kind == "start"]
        long_dones = [m for m in marks if m.job == long and m.kind == "done"]
        later = [m for m in long_starts if m.at > signalled]
        result.add(
            "long job in the end: status / attempts / releases",
            f"{lg.status} / {lg.attempts} / {lg.releases}",
        )
        result.add(
            "long job runs after the release (starts / dones)", f"{len(later)} / {len(long_dones)}"
        )
        result.check(
            lg.status == "completed" and lg.attempts == 1 and lg.releases == 1,
            f"long job ended {lg.status}, attempts {lg.attempts}, releases {lg.releases}; "
            "expected completed, 1, 1",
        )
        result.check(
            len(later) == 1 and len(long_dones) == 1 and later[0].pid == w2.pid,
            f"the long job did not run exactly once after the release: {later}, dones {long_dones}",
        )
        with h.store.read() as conn:
            leftover = conn.execute(
                sa.text(
                    "SELECT COUNT(*) FROM sqlqueue_workers "
                    "WHERE stopped_at IS NULL OR stop_reason <> 'stopped'"
                )
            ).scalar_one()
        result.add("worker rows not marked stopped", leftover)
        result.check(
            leftover == 0, f"{leftover} worker row(s) not marked stopped after clean exits"
        )
        check_logs(result, h.procs)
    return result

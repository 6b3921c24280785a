"""The chaos suite, fast: real ``flask queue work`` processes, real signals, SQLite.

Every scenario is the one ``python -m benchmarks.chaos`` runs (imported from its module
in ``benchmarks/chaos/``), at a size that fits the test budget. A scenario returns the
figures it measured and the violations it found; a test passes when there are none.

The checks are shown to be able to fail: ``test_unfenced_completion_is_caught`` runs the
paused-worker scenario against workers deliberately broken (``CHAOS_BROKEN=unfenced``:
their completions ignore the claim token, switched on inside the worker processes by
``benchmarks/chaos_app.py``), ``test_a_broken_graceful_stop_is_caught`` runs the SIGTERM
storm against workers that overstay their grace or spend an attempt on a hand-back, and
the tests at the end feed the analysis the evidence of a lost job, an unexplained
duplicate, a double claim, a stale completion and a locked database.

The SIGTERM storm also runs on PostgreSQL and MariaDB when ``SQLQUEUE_TEST_POSTGRES_URL``
/ ``SQLQUEUE_TEST_MYSQL_URL`` are set (as the kill storm over a graph does, in
``tests/test_dependencies.py``); the other scenarios run on SQLite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.chaos.analysis import analyze_runs
from benchmarks.chaos.analysis import check_completed
from benchmarks.chaos.analysis import check_logs
from benchmarks.chaos.analysis import explain_figures
from benchmarks.chaos.busy_storm import busy_storm
from benchmarks.chaos.harness import Mark
from benchmarks.chaos.harness import Proc
from benchmarks.chaos.harness import ScenarioResult
from benchmarks.chaos.kill_storm import kill_storm
from benchmarks.chaos.outage import outage
from benchmarks.chaos.paused_worker import paused_worker
from benchmarks.chaos.poison_pills import poison_pills
from benchmarks.chaos.sigterm import sigterm
from tests.conftest import SERVER_URL_VARS
from tests.waiting import scaled

SQLITE = "sqlite:///"  # each scenario makes a fresh file in its work directory


def passed(result: ScenarioResult) -> bool:
    print(result.markdown())  # the figures, shown by pytest when a test fails or with -s
    return result.ok


def figure(result: ScenarioResult, name: str) -> str:
    return dict(result.figures)[name]


# -- the six scenarios ---------------------------------------------------------------------


@pytest.mark.slow
def test_kill_storm_loses_nothing_and_explains_every_duplicate(tmp_path: Path) -> None:
    # Kills land only on workers that have started, so they interrupt running jobs.
    result = kill_storm(
        SQLITE, tmp_path, jobs=300, job_ms=(10, 50), duration=5, kill_every=0.5, target="ready"
    )
    assert passed(result), result.violations
    assert int(figure(result, "runs interrupted by a kill")) > 0, "the storm hit no running job"
    assert figure(result, "jobs lost (not completed)") == "0"


def _base_urls() -> list[Any]:
    params = [pytest.param(SQLITE, id="sqlite")]
    for kind, var in SERVER_URL_VARS.items():
        url = os.environ.get(var)
        marks = [] if url else [pytest.mark.skip(f"set {var} to run against {kind}")]
        params.append(pytest.param(url or "", id=kind, marks=marks))
    return params


def _term_storm(base_url: str, tmp_path: Path, **options: Any) -> ScenarioResult:
    """A toy SIGTERM storm: 80 jobs, an eighth of them 2.5-4 s long, --grace 1 s, a started
    worker SIGTERMed (and replaced) every 0.5 s for 4 s. A long job SIGTERMed early enough
    (within its first 0.5-2 s) outlasts the grace and the slack for noticing the signal."""
    return kill_storm(
        base_url, tmp_path, jobs=80, job_ms=(10, 50), long_share=0.12, long_s=(2.5, 4.0),
        duration=4, kill_every=0.5, workers=3, signal_name="term", grace=1.0, **options,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("base_url", _base_urls())
def test_sigterm_storm_stops_within_grace_and_loses_no_success(
    base_url: str, tmp_path: Path
) -> None:
    result = _term_storm(base_url, tmp_path, slack=scaled(3.0) - 2.0)
    assert passed(result), result.violations
    # Stops landed on running long jobs, which were handed back and ran again.
    assert int(figure(result, "runs handed back unfinished at a stop (logged)")) > 0
    assert int(figure(result, "re-runs explained by a hand-back")) > 0
    assert figure(result, "stops over --grace + 5 s") == "0"
    assert figure(result, "jobs whose attempts != runs - runs handed back (i.e. != 1)") == "0"
    assert figure(result, "successes lost: runs done before their worker's SIGTERM, not "
                  "the run recorded").startswith("0 of ")  # fmt: skip
    assert figure(result, "rescues recorded (sum of rescues)") == "0"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("broken", "caught"),
    [
        # Workers given --grace 60 while the checks hold them to 1 s: they let every long
        # job finish (within the stop bound), and hand none back.
        ({"worker_grace": 60.0}, "kept past the grace"),
        ({"broken": "spending-release"}, "hand-backs spent an attempt"),
    ],
    ids=["overstaying", "spending-release"],
)
def test_a_broken_graceful_stop_is_caught(
    broken: dict[str, Any], caught: str, tmp_path: Path
) -> None:
    # No slack: an overstaying worker finishes its jobs later still on a busy machine.
    result = _term_storm(SQLITE, tmp_path, **broken)
    assert not passed(result)
    assert any(caught in v for v in result.violations), result.violations


@pytest.mark.slow
def test_paused_worker_late_completion_is_fenced(tmp_path: Path) -> None:
    result = paused_worker(SQLITE, tmp_path, job_seconds=1.5)
    assert passed(result), result.violations
    assert figure(result, "paused worker logged 'lost its claim'") == "yes"


@pytest.mark.slow
def test_unfenced_completion_is_caught(tmp_path: Path) -> None:
    result = paused_worker(SQLITE, tmp_path, job_seconds=1.5, broken="unfenced")
    assert not passed(result)
    assert any("late completion changed the job" in v for v in result.violations)
    assert any("did not log that it lost its claim" in v for v in result.violations)


@pytest.mark.slow
def test_sigterm_finishes_short_releases_long_and_idle_exits(tmp_path: Path) -> None:
    result = sigterm(
        SQLITE, tmp_path, short_s=0.3, long_s=2.5, grace=1.5, poll=2.0, slack=scaled(3.0) - 2.0
    )
    assert passed(result), result.violations


@pytest.mark.slow
def test_poison_pills_end_dead_while_healthy_jobs_complete(tmp_path: Path) -> None:
    result = poison_pills(SQLITE, tmp_path, healthy=40, healthy_ms=(20.0, 100.0))
    assert passed(result), result.violations


@pytest.mark.slow
def test_busy_storm_never_reports_a_locked_database(tmp_path: Path) -> None:
    result = busy_storm(SQLITE, tmp_path, producers=4, per_producer=250)
    assert passed(result), result.violations
    assert figure(result, "PRAGMA integrity_check") == "ok"


@pytest.mark.slow
def test_outage_longer_than_stale_after_burns_no_attempt(tmp_path: Path) -> None:
    # 4 s without the write lock, twice STALE_AFTER: every heartbeat looks stale after it.
    # A heartbeat starved for STALE_AFTER by a busy machine is a lost worker: both scale,
    # the outage staying well inside the workers' 30 s SQLite busy timeout.
    stale_after = min(scaled(2.0), 8.0)
    result = outage(
        SQLITE, tmp_path, jobs=200, job_ms=100, seconds=2 * stale_after, lead=1.0,
        stale_after=stale_after,
    )  # fmt: skip
    assert passed(result), result.violations
    assert figure(result, "jobs rescued (attempt consumed by the outage)") == "0"


# -- the checks can fail -----------------------------------------------------------------------


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[list[Proc]]:
    """Two finished worker processes (real pids) for the analysis to attribute runs to."""
    made = []
    for n in range(2):
        log = tmp_path / f"worker-{n}.log"
        log.write_text("")
        popen = subprocess.Popen([sys.executable, "-c", "pass"])
        popen.wait(timeout=30)
        made.append(Proc("worker", popen, log, spawned=time.time() - 100))
    yield made


def _run(kind: str, job: int, attempt: int, proc: Proc, at: float) -> Mark:
    return Mark(kind, job, attempt, proc.pid, at)


def test_a_duplicate_is_explained_by_a_kill(procs: list[Proc]) -> None:
    killed, other = procs
    t = time.time() - 50
    killed.killed_at = t + 1
    marks = [_run("start", 1, 1, killed, t), _run("start", 1, 2, other, t + 4)]
    marks.append(_run("done", 1, 2, other, t + 5))
    runs = analyze_runs(marks, procs, [1])
    assert runs.duplicates == 1
    assert runs.causes == {"kill": 1}
    assert runs.unexplained == []
    assert runs.latencies == [pytest.approx(3.0)]


def test_an_unexplained_duplicate_and_a_double_claim_are_reported(procs: list[Proc]) -> None:
    a, b = procs  # neither was killed, crashed, released or fenced
    t = time.time() - 50
    marks = [
        _run("start", 1, 1, a, t),
        _run("done", 1, 1, a, t + 1),
        _run("start", 1, 1, b, t + 0.5),  # the same attempt claimed twice
        _run("done", 1, 1, b, t + 1.5),
    ]
    runs = analyze_runs(marks, procs, [1])
    assert runs.causes == {"unexplained": 1}
    assert len(runs.unexplained) == 1
    assert len(runs.attempt_twice) == 1
    result = ScenarioResult("synthetic", "sqlite")
    explain_figures(result, runs)
    assert len(result.violations) == 2


def _row(job_id: int, status: str, attempts: int, result: str | None, errors: int = 0) -> Any:
    return SimpleNamespace(
        id=job_id,
        status=status,
        attempts=attempts,
        rescues=errors,
        result=result,
        errors=json.dumps([{"attempt": n + 1, "type": "WorkerLost"} for n in range(errors)]),
        last_error=None,
    )


def test_a_lost_job_and_a_stale_completion_are_reported(procs: list[Proc]) -> None:
    a, b = procs
    t = time.time() - 50
    marks = [
        _run("start", 1, 1, a, t),
        _run("done", 1, 1, a, t + 1),
        _run("start", 1, 2, b, t + 3),
        _run("done", 1, 2, b, t + 4),
        _run("start", 2, 1, a, t + 5),
    ]
    rows = [
        _row(1, "completed", 2, f'"{a.pid}:1"', errors=1),  # outcome of the stale attempt
        _row(2, "running", 1, None),  # never finished
    ]
    result = ScenarioResult("synthetic", "sqlite")
    check_completed(result, rows, marks, [1, 2])
    assert figure(result, "jobs lost (not completed)") == "1"
    text = " ".join(result.violations)
    assert "not completed" in text
    assert "not from their latest attempt" in text


def test_a_locked_database_in_any_output_is_reported(procs: list[Proc]) -> None:
    procs[1].log.write_text("sqlite3.OperationalError: database is locked\n")
    result = ScenarioResult("synthetic", "sqlite")
    check_logs(result, procs)
    assert figure(result, "processes that saw 'database is locked'") == "1 of 2"
    assert len(result.violations) == 1

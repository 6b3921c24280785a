"""The peers benchmark (``python -m benchmarks.peers``, issue 7) at toy sizes.

Only flask_sqlqueue and the raw ceilings run here: on SQLite, which needs nothing beyond
the project itself (the peers come from the ``bench`` extra and their servers), and on
MariaDB when ``SQLQUEUE_TEST_MYSQL_URL`` is set. What is checked is the harness, not
speed: every figure is backed by a count in the store, and a lost or duplicated job turns
into an error instead of a number.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks import scaling
from benchmarks.peers import harness
from benchmarks.peers.__main__ import concurrency_list
from benchmarks.peers.__main__ import main
from benchmarks.peers.common import BenchError
from benchmarks.peers.systems import Context
from benchmarks.peers.systems import RawSystem
from tests.conftest import ROOT
from tests.waiting import scaled

pytestmark = pytest.mark.slow


def _row(text: str, heading: str, system: str) -> list[str]:
    section = text.split(f"### {heading}", 1)[1].split("###", 1)[0]
    for line in section.splitlines():
        if line.startswith(f"| {system} |"):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"no row for {system} under {heading!r}:\n{section}")


def _report(command: Callable[[list[str]], int], out: Path, options: list[str]) -> str:
    """Run a benchmark's ``main`` with ``options``; its report, which must show no error."""
    code = command([*options, f"--output={out}"])
    text = out.read_text()
    assert code == 0, text
    assert "### Errors\n\nnone" in text
    return text


def _quick(tmp_path: Path, *options: str) -> str:
    quick = ["--quick", "--runs=1", "--jobs=300", "--enqueue-jobs=30", "--samples=3"]
    return _report(main, tmp_path / "peers.md", [*quick, "--concurrency=2", *options])


def _check_store(text: str, store: str, fsq: str, raw: str) -> None:
    for system in (fsq, raw):
        assert _row(text, "Enqueue, one commit", system)[2] != "—"
        assert _row(text, "Bulk enqueue", system)[2] != "—"
        drain = _row(text, "Drain a pre-filled queue of 300 no-op jobs at concurrency 2", system)
        assert drain[2] != "—" and drain[3] != "—"
        assert _row(text, "Peak RSS of a worker process at concurrency 2", system)[2] != "—"
    assert _row(text, "Pickup latency", fsq)[2] != "—"
    assert _row(text, "Drain a pre-filled", fsq)[5].endswith("x")  # ÷ its raw ceiling
    summary = _row(text, "Summary", "drain, 1 process (jobs/s) | " + store)
    assert summary[2] == "2" and summary[-1].endswith("x"), summary
    assert "`python -m flask queue work --concurrency 2`" in _row(text, "How each", fsq)[2]


def test_quick_run_reports_every_workload(tmp_path: Path) -> None:
    text = _quick(tmp_path, "--only=flask_sqlqueue-sqlite,raw-sqlite")
    _check_store(text, "SQLite", "flask_sqlqueue-sqlite", "raw-sqlite")
    target = _row(
        text, "flask_sqlqueue against the targets", "SQLite drain, 1 process ÷ raw-sqlite"
    )
    assert "x " in target[2]


def test_quick_run_on_mariadb(tmp_path: Path) -> None:
    url = os.environ.get("SQLQUEUE_TEST_MYSQL_URL")
    if not url:
        pytest.skip("set SQLQUEUE_TEST_MYSQL_URL to run against MariaDB")
    text = _quick(tmp_path, "--only=flask_sqlqueue-mysql,raw-pymysql", f"--mysql={url}")
    _check_store(text, "MariaDB", "flask_sqlqueue-mysql", "raw-pymysql")


def test_concurrency_list() -> None:
    assert concurrency_list("1,4") == [1, 4]
    assert concurrency_list("4, 1,4") == [4, 1]
    for bad in ("0,4", "", "one"):
        with pytest.raises(argparse.ArgumentTypeError):
            concurrency_list(bad)


def test_a_lost_job_is_an_error_not_a_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "STALL", 2.0)
    system = RawSystem(Context(tmp_path, "", "", None), "sqlite")
    sizes = harness.Sizes(enqueue=1, jobs=50, samples=1, drain_cap=60)
    results = harness.Results()
    with system.fresh():
        system.enqueue_bulk(50)
        with sqlite3.connect(system.worker_argv()[-1]) as conn:  # one job vanishes
            conn.execute("DELETE FROM raw_jobs WHERE id = (SELECT min(id) FROM raw_jobs)")
        with pytest.raises(BenchError, match="stalled: 49 of 50"):
            harness.drain(system, 1, sizes, results, tmp_path)
    assert ("raw-sqlite", "drain1") not in results.values


def test_a_duplicate_is_an_error_not_a_figure(tmp_path: Path) -> None:
    system = RawSystem(Context(tmp_path, "", "", None), "sqlite")
    sizes = harness.Sizes(enqueue=1, jobs=50, samples=1, drain_cap=60)
    results = harness.Results()
    with system.fresh():
        system.enqueue_bulk(50)
        with sqlite3.connect(system.worker_argv()[-1]) as conn:  # one job finishes twice
            conn.execute(
                "INSERT INTO raw_jobs (queue, task, payload, status, run_at, created_at) "
                "SELECT queue, task, payload, 'completed', run_at, created_at FROM raw_jobs "
                "WHERE id = (SELECT min(id) FROM raw_jobs)"
            )
        with pytest.raises(BenchError, match="51"):
            harness.drain(system, 1, sizes, results, tmp_path)
    assert ("raw-sqlite", "drain1") not in results.values


@pytest.mark.parametrize(
    "script, options",
    [
        ("drain.py", ["--jobs", "60", "--concurrency", "1", "--concurrency", "2"]),
        ("latency.py", ["--samples", "3"]),
    ],
)
def test_the_single_measurement_scripts_run(script: str, options: list[str]) -> None:
    """``benchmarks/drain.py`` and ``benchmarks/latency.py`` end to end on SQLite, tiny."""
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            "--database-url",
            "sqlite:///",
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "| sqlite |" in done.stdout, done.stdout


@pytest.mark.parametrize(
    "backend, var, store",
    [
        ("postgres", "SQLQUEUE_TEST_POSTGRES_URL", "PostgreSQL"),
        ("mysql", "SQLQUEUE_TEST_MYSQL_URL", "MariaDB"),
    ],
)
def test_scaling_reports_a_row_per_process_count(
    tmp_path: Path, backend: str, var: str, store: str
) -> None:
    """``python -m benchmarks.scaling`` at toy sizes: a row for each process count, with
    a rate, the database's CPU, its WAL or redo and commits, and the workers' CPU; and
    what a job's whole life costs."""
    url = os.environ.get(var)
    if not url:
        pytest.skip(f"set {var} to run against {store}")
    sizes = ["--processes=1,2", "--jobs=1000", "--concurrency=2", "--quiet=0.2"]
    text = _report(
        scaling.main, tmp_path / "scaling.md", [f"--only={backend}", f"--{backend}={url}", *sizes]
    )
    for processes in ("1", "2"):
        row = _row(text, store, processes)
        rates, own_cpu, log_bytes, commits, worker_cpu = row[1:3], row[3], row[5], row[6], row[8]
        positive = [*rates, own_cpu, worker_cpu, row[-1]]
        if backend == "postgres":  # its own database's figures; MariaDB's are server-wide
            positive += [log_bytes, commits]  # less the other sessions' rates: noisy here
        else:
            float(log_bytes.replace(",", ""))
            float(commits.replace(",", ""))
        for cell in positive:
            assert float(cell.rstrip(" †").replace(",", "")) > 0, (processes, row)
    life = _row(text, "A job's life", store)  # once, at the first process count
    assert life[1] == "1" and "—" not in (life[-2], life[-1]), life

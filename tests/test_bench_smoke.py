"""The peers benchmark (``python -m benchmarks.peers``, issue 7) at toy sizes.

Only flask_sqlqueue and the raw ceilings run here: on SQLite, which needs nothing beyond
the project itself (the peers come from the ``bench`` extra and their servers), and on
MariaDB when ``SQLQUEUE_TEST_MYSQL_URL`` is set. What is checked is the harness, not
speed: every figure is backed by a count (the lines of the job's output file), and a
lost or duplicated job turns into an error instead of a number.
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
from benchmarks.peers.workload import Output
from benchmarks.peers.workload import email_of
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
    quick = ["--quick", "--runs=1", "--jobs=200", "--samples=3", "--concurrency=2"]
    return _report(main, tmp_path / "peers.md", [*quick, *options])


def _check_defaults(text: str, store: str, fsq: str, raw: str) -> None:
    """Section 1: every figure of both systems, the targets, the commands as typed."""
    assert "## 1. At the defaults" in text
    for system in (fsq, raw):
        row = _row(text, "Every system at its defaults", system)
        assert "—" not in row[2:3] + row[4:5] + row[6:7] + row[8:], row
    assert _row(text, "Every system at its defaults", raw)[3].endswith("x")  # ÷ fsq
    first = _row(text, "flask_sqlqueue's targets", f"{store} first job after spawn")
    assert first[2].endswith(" s") and first[3] in ("met", "**not met**"), first
    pickup = _row(text, "flask_sqlqueue's targets", f"{store} pickup p50 ÷ the raw loop's")
    assert pickup[2].endswith("x") and pickup[3] in ("met", "**not met**"), pickup
    ceiling = _row(text, "flask_sqlqueue's targets", f"{store} one-commit enqueue ÷ {raw}")
    assert ceiling[2].endswith("x") and ceiling[3] == "reported", ceiling
    assert _row(text, "How each system ran at the defaults", fsq)[2] == "`flask queue work`"


def _check_matched(text: str, store: str, fsq: str, raw: str) -> None:
    """Section 2 at concurrency 2: drains, bulk fills, latency, RSS, the commands."""
    assert "## 2. At matched settings" in text
    for system in (fsq, raw):
        assert _row(text, "Bulk enqueue", system)[2] != "—"
        drain = _row(text, "Drain a pre-filled queue of 200 jobs at concurrency 2", system)
        assert drain[2] != "—" and drain[3] != "—", drain
        assert _row(text, "Pickup latency, idle worker at concurrency 2", system)[2] != "—"
        assert _row(text, "Peak RSS of a worker process at concurrency 2", system)[2] != "—"
    assert _row(text, "Drain a pre-filled", fsq)[5].endswith("x")  # ÷ its raw ceiling
    summary = _row(text, "Matched settings, summary", "drain, 1 process (jobs/s) | " + store)
    assert summary[2] == "2" and summary[-1].endswith("x"), summary
    command = _row(text, "How each system ran at matched settings", fsq)[2]
    assert command == "`flask queue work --concurrency 2 --log-level warning`", command


SQLITE = ("SQLite", "flask_sqlqueue-sqlite", "raw-sqlite")


def test_quick_run_at_the_defaults(tmp_path: Path) -> None:
    """Section 1 alone (``--section``): the two sections run apart, in two tests."""
    text = _quick(tmp_path, "--only=flask_sqlqueue-sqlite,raw-sqlite", "--section=defaults")
    _check_defaults(text, *SQLITE)
    assert "## 2. At matched settings" not in text


def test_quick_run_at_matched_settings(tmp_path: Path) -> None:
    text = _quick(tmp_path, "--only=flask_sqlqueue-sqlite,raw-sqlite", "--section=matched")
    _check_matched(text, *SQLITE)
    assert "## 1. At the defaults" not in text


def test_quick_run_on_mariadb(tmp_path: Path) -> None:
    """The defaults section, on MariaDB."""
    url = os.environ.get("SQLQUEUE_TEST_MYSQL_URL")
    if not url:
        pytest.skip("set SQLQUEUE_TEST_MYSQL_URL to run against MariaDB")
    only = "--only=flask_sqlqueue-mysql,raw-pymysql"
    text = _quick(tmp_path, only, "--section=defaults", f"--mysql={url}")
    _check_defaults(text, "MariaDB", "flask_sqlqueue-mysql", "raw-pymysql")


def test_concurrency_list() -> None:
    assert concurrency_list("1,4") == [1, 4]
    assert concurrency_list("4, 1,4") == [4, 1]
    for bad in ("0,4", "", "one"):
        with pytest.raises(argparse.ArgumentTypeError):
            concurrency_list(bad)


def _output(tmp_path: Path, ids: list[int]) -> Output:
    path = tmp_path / "out"
    path.write_text("".join(f"{i} {email_of(i)}\n" for i in ids))
    return Output(path)


def test_the_output_file_must_hold_each_job_once(tmp_path: Path) -> None:
    output = _output(tmp_path, [2, 0, 1])
    try:
        assert output.count() == 3
    finally:
        output.close()
    output.check(3)
    with pytest.raises(BenchError, match="ran more than once"):
        _output(tmp_path, [0, 1, 1]).check(3)  # three lines, one job twice, one lost
    with pytest.raises(BenchError, match=r"missing i = \[2\]"):
        _output(tmp_path, [0, 1]).check(3)
    _output(tmp_path, [0, 1]).check(3, complete=False)  # a capped drain
    with pytest.raises(BenchError, match="never enqueued"):
        _output(tmp_path, [0, 1, 3]).check(3)
    (tmp_path / "out").write_text("0 someone@example.com\n")
    with pytest.raises(BenchError, match="a line that no job writes"):
        Output(tmp_path / "out").check(1)


def _raw_queue(tmp_path: Path, jobs: int) -> tuple[RawSystem, harness.Sizes, harness.Results]:
    system = RawSystem(Context(tmp_path, "", "", None), "sqlite")
    return system, harness.Sizes(jobs=jobs, samples=1, drain_cap=60), harness.Results()


def _copy_first_job(system: RawSystem) -> None:
    """The first job enqueued once more, as a queue that hands a job out twice would."""
    with sqlite3.connect(system.worker_argv(system.setting)[-1]) as conn:
        conn.execute(
            "INSERT INTO raw_jobs (queue, task, payload, status, run_at, created_at) "
            "SELECT queue, task, payload, status, run_at, created_at FROM raw_jobs "
            "WHERE id = (SELECT min(id) FROM raw_jobs)"
        )


def _delete_last_job(system: RawSystem) -> None:
    with sqlite3.connect(system.worker_argv(system.setting)[-1]) as conn:
        conn.execute("DELETE FROM raw_jobs WHERE id = (SELECT max(id) FROM raw_jobs)")


def test_a_lost_job_is_an_error_not_a_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "STALL", 1.0)
    system, sizes, results = _raw_queue(tmp_path, 50)
    with system.fresh():
        system.enqueue_bulk(50)
        _delete_last_job(system)
        with pytest.raises(BenchError, match="stalled: 49 of 50"):
            harness.drain(system, 1, sizes, results, tmp_path)
    assert not results.values


def test_a_duplicate_is_an_error_not_a_figure(tmp_path: Path) -> None:
    system, sizes, results = _raw_queue(tmp_path, 50)
    with system.fresh():
        system.enqueue_bulk(50)
        _copy_first_job(system)
        with pytest.raises(BenchError, match="51 jobs finished of 50"):
            harness.drain(system, 1, sizes, results, tmp_path)
    assert not results.values


def test_a_duplicate_and_a_loss_are_an_error_not_a_figure(tmp_path: Path) -> None:
    """As many lines as jobs, but one job twice: the count alone would pass."""
    system, sizes, results = _raw_queue(tmp_path, 50)
    with system.fresh():
        system.enqueue_bulk(50)
        _delete_last_job(system)
        _copy_first_job(system)
        with pytest.raises(BenchError, match="1 job\\(s\\) ran more than once"):
            harness.drain(system, 1, sizes, results, tmp_path)
    assert not results.values


def test_a_wrong_count_is_an_error_row_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer that writes one job twice: the report lists the error, the drains
    give no figure, and the command exits 1."""
    enqueue_batch = RawSystem.enqueue_batch

    def twice(self: RawSystem, jobs: list[tuple[int, str]]) -> None:
        enqueue_batch(self, [*jobs, jobs[0]])

    monkeypatch.setattr(RawSystem, "enqueue_batch", twice)
    out = tmp_path / "peers.md"
    options = ["--quick", "--runs=1", "--jobs=50", "--samples=1", "--concurrency=2"]
    assert main([*options, "--section=matched", "--only=raw-sqlite", f"--output={out}"]) == 1
    text = out.read_text()
    for step in ("fill+drain1", "fill+drain2"):
        assert f"- raw-sqlite / matched {step}: run 1: " in text, text
    drain = _row(text, "Drain a pre-filled queue of 50 jobs at concurrency 2", "raw-sqlite")
    assert drain[2:4] == ["—", "—"], drain


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


def test_history_reports_drains_while_pruning_at_both_paces(tmp_path: Path) -> None:
    """``python -m benchmarks.history`` at toy sizes on SQLite: the rows with history, and
    a drain's rows while pruning at the workers' pace and back to back."""
    out = tmp_path / "history.md"
    options = ["--history=2000", "--prune=1000", "--jobs=40", "--enqueues=5", "--runs=1"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.history", *options, "--only=sqlite", f"--output={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=scaled(300),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    text = out.read_text()
    for figure in (
        "enqueue (jobs/s)",
        "drain steady (jobs/s)",
        "drain steady while pruning at the workers' pace (jobs/s)",
        "drain steady while pruning back to back (jobs/s)",
    ):
        assert f"| sqlite | {figure} |" in text, text
    assert "at the workers' pace (a retention round, then a heartbeat interval" in text, text


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


def _reading(count: int, workers: float) -> scaling.Reading:
    return scaling.Reading(
        at=0.0,
        count=count,
        cpu={},
        own=set(),
        background=set(),
        log=0,
        lsn="",
        commits=0,
        rollbacks=0,
        others=0,
        workers=workers,
    )


def test_a_window_holding_a_few_jobs_opens_earlier_with_startup_in() -> None:
    """The last worker started when 67 of 1,000 jobs were left: CPU counted in clock
    ticks over so few jobs reads 0, so the figures are read from the first finished job
    (marked as including start-up); a window holding enough jobs is kept as it is."""
    window = scaling.Window(server=None, exclude=set())  # type: ignore[arg-type]
    window.start, window.fallback = _reading(0, 0.0), _reading(12, 0.05)
    window.first, window.last = _reading(933, 0.2), _reading(1000, 0.2)
    first, last, startup = window.span(1000)
    assert (first.count, last.count, startup) == (12, 1000, True)
    window.first = _reading(700, 0.1)
    first, last, startup = window.span(1000)
    assert (first.count, last.count, startup) == (700, 1000, False)
    window.fallback = None  # every worker started before a job finished
    window.first = _reading(990, 0.2)
    first, last, startup = window.span(1000)
    assert (first.count, startup) == (0, True)


def test_partitions_reports_both_schemas_and_a_verdict(tmp_path: Path) -> None:
    """``python -m benchmarks.partitions`` at toy sizes on PostgreSQL: the drain and the
    prune of both schemas, the verdict computed from them, and no database left over."""
    url = os.environ.get("SQLQUEUE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set SQLQUEUE_TEST_POSTGRES_URL to run against PostgreSQL")
    from benchmarks import partitions

    admin = url.replace("postgresql+psycopg://", "postgresql://", 1)
    text = _report(
        partitions.main,
        tmp_path / "partitions.md",
        ["--history=4000", "--jobs=300", "--runs=1", f"--postgres={admin}"],
    )
    rows = {
        cells[0]: cells
        for line in text.splitlines()
        if line.startswith("| ")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    for figure in ("drain, jobs/s (median of 1)", "prune one day: seconds"):
        row = rows[figure]
        assert float(row[1].replace(",", "")) > 0 and float(row[2].replace(",", "")) > 0, row
    assert "**Verdict**: partitioned drain " in text, text
    import psycopg

    with psycopg.connect(admin, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'bench_partitions%'"
        ).fetchone()
    assert left == (0,), left


def test_scaling_reads_wal_while_other_sessions_commit_asynchronously() -> None:
    """A reading's WAL position is one ``pg_walinspect`` accepts as an end: with other
    sessions committing without waiting for the flush, the insert position runs ahead
    of the flush point, which PostgreSQL 15 refuses ("cannot accept future end LSN")."""
    url = os.environ.get("SQLQUEUE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set SQLQUEUE_TEST_POSTGRES_URL to run against PostgreSQL")
    import threading

    import psycopg

    plain = scaling.libpq(url)
    stop = threading.Event()
    table = f"scribble_{os.getpid()}"
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (line text)")

    def write() -> None:
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")
            for _ in range(20_000):  # WAL-logged, unlike a temporary table's rows
                if stop.is_set():
                    break
                conn.execute(f"INSERT INTO {table} VALUES (repeat('x', 100))")

    server = scaling.PostgresServer(plain)
    writer = threading.Thread(target=write)
    writer.start()
    try:
        with server.attached(plain):
            for _ in range(30):
                first = server.read(set(), 0)
                # A commit that waits for the flush, as the workers' do in a window.
                with psycopg.connect(plain, autocommit=True) as conn:
                    conn.execute(f"INSERT INTO {table} VALUES ('tick')")
                last = server.read(set(), 0)
                server.attributed(first.lsn, last.lsn)
    finally:
        stop.set()
        writer.join()
        server.close()
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")

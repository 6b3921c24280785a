"""The peers benchmark (``python -m benchmarks.peers``, issue 7) at toy sizes.

Only its two SQLite systems run here, flask_sqlqueue and the raw sqlite3 ceiling, which
need nothing beyond the project itself (the peers come from the ``bench`` extra and their
servers). What is checked is the harness, not speed: every figure is backed by a count in
the store, and a lost or duplicated job turns into an error instead of a number.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from benchmarks.peers import harness
from benchmarks.peers.__main__ import main
from benchmarks.peers.common import BenchError
from benchmarks.peers.systems import Context
from benchmarks.peers.systems import RawSystem

pytestmark = pytest.mark.slow


def _row(text: str, heading: str, system: str) -> list[str]:
    section = text.split(f"### {heading}", 1)[1].split("###", 1)[0]
    for line in section.splitlines():
        if line.startswith(f"| {system} |"):
            return [cell.strip() for cell in line.strip("|").split("|")]
    raise AssertionError(f"no row for {system} under {heading!r}:\n{section}")


def test_quick_run_reports_every_workload(tmp_path: Path) -> None:
    out = tmp_path / "peers.md"
    code = main(
        [
            "--quick",
            "--runs=1",
            "--only=flask_sqlqueue-sqlite,raw-sqlite",
            "--jobs=300",
            "--enqueue-jobs=30",
            "--samples=3",
            f"--output={out}",
        ]
    )
    text = out.read_text()
    assert code == 0, text
    assert "### Errors\n\nnone" in text
    for system in ("flask_sqlqueue-sqlite", "raw-sqlite"):
        assert _row(text, "Enqueue, one commit", system)[2] != "—"
        assert _row(text, "Bulk enqueue", system)[2] != "—"
        drain = _row(text, "Drain a pre-filled", system)
        assert drain[2] != "—" and drain[3] != "—"
        assert _row(text, "Peak RSS", system)[2] != "—"
    assert _row(text, "Pickup latency", "flask_sqlqueue-sqlite")[2] != "—"
    target = _row(
        text, "flask_sqlqueue against the targets", "SQLite drain, 1 process ÷ raw-sqlite"
    )
    assert target[2].endswith("x")


def test_a_lost_job_is_an_error_not_a_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "STALL", 2.0)
    system = RawSystem(Context(tmp_path, "", None, 1), "sqlite")
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
    system = RawSystem(Context(tmp_path, "", None, 1), "sqlite")
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

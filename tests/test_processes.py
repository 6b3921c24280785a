"""Real ``flask queue`` processes on one SQLite file: exactly-once claiming, racing
producers, a worker killed mid-job, and graceful shutdown on SIGTERM.

Tasks report what they did by appending to side files (see ``tests/sample_app.py``).
Every wait is bounded, and every process started here is killed if a test fails.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import workers
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.workers import FLASK
from tests.workers import spawn
from tests.workers import wait_exit


def side_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_line(path: Path, kind: str, tag: str, timeout: float, *procs: Any) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for parts in side_lines(path):
            if parts[:2] == [kind, tag]:
                return parts
        for proc in procs:
            assert proc.poll() is None, f"process exited early with {proc.returncode}"
        time.sleep(0.05)
    pytest.fail(f"no {kind!r} line for {tag!r} within {timeout}s")


def job_rows(app: Flask) -> list[Any]:
    with app.extensions["sqlqueue"].store.read() as conn:
        return list(conn.execute(sa.select(jobs).order_by(jobs.c.id)).all())


def worker_rows(app: Flask) -> list[Any]:
    """Workers that have not stopped (stopped ones keep their row a while, marked)."""
    with app.extensions["sqlqueue"].store.read() as conn:
        query = sa.select(workers).where(workers.c.stopped_at.is_(None))
        return list(conn.execute(query).all())


def flask_run(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    done = subprocess.run(
        [*FLASK, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# -- many workers, one database -----------------------------------------------------------


@pytest.mark.slow
def test_eight_worker_processes_run_every_job_exactly_once(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    side = tmp_path / "side.log"
    total, processes = 5000, 8
    store = app.extensions["sqlqueue"].store
    with app.app_context(), store.write() as conn:  # one transaction: enqueueing stays fast
        ids = {
            sample_app.record.using(session=conn).enqueue(str(side), f"t{n}").id
            for n in range(total)
        }
    assert len(ids) == total

    env = flask_env(database_uri)
    command = [*FLASK, "queue", "work", "--burst"]
    outputs = [tmp_path / f"worker{n}.out" for n in range(processes)]
    started = time.monotonic()
    with ExitStack() as stack:
        procs = [stack.enter_context(spawn(command, env, out)) for out in outputs]
        codes = [
            wait_exit(proc, max(1, 240 - (time.monotonic() - started)), out)
            for proc, out in zip(procs, outputs, strict=True)
        ]
    assert codes == [0] * processes, [out.read_text()[-2000:] for out in outputs]

    lines = side_lines(side)
    starts = collections.Counter(int(parts[2]) for parts in lines if parts[0] == "start")
    dones = collections.Counter(int(parts[2]) for parts in lines if parts[0] == "done")
    assert set(starts) == ids
    assert set(dones) == ids
    not_once = sorted(i for i in ids if starts[i] != 1 or dones[i] != 1)
    assert not not_once, f"jobs not run exactly once: {not_once[:20]}"
    assert {parts[3] for parts in lines} == {"1"}  # every run was a first attempt
    pids = {parts[4] for parts in lines}
    assert len(pids) >= 2, "the work was not shared between processes"

    rows = job_rows(app)
    assert collections.Counter(r.status for r in rows) == {"completed": total}
    assert {r.attempts for r in rows} == {1}
    assert all(r.result == json.dumps(f"t{n}") for n, r in enumerate(rows))
    assert worker_rows(app) == []  # every worker removed its row on exit


PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from tests import sample_app

    uri, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    keys = json.loads(sys.argv[4])
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri})
    with app.app_context():
        sample_app.queue.get_job(0)  # connect and check the schema before the race
        ready.touch()
        deadline = time.monotonic() + 60
        while not go.exists():
            if time.monotonic() > deadline:
                sys.exit("no start signal")
            time.sleep(0.002)
        seen = {}
        for key in keys:
            seen[key] = sample_app.add.using(idempotency_key=key).enqueue(1, 2).id
    print(json.dumps(seen))
    """
)


@pytest.mark.slow
def test_idempotent_enqueue_raced_by_processes(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    producers, keys = 4, [f"hook-{n}" for n in range(50)]
    keys_json = json.dumps(keys)
    go = tmp_path / "go"
    env = flask_env(database_uri)
    ready = [tmp_path / f"ready{n}" for n in range(producers)]
    outputs = [tmp_path / f"producer{n}.out" for n in range(producers)]
    with ExitStack() as stack:
        procs = [
            stack.enter_context(
                spawn(
                    [sys.executable, "-c", PRODUCER, database_uri, str(flag), str(go), keys_json],
                    env,
                    out,
                )
            )
            for flag, out in zip(ready, outputs, strict=True)
        ]
        deadline = time.monotonic() + 60
        while not all(flag.exists() for flag in ready):  # start them all at once
            assert all(proc.poll() is None for proc in procs), [o.read_text() for o in outputs]
            assert time.monotonic() < deadline, "producers did not get ready"
            time.sleep(0.02)
        go.touch()
        codes = [wait_exit(proc, 60, out) for proc, out in zip(procs, outputs, strict=True)]
    assert codes == [0] * producers, [out.read_text()[-2000:] for out in outputs]

    seen = [json.loads(out.read_text().splitlines()[-1]) for out in outputs]
    rows = job_rows(app)
    assert collections.Counter(r.idempotency_key for r in rows) == dict.fromkeys(keys, 1)
    stored = {r.idempotency_key: r.id for r in rows}
    for mapping in seen:
        assert mapping == stored  # every producer got the one job back for every key


# -- crashes and signals ------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_worker_loses_no_job(make_app: Any, database_uri: str, tmp_path: Path) -> None:
    app = make_app()
    side = tmp_path / "side.log"
    with app.app_context():
        job = sample_app.record.enqueue(str(side), "crash", 3.0)
    env = flask_env(database_uri)
    with spawn([*FLASK, "queue", "work"], env, tmp_path / "killed.out") as proc:
        start = wait_for_line(side, "start", "crash", 30, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert int(start[4]) == proc.pid
    assert job.refresh().status is JobStatus.RUNNING  # nobody took it back yet
    (lost,) = worker_rows(app)
    assert lost.pid == proc.pid

    # SQLQUEUE_STALE_AFTER is app config: a small wrapper app sets it.
    (tmp_path / "stale_app.py").write_text(
        "from tests.sample_app import create_app as _create\n\n\n"
        "def create_app():\n"
        '    return _create({"SQLQUEUE_STALE_AFTER": 1})\n'
    )
    stale_env = {
        **env,
        "FLASK_APP": "stale_app:create_app",
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}",
    }
    time.sleep(1.2)  # the dead worker's last heartbeat must be over 1 s old
    out = flask_run(["queue", "rescue"], stale_env)
    assert "Rescued 1 job(s)." in out, out
    assert f"job {job.id}:" in out

    job.refresh()
    assert job.status is JobStatus.PENDING
    assert job.attempts == 1  # the lost attempt counts
    assert job.rescues == 1
    assert job.last_error is not None
    assert "worker lost: " in job.last_error
    assert lost.id in job.last_error
    assert worker_rows(app) == []
    assert [parts[0] for parts in side_lines(side)] == ["start"]

    flask_run(["queue", "work", "--burst"], env)
    job.refresh()
    assert job.status is JobStatus.COMPLETED
    assert job.attempts == 2
    lines = side_lines(side)
    assert [parts[0] for parts in lines] == ["start", "start", "done"]
    assert lines[1][3] == "2"
    assert lines[1][4] != str(proc.pid)


@pytest.mark.slow
def test_sigterm_lets_a_short_job_finish(make_app: Any, database_uri: str, tmp_path: Path) -> None:
    app = make_app()
    side = tmp_path / "side.log"
    with app.app_context():
        job = sample_app.record.enqueue(str(side), "short", 1.5)
    output = tmp_path / "worker.out"
    with spawn([*FLASK, "queue", "work"], flask_env(database_uri), output) as proc:
        wait_for_line(side, "start", "short", 30, proc)
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 20, output)
    assert code == 0, output.read_text()
    assert "SIGTERM" in output.read_text()
    assert job.refresh().status is JobStatus.COMPLETED
    assert job.result == "short"
    assert [parts[0] for parts in side_lines(side)] == ["start", "done"]
    assert worker_rows(app) == []


@pytest.mark.slow
def test_sigterm_hands_back_a_long_job_after_the_grace(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    side = tmp_path / "side.log"
    with app.app_context():
        job = sample_app.record.enqueue(str(side), "long", 60.0)
    output = tmp_path / "worker.out"
    command = [*FLASK, "queue", "work", "--grace", "1"]
    with spawn(command, flask_env(database_uri), output) as proc:
        wait_for_line(side, "start", "long", 30, proc)
        assert job.refresh().attempts == 1
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 20, output)
        stopped_in = time.monotonic() - signalled
    assert code == 0, output.read_text()
    assert stopped_in < 15
    job.refresh()
    assert job.status is JobStatus.PENDING
    assert job.attempts == 0  # the unfinished attempt is not counted
    assert job.releases == 1
    assert job.worker_id is None
    assert job.last_error is None
    assert [parts[0] for parts in side_lines(side)] == ["start"]
    assert worker_rows(app) == []

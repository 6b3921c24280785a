"""Wall-clock steps: real ``flask queue`` processes whose host clock a test sets an hour
forward or back while they run (see ``tests/clock_app.py``).

A step never gets a live worker's jobs rescued, by a running worker or by
``flask queue rescue``, whichever process's clock steps; a worker that was killed is
still rescued; and on a server a worker whose clock jumps ahead does not run delayed
jobs early. Each process steps on its own, which is the race a real step opens on one
machine (one process notices it before another) held open for the whole test.

``machine="other"`` gives the workers a boot id of their own, as if they ran on other
machines: the rescuer then cannot use the boot clock and judges them by the database's
clock and its own watch of their heartbeats (core/liveness.py). On SQLite the queue's
clock is the host's wall clock, so there ``flask queue rescue`` can be misled about
workers of another boot and a rescuer set back cannot judge them: those runs are skipped
(every SQLite worker shares the rescuer's boot on Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue.core import clock as clock_module
from tests import clock_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.conftest import query_dicts
from tests.workers import spawn
from tests.workers import wait_exit

FLASK = [sys.executable, "-m", "flask"]
HOUR = 3600.0
WAIT = 120.0  # the longest any condition is waited for
STALE_AFTER = 5.0  # the processes' SQLQUEUE_STALE_AFTER: a heartbeat every 1.25 s


# Not called `app`: pytest-flask would push a request context around the test.
@pytest.fixture
def queue_app(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The clock app on the test's database, in this process (its clock is not stepped)."""
    make_app()  # the schema
    app = clock_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


class Host:
    """The wall clock of one process: ``step(-3600)`` sets it an hour back."""

    def __init__(self, path: Path, offset: float = 0.0) -> None:
        self.path = path
        self.step(offset)

    def step(self, offset: float) -> None:
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(repr(offset))
        os.replace(scratch, self.path)  # the process never reads a half-written file


def env_for(
    database_uri: str, host: Host | None = None, boot_id: str | None = None
) -> dict[str, str]:
    env = flask_env(database_uri, CLOCK_STALE_AFTER=str(STALE_AFTER))
    env["FLASK_APP"] = "tests.clock_app:create_app"
    if host is not None:
        env["CLOCK_STEP_FILE"] = str(host.path)
    if boot_id is not None:
        env["CLOCK_BOOT_ID"] = boot_id
    return env


def work(queue: str) -> list[str]:
    return [*FLASK, "queue", "work", "--queue", queue, "--poll-interval", "0.2", "--grace", "5"]


def rescue(env: dict[str, str]) -> str:
    done = subprocess.run(
        [*FLASK, "queue", "rescue"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wait_until(predicate: Callable[[], Any], what: str, *alive: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        for proc in alive:
            assert proc.poll() is None, f"{what}: a process exited early ({proc.returncode})"
        time.sleep(0.1)
    pytest.fail(f"timed out after {WAIT}s waiting for {what}")


def job(database_uri: str, job_id: int) -> dict[str, Any]:
    (row,) = query_dicts(database_uri, "SELECT * FROM sqlqueue_jobs WHERE id = :id", id=job_id)
    return row


def worker_of(database_uri: str, pid: int) -> dict[str, Any]:
    """The worker row of process ``pid``: one, unless it was declared dead and went on
    under a new id."""
    rows = query_dicts(database_uri, "SELECT * FROM sqlqueue_workers WHERE pid = :pid", pid=pid)
    assert len(rows) == 1, f"process {pid} registered {len(rows)} times: {rows}"
    return rows[0]


def started(log: Path, job_id: int) -> bool:
    lines = log.read_text().splitlines() if log.exists() else []
    return any(line.split()[1] == str(job_id) for line in lines)


def heartbeats_after_now(database_uri: str, pid: int, *alive: Any) -> None:
    """Wait for a heartbeat of the worker ``pid`` that began after this call: the second
    one to commit from now (the first may have read its clocks before)."""
    seen = {worker_of(database_uri, pid)["last_heartbeat_at"]}

    def new_beat() -> bool:
        beat = worker_of(database_uri, pid)["last_heartbeat_at"]
        fresh = beat not in seen
        seen.add(beat)
        return fresh

    for _ in range(2):
        wait_until(new_beat, "a heartbeat", *alive)


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["same", "other"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_clock_step_on_any_host_rescues_no_live_worker_and_a_dead_one_still(
    queue_app: Flask, database_uri: str, backend: str, tmp_path: Path, machine: str, direction: str
) -> None:
    if backend == "sqlite" and machine == "other" and direction == "backward":
        pytest.skip("SQLite without a shared boot clock judges by the host's wall clock")
    log = tmp_path / "runs.log"
    # forward: the rescuer's clock jumps ahead, the live worker's goes back; backward:
    # the other way round. Either could make one of them look lost to the other.
    rescuer_step, worker_step = (HOUR, -HOUR) if direction == "forward" else (-HOUR, HOUR)
    live_host, dead_host, rescuer_host = (Host(tmp_path / f"{n}.step") for n in "wdr")
    boots = {"w": "boot-of-w", "d": "boot-of-d"} if machine == "other" else {}
    with ExitStack() as stack:
        live = stack.enter_context(
            spawn(work("held"), env_for(database_uri, live_host, boots.get("w")), tmp_path / "w")
        )
        dead = stack.enter_context(
            spawn(work("doomed"), env_for(database_uri, dead_host, boots.get("d")), tmp_path / "d")
        )
        with queue_app.app_context():
            held = clock_app.hold.using(queue="held").enqueue(str(log), str(tmp_path / "go"))
            doomed = clock_app.hold.using(queue="doomed").enqueue(str(log), str(tmp_path / "no"))
        wait_until(lambda: started(log, held.id) and started(log, doomed.id), "both jobs", live)
        rescuer = stack.enter_context(
            spawn(work("idle"), env_for(database_uri, rescuer_host), tmp_path / "r")
        )
        token = job(database_uri, held.id)["claim_token"]

        live_host.step(worker_step)
        rescuer_host.step(rescuer_step)
        heartbeats_after_now(database_uri, live.pid, live, rescuer)

        if not (backend == "sqlite" and machine == "other"):
            for offset in (rescuer_step, 0.0):
                out = rescue(env_for(database_uri, Host(tmp_path / "cli.step", offset)))
                assert out.strip() == "Rescued 0 job(s).", out

        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        # The running rescuer judged the live worker at every heartbeat since the step,
        # the last time when it took back the dead worker's job.
        wait_until(
            lambda: job(database_uri, doomed.id)["status"] == "pending", "the rescue", rescuer
        )
        lost = job(database_uri, doomed.id)
        assert (lost["attempts"], lost["rescues"]) == (1, 1)
        assert worker_of(database_uri, dead.pid)["stop_reason"] == "lost"

        still = job(database_uri, held.id)
        assert (still["status"], still["claim_token"]) == ("running", token)
        assert (still["attempts"], still["rescues"]) == (1, 0)
        assert worker_of(database_uri, live.pid)["stopped_at"] is None

        (tmp_path / "go").touch()
        wait_until(lambda: job(database_uri, held.id)["status"] == "completed", "the job", live)
        done = job(database_uri, held.id)
        assert (done["attempts"], done["rescues"], done["result"]) == (1, 0, "1")
        for proc, out in ((live, tmp_path / "w"), (rescuer, tmp_path / "r")):
            proc.send_signal(signal.SIGTERM)
            assert wait_exit(proc, WAIT, out) == 0, out.read_text()[-3000:]
    assert [line.split()[1] for line in log.read_text().splitlines()].count(str(held.id)) == 1


@pytest.mark.slow
@pytest.mark.parametrize("machine", ["same", "other"])
def test_a_rescue_whose_clock_is_set_back_still_takes_back_a_dead_workers_job(
    queue_app: Flask, database_uri: str, backend: str, tmp_path: Path, machine: str
) -> None:
    if backend == "sqlite" and machine == "other":
        pytest.skip("SQLite without a shared boot clock judges by the host's wall clock")
    log = tmp_path / "runs.log"
    boot_id = "boot-of-d" if machine == "other" else None
    with spawn(work("doomed"), env_for(database_uri, None, boot_id), tmp_path / "d") as dead:
        with queue_app.app_context():
            doomed = clock_app.hold.using(queue="doomed").enqueue(str(log), str(tmp_path / "no"))
        wait_until(lambda: started(log, doomed.id), "the job", dead)
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
    behind = env_for(database_uri, Host(tmp_path / "cli.step", -HOUR))
    wait_until(lambda: "Rescued 1 job(s)." in rescue(behind), "flask queue rescue to take it")
    lost = job(database_uri, doomed.id)
    assert (lost["status"], lost["attempts"], lost["rescues"]) == ("pending", 1, 1)


@pytest.fixture
def server_app(queue_app: Flask, backend: str) -> Flask:
    if backend == "sqlite":
        pytest.skip("SQLite's clock is the host's own: a step moves the queue's time")
    return queue_app


def database_now(database_uri: str, backend: str) -> datetime:
    sql = (
        "SELECT CURRENT_TIMESTAMP AS t"
        if backend == "postgresql"
        else "SELECT UTC_TIMESTAMP(6) AS t"
    )
    value: datetime = query_dicts(database_uri, sql)[0]["t"]
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


@pytest.mark.slow
def test_a_worker_whose_clock_jumps_ahead_runs_no_delayed_job_early(
    server_app: Flask, database_uri: str, tmp_path: Path
) -> None:
    host = Host(tmp_path / "w.step")
    with spawn(work("default"), env_for(database_uri, host), tmp_path / "w") as worker:
        with server_app.app_context():
            first = clock_app.wall.enqueue()  # the worker has read the database's clock
            wait_until(lambda: job(database_uri, first.id)["status"] == "completed", "a job")
            host.step(HOUR)
            # Were it due, the delayed job would be claimed first: it has the priority.
            delayed = clock_app.wall.using(delay=timedelta(minutes=30), priority=10).enqueue()
            probe = clock_app.wall.enqueue()
        wait_until(
            lambda: job(database_uri, probe.id)["status"] == "completed", "the probe", worker
        )
        # The probe ran with the worker's clock an hour ahead.
        assert float(job(database_uri, probe.id)["result"]) > time.time() + HOUR - 600
        assert job(database_uri, delayed.id)["status"] == "pending"
        assert job(database_uri, delayed.id)["attempts"] == 0
        worker.send_signal(signal.SIGTERM)
        assert wait_exit(worker, WAIT, tmp_path / "w") == 0


@pytest.mark.parametrize("step", [HOUR, -HOUR])
def test_a_producer_whose_clock_steps_still_stamps_the_database_time(
    server_app: Flask, database_uri: str, backend: str, monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    store = server_app.extensions["sqlqueue"].store
    with server_app.app_context():
        clock_app.wall.enqueue()  # the producer has read the database's clock
        real = clock_module.utcnow
        monkeypatch.setattr(clock_module, "utcnow", lambda: real() + timedelta(seconds=step))
        before = database_now(database_uri, backend)
        made = clock_app.wall.using(delay=timedelta(minutes=30)).enqueue()
        after = database_now(database_uri, backend)
    assert before - timedelta(seconds=5) <= made.created_at <= after + timedelta(seconds=5)
    assert made.run_at - made.created_at == timedelta(minutes=30)
    assert abs(store.now() - database_now(database_uri, backend)) < timedelta(seconds=5)

"""What ``flask queue work`` tells the people and programs that run it: its Prometheus
port, its liveness and readiness, its health file and systemd's notifications.

Real worker processes on the sample app, scraped and probed over real HTTP; the database
taken away for real (a SQLite write lock held by another connection, a PostgreSQL
database that refuses connections).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from flask_sqlqueue.cli.health import SystemdNotifier
from flask_sqlqueue.core.worker import Health
from flask_sqlqueue.core.worker import WorkerOptions
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.conftest import fresh_database
from tests.conftest import run_flask
from tests.conftest import server_url
from tests.waiting import WAIT
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import queue_work
from tests.workers import running
from tests.workers import stop

ADD = "tests.sample_app.add"
FAILS = "tests.sample_app.always_fails"
#: A short STALE_AFTER: heartbeats every 0.75 s, readiness lost within 3 s of the last.
FAST = {"SQLQUEUE_STALE_AFTER": 3, "SQLQUEUE_SQLITE_BUSY_TIMEOUT": 0.5}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    """``GET http://127.0.0.1:port/path``: the status and the body (also of a 503)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scrape of ``/metrics``: (sample name, sorted labels) -> value."""
    status, text = get(port, "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def attempts(port: int, task: str, outcome: str, name: str = "sqlqueue_attempts_total") -> float:
    labels = (("outcome", outcome), ("queue", "default"), ("task", task))
    return samples(port).get((name, labels), 0.0)


@contextlib.contextmanager
def worker_process(
    database_uri: str, *args: str, config: dict[str, Any] | None = None, **env: str
) -> Iterator[subprocess.Popen[str]]:
    """``flask queue work ARGS`` in a child process; SIGTERM at the end, which must exit 0."""
    environ = flask_env(database_uri, **env)
    if config:
        environ["FLASK_APP"] = f"tests.sample_app:create_app({config!r})"
    pipe: dict[str, Any] = {"stderr": subprocess.PIPE, "text": True}
    with queue_work(database_uri, "--poll-interval", "0.2", *args, env=environ, **pipe) as proc:
        yield proc
        err = stop(proc)
        assert proc.returncode == 0, err


def serving(proc: subprocess.Popen[str], port: int) -> None:
    """Wait for the worker's port to answer (the app loads first)."""

    def up() -> bool:
        assert proc.poll() is None, "the worker exited"
        try:
            return get(port, "/healthz")[0] == 200
        except OSError:
            return False

    wait_for(up, "the worker's /healthz", timeout=WAIT)


# -- metrics --------------------------------------------------------------------------------


def test_the_metrics_port_counts_the_attempts_the_worker_recorded(
    make_app: Any, database_uri: str
) -> None:
    _scrape_after_jobs(make_app, database_uri)


@pytest.mark.sqlite_only
def test_the_metrics_port_counts_the_attempts_its_child_processes_ran(
    make_app: Any, database_uri: str
) -> None:
    # The children are the same on every backend: the parent records and counts.
    _scrape_after_jobs(make_app, database_uri, "--processes", "2")


def _scrape_after_jobs(make_app: Any, database_uri: str, *extra: str) -> None:
    """Run 3 jobs that succeed and 2 that fail for good on a worker with a metrics port;
    its scrape counts each attempt, by outcome, with its duration."""
    app = make_app()
    with app.app_context():
        added = [sample_app.add.enqueue(n, n) for n in range(3)]
        for _ in range(2):
            sample_app.always_fails.using(max_attempts=1).enqueue("down")
    port = free_port()
    with worker_process(database_uri, "--metrics-port", str(port), *extra) as proc:
        serving(proc, port)
        wait_for(
            lambda: attempts(port, ADD, "succeeded") == 3 and attempts(port, FAILS, "failed") == 2,
            "3 successes and 2 failures on the worker's /metrics",
        )
        scrape = samples(port)
        dead = scrape[("sqlqueue_jobs_dead_total", (("queue", "default"), ("task", FAILS)))]
        assert dead == 2
        # Every attempt's duration is observed, in the histogram of its outcome.
        assert attempts(port, ADD, "succeeded", "sqlqueue_attempt_duration_seconds_count") == 3
        assert attempts(port, FAILS, "failed", "sqlqueue_attempt_duration_seconds_count") == 2
        # The worker's own process, and no database gauge (those repeat in every worker).
        assert any(name == "process_resident_memory_bytes" for name, _ in scrape)
        assert not any(name.startswith("sqlqueue_queue_depth") for name, _ in scrape)
        assert get(port, "/nothing")[0] == 404
    with app.app_context():
        assert [job.refresh().result for job in added] == [0, 2, 4]


@pytest.mark.sqlite_only
def test_a_bad_port_host_or_health_file_stops_the_worker_before_it_claims(
    make_app: Any, database_uri: str
) -> None:
    app = make_app()
    with app.app_context():
        job = sample_app.add.enqueue(1, 2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_flask(database_uri, "queue", "work", "--burst", "--metrics-port", str(port))
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: cannot serve metrics on 127.0.0.1:{port}: "), result.stderr
    assert "Address already in use; give --metrics-port a free port" in last
    # An address not of this host (TEST-NET-1) is refused too, naming the other flag.
    result = run_flask(
        database_uri,
        "queue",
        "work",
        "--burst",
        "--metrics-port",
        "9",
        "--metrics-host",
        "192.0.2.1",
    )
    assert result.returncode == 1
    assert "give --metrics-host an address of this host" in result.stderr, result.stderr
    result = run_flask(database_uri, "queue", "work", "--burst", "--health-file", "/nonexistent/h")
    assert result.returncode == 1
    assert "cannot write the health file /nonexistent/h: " in result.stderr, result.stderr
    with app.app_context():
        job.refresh()
    assert job.status == "pending" and job.attempts == 0  # nothing was claimed


@pytest.mark.sqlite_only
def test_without_prometheus_client_the_error_names_the_extra(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    with app.app_context():
        job = sample_app.add.enqueue(1, 2)
    # A prometheus_client that cannot be imported, ahead of the installed one on the path.
    (tmp_path / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    env = flask_env(database_uri)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    result = subprocess.run(
        [sys.executable, "-m", "flask", "queue", "work", "--burst", "--metrics-port", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "pip install 'flask-sqlqueue[prometheus]'" in result.stderr
    with app.app_context():
        job.refresh()
    assert job.status == "pending" and job.attempts == 0


# -- health ----------------------------------------------------------------------------------


@pytest.mark.sqlite_only
def test_health_is_live_and_ready_only_while_the_worker_runs(make_app: Any) -> None:
    app = make_app()
    worker = sample_app.queue.worker(WorkerOptions(stale_after=3, poll_interval=0.05), app)
    beats: list[float] = []
    worker.on_healthy(lambda: beats.append(time.monotonic()))
    worker.on_healthy(lambda: 1 / 0)  # a failing callback is logged, the beats go on
    assert worker.health() == Health(False, False, "the worker is not running")
    with running(worker):
        wait_for(lambda: worker.health() == Health(True, True), "live and ready")
        wait_for(lambda: len(beats) >= 3, "the first beat and two heartbeats")
    assert worker.health() == Health(False, False, "the worker is not running")


def _probe_through_an_outage(
    database_uri: str,
    health_file: Path,
    cut: Any,
    restore: Any,
) -> None:
    """Start a worker; readiness holds while the database works, turns false once
    ``cut()`` took it away, and comes back after ``restore()``. The health file's
    modification time follows the heartbeats that went through."""
    port = free_port()
    with worker_process(
        database_uri,
        "--metrics-port",
        str(port),
        "--health-file",
        str(health_file),
        config={**FAST, "SQLQUEUE_DATABASE_URI": database_uri},
    ) as proc:
        serving(proc, port)
        wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), "ready")
        wait_for(health_file.exists, "the health file")
        first = health_file.stat().st_mtime_ns
        wait_for(lambda: health_file.stat().st_mtime_ns > first, "a second healthy beat")
        cut()
        try:
            wait_for(lambda: get(port, "/readyz")[0] == 503, "readiness lost", timeout=WAIT)
            status, reason = get(port, "/readyz")
            assert status == 503 and ("heartbeat" in reason), reason
            # The reason, not where the database is: no host, port, name or file.
            url = sa.make_url(database_uri)
            where = [str(p) for p in (url.host, url.port, url.database) if p]
            assert not [w for w in where if w in reason], reason
            # No healthy beat while the database is away: the file ages.
            stale = health_file.stat().st_mtime_ns
            time.sleep(scaled(3 * 0.75))
            if get(port, "/readyz")[0] == 503:  # still cut off (it is, until restore())
                assert health_file.stat().st_mtime_ns == stale
        finally:
            restore()
        wait_for(lambda: get(port, "/readyz") == (200, "ok\n"), "ready again", timeout=WAIT)
        assert health_file.stat().st_mtime_ns > stale
        assert get(port, "/healthz") == (200, "ok\n")


@pytest.mark.sqlite_only
def test_readiness_turns_false_while_sqlite_is_locked(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    make_app()
    path = sa.make_url(database_uri).database
    assert path is not None
    holder = sqlite3.connect(path, isolation_level=None, timeout=30)

    def cut() -> None:
        holder.execute("BEGIN EXCLUSIVE")  # every other writer waits, then fails

    def restore() -> None:
        if holder.in_transaction:
            holder.execute("ROLLBACK")

    try:
        _probe_through_an_outage(database_uri, tmp_path / "health", cut, restore)
    finally:
        holder.close()


def test_readiness_turns_false_while_postgresql_refuses_connections(tmp_path: Path) -> None:
    server = server_url("postgresql")  # skips the test when no server is configured
    with fresh_database("postgresql") as uri:
        name = sa.make_url(uri).database
        app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri})
        sample_app.queue.upgrade_database(app=app)
        app.extensions["sqlqueue"].store.engine.dispose()
        admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")

        def cut() -> None:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )

        def restore() -> None:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")

        try:
            _probe_through_an_outage(uri, tmp_path / "health", cut, restore)
        finally:
            admin.dispose()


@pytest.mark.sqlite_only
def test_the_worker_speaks_systemds_notify_protocol(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    make_app()
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(WAIT)
        received: list[str] = []

        def receive(message: str, times: int = 1) -> None:
            while received.count(message) < times:
                received.append(sock.recv(4096).decode())

        with worker_process(
            database_uri,
            config={**FAST, "SQLQUEUE_DATABASE_URI": database_uri},
            NOTIFY_SOCKET=address,
            WATCHDOG_USEC="10000000",
        ):
            receive("READY=1\nSTATUS=claiming jobs")
            receive("WATCHDOG=1", times=2)  # after each heartbeat that went through
        receive("STOPPING=1")
    assert received[0] == "READY=1\nSTATUS=claiming jobs"
    assert received[-1] == "STOPPING=1"


def test_the_notifier_reaches_an_abstract_socket_and_is_quiet_without_one() -> None:
    name = f"sqlqueue-test-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)  # "@name" in $NOTIFY_SOCKET
        sock.settimeout(WAIT)
        notifier = SystemdNotifier("@" + name)
        notifier.healthy()
        notifier.healthy()
        notifier.stopping()
        notifier.stopping()  # once
        got = [sock.recv(4096).decode() for _ in range(3)]
    assert got == ["READY=1\nSTATUS=claiming jobs", "WATCHDOG=1", "STOPPING=1"]
    silent = SystemdNotifier(None)
    assert not silent.active and not silent.send("READY=1")


# -- recycling child processes ---------------------------------------------------------------


@pytest.mark.sqlite_only
def test_children_are_recycled_after_max_jobs_and_no_job_is_lost(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    log = tmp_path / "ran.log"
    with app.app_context():
        jobs = [sample_app.record.enqueue(str(log), f"t{n}") for n in range(9)]
    with worker_process(
        database_uri, "--processes", "2", "--max-jobs-per-child", "2", "--grace", "60"
    ):

        def all_done() -> bool:
            with app.app_context():
                return all(job.refresh().status == "completed" for job in jobs)

        wait_for(all_done, "every job completed", timeout=4 * WAIT)
    with app.app_context():
        assert [job.refresh().attempts for job in jobs] == [1] * 9  # each ran once
    done = [line.split() for line in log.read_text().splitlines() if line.startswith("done")]
    assert sorted(int(job_id) for _, _, job_id, _, _ in done) == [job.id for job in jobs]
    by_pid: dict[str, int] = {}
    for *_, pid in done:
        by_pid[pid] = by_pid.get(pid, 0) + 1
    assert max(by_pid.values()) <= 2, by_pid  # no child ran a third job
    assert len(by_pid) >= 5, by_pid  # 9 jobs, at most 2 per child


@pytest.mark.sqlite_only
@pytest.mark.parametrize("flag", ["--max-jobs-per-child", "--max-memory-per-child"])
def test_recycling_needs_child_processes(make_app: Any, database_uri: str, flag: str) -> None:
    make_app()
    result = run_flask(database_uri, "queue", "work", "--burst", flag, "5")
    assert result.returncode == 2
    assert f"{flag} recycles child processes: give --processes N too" in result.stderr


#: MiB a leaking job keeps, and the limit: a fresh child of the sample app is ~55 MiB
#: resident (~65 on PostgreSQL), well under the limit; one that kept the leak is over it.
LEAK, LIMIT = 100, 130


@pytest.mark.sqlite_only
def test_a_child_over_max_memory_is_replaced_after_its_attempt(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    log, release, err = tmp_path / "ran.log", tmp_path / "release", tmp_path / "worker.err"
    hold = sample_app.hold
    with app.app_context():
        jobs = [
            hold.enqueue(str(log), "small"),
            hold.enqueue(str(log), "small"),
            hold.enqueue(str(log), "leak", LEAK),  # short: seen over as it ends
            hold.enqueue(str(log), "small"),
            hold.enqueue(str(log), "small"),
            hold.enqueue(str(log), "leak", LEAK, str(release)),  # seen over while it runs
            hold.enqueue(str(log), "small"),
        ]
    args = ("--processes", "1", "--max-memory-per-child", str(LIMIT), "--poll-interval", "0.2")

    def pids() -> dict[int, str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return {int(line.split()[2]): line.split()[4] for line in lines}

    with err.open("w") as stderr, queue_work(database_uri, *args, stderr=stderr) as proc:
        # The second leak's child is seen over its limit while that attempt still runs
        # (its successor is started then), before the attempt is let finish.
        wait_for(lambda: "over its limit" in err.read_text(), "the leak seen")
        assert jobs[5].id not in pids()
        release.touch()
        wait_for(lambda: len(pids()) == len(jobs), "every job done", timeout=2 * WAIT)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0, err.read_text()
    ran = pids()
    by_job = [ran[job.id] for job in jobs]
    first, second, third = by_job[0], by_job[3], by_job[6]
    # Each child runs until a leak puts it over; the next job runs in its successor.
    assert by_job == [first] * 3 + [second] * 3 + [third], by_job
    assert len({first, second, third}) == 3, by_job
    with app.app_context():
        assert [job.refresh().attempts for job in jobs] == [1] * len(jobs)
        assert {job.status for job in jobs} == {"completed"}
    done = [line for line in log.read_text().splitlines() if line.startswith("done")]
    assert len(done) == len(jobs)  # none ran twice
    over = [line for line in err.read_text().splitlines() if "over its limit" in line]
    assert [line.split("child process ")[1].split()[0] for line in over] == [first, second]


@pytest.mark.sqlite_only
def test_a_spare_child_runs_the_next_job_when_a_child_is_killed(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    pid_file, log, err = tmp_path / "pid", tmp_path / "ran.log", tmp_path / "worker.err"
    with app.app_context():
        doomed = sample_app.linger.using(max_attempts=1).enqueue(str(pid_file))
        after = sample_app.hold.enqueue(str(log), "after")
    args = ("--processes", "1", "--spare-children", "1", "--poll-interval", "0.2")
    with err.open("w") as stderr, queue_work(database_uri, *args, stderr=stderr) as proc:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), "the first job started")
        busy = int(pid_file.read_text())
        # Beside the busy child, a spare that has loaded the app, started before any kill.
        wait_for(lambda: set(_spawned_children(proc.pid)) - {busy}, "a spare child")
        (spare,) = set(_spawned_children(proc.pid)) - {busy}
        os.kill(busy, signal.SIGKILL)
        wait_for(lambda: log.exists() and "done after" in log.read_text(), "the next job ran")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0, err.read_text()
    (line,) = log.read_text().splitlines()
    assert int(line.split()[4]) == spare  # the spare ran it: no wait for a fresh child
    with app.app_context():
        assert doomed.refresh().status == "dead"  # its one attempt was lost with its child
        assert (after.refresh().status, after.attempts) == ("completed", 1)


@pytest.mark.sqlite_only
def test_spare_children_need_child_processes(make_app: Any, database_uri: str) -> None:
    make_app()
    result = run_flask(database_uri, "queue", "work", "--burst", "--spare-children", "1")
    assert result.returncode == 2
    assert "--spare-children keeps child processes: give --processes N too." in result.stderr


# -- stopping --------------------------------------------------------------------------------


def _spawned_children(pid: int) -> list[int]:
    """The worker's child processes that run tasks (not multiprocessing's resource
    tracker, which exits on its own once the worker is gone)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
    return found


def test_an_idle_process_worker_stops_at_sigterm_with_its_children_and_port(
    make_app: Any, database_uri: str
) -> None:
    make_app()
    port = free_port()
    # A poll interval far longer than the waits below: the stop cannot wait for a poll.
    args = ("--processes", "2", "--poll-interval", "3600", "--metrics-port", str(port))
    with queue_work(database_uri, *args, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:  # the children are up before the start line
            if " started: " in line:
                break
        children = _spawned_children(proc.pid)
        assert len(children) == 2, children
        wait_for(lambda: get(port, "/readyz")[0] == 200, "the worker ready")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=scaled(60))
        took = time.monotonic() - sent
        rest = proc.stderr.read()
    assert code == 0, rest
    # Measured idle: 0.3-0.8 s from SIGTERM to exit (children and port included).
    assert took < scaled(10), took
    stopping = rest.index("SIGTERM: finishing running jobs")
    assert rest.index("stopped: asked to stop; 0 job(s) handed back to pending") > stopping
    # The worker waited for its children: none outlives it, none was left to the
    # parent-death watch that would end it a second later.
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()], children
    with pytest.raises(OSError):  # the port closed with the process
        get(port, "/healthz")


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_idle_connections_to_the_worker_port_are_bounded_and_timed_out(
    make_app: Any, database_uri: str
) -> None:
    from flask_sqlqueue.metrics import WorkerServer

    make_app()
    port = free_port()
    with worker_process(database_uri, "--metrics-port", str(port)) as proc:
        serving(proc, port)
        threads = len(list(Path(f"/proc/{proc.pid}/task").iterdir()))
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(200)]
        try:
            time.sleep(1.0)  # each accepted: a thread for each one served
            grown = len(list(Path(f"/proc/{proc.pid}/task").iterdir())) - threads
            assert grown <= WorkerServer.max_connections, grown
            # The server closes every one of them: unanswered at once beyond the
            # bound, after its timeout for those it served (they never sent a request).
            began = time.monotonic()
            for sock in idle:
                assert sock.recv(1) == b""
            assert time.monotonic() - began < scaled(30.0)
        finally:
            for sock in idle:
                sock.close()
        # And a probe after them is answered as ever.
        assert get(port, "/healthz") == (200, "ok\n")

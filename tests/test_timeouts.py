"""Task timeouts and the process mode, with real ``flask queue work`` processes.

The tasks are in ``tests/timeouts_app.py``; they append ``start``/``done`` lines (tag,
job id, attempt, pid) to a side file, so a test can tell which process ran an attempt.
Every wait is bounded; every process started here is killed if a test fails.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import actions
from flask_sqlqueue.core.models import effects
from flask_sqlqueue.core.worker import Worker
from tests import timeouts_app as tasks
from tests.conftest import flask_env
from tests.test_processes import side_lines
from tests.test_processes import wait_for_line
from tests.waiting import WAIT
from tests.workers import FLASK
from tests.workers import spawn
from tests.workers import wait_exit

APP = "tests.timeouts_app:create_app"


@pytest.fixture
def tapp(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The timeouts app on the test's database (the schema put there by ``make_app``)."""
    make_app()
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def env_for(database_uri: str, **extra: str) -> dict[str, str]:
    env = flask_env(database_uri, **extra)
    env["FLASK_APP"] = APP
    return env


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str, *procs: Any) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for proc in procs:
            assert proc.poll() is None, f"worker exited early with {proc.returncode}"
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout}s")
        time.sleep(0.05)


def lines_of(side: Path, tag: str) -> list[list[str]]:
    return [parts for parts in side_lines(side) if parts[1] == tag]


# -- declaring -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True, "30", [30]])
def test_bad_timeout_is_refused_at_declaration(bad: Any) -> None:
    queue = SQLQueue()
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):

        @queue.task(timeout=bad)
        def job() -> None: ...

    assert len(queue.registry) == 0


def test_bad_isolate_is_refused_and_good_options_are_kept() -> None:
    queue = SQLQueue()
    with pytest.raises(TypeError, match="isolate must be True or False"):
        queue.task(isolate="yes")  # type: ignore[call-overload]

    @queue.task(timeout=2.5, isolate=True)
    def job() -> None: ...

    assert (job.timeout, job.isolate) == (2.5, True)
    assert (tasks.quick.timeout, tasks.quick.isolate) == (None, False)
    assert tasks.stuck.timeout == 1.0


def test_process_mode_options_are_checked(tmp_path: Path) -> None:
    assert WorkerOptions(processes=3).concurrency == 3
    with pytest.raises(ConfigurationError, match="processes or concurrency, not both"):
        WorkerOptions(processes=2, concurrency=3)
    with pytest.raises(ConfigurationError, match="processes must be 0 or more"):
        WorkerOptions(processes=-1)
    app = tasks.create_app({"SQLQUEUE_DATABASE_URI": f"sqlite:///{tmp_path / 'q.db'}"})
    try:
        store = app.extensions["sqlqueue"].store
        with pytest.raises(ConfigurationError, match="need a loader"):
            Worker(store, tasks.queue.registry, WorkerOptions(processes=1))
        result = app.test_cli_runner().invoke(
            args=["queue", "work", "--processes", "2", "--concurrency", "2"]
        )
        assert result.exit_code == 2
        assert "Give --processes or --concurrency, not both." in result.output
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


# -- hard timeouts ----------------------------------------------------------------------------


@pytest.mark.slow
def test_hard_timeout_kills_a_stuck_attempt_and_the_worker_keeps_serving(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    with tapp.app_context():
        stuck = tasks.stuck_anywhere.enqueue(str(side), "stuck")  # timeout=1, max_attempts=2
        after = tasks.quick.enqueue(str(side), "after")
    output = tmp_path / "worker.out"
    command = [*FLASK, "queue", "work", "--processes", "1", "--burst"]
    with spawn(command, env_for(database_uri), output) as proc:
        code = wait_exit(proc, 90, output)
    log = output.read_text()
    assert code == 0, log
    assert "mode=processes (1 children)" in log

    stuck.refresh()
    assert stuck.status is JobStatus.DEAD  # both attempts killed, attempts spent
    assert stuck.attempts == 2
    assert [(e["attempt"], e["type"], e["message"]) for e in stuck.errors] == [
        (1, "JobTimeout", "timed out after 1s"),
        (2, "JobTimeout", "timed out after 1s"),
    ]
    assert stuck.last_error == "JobTimeout: timed out after 1s"
    assert after.refresh().status is JobStatus.COMPLETED  # the same worker served on
    assert after.result == "after"

    runs = lines_of(side, "stuck")
    assert [(kind, attempt) for kind, _, _, attempt, _ in runs] == [("start", "1"), ("start", "2")]
    pids = {int(parts[4]) for parts in side_lines(side)}
    assert proc.pid not in pids  # every attempt ran in a child
    assert runs[0][4] != runs[1][4]  # the killed child was replaced by a fresh one
    assert not any(alive(pid) for pid in pids)

    shown = tapp.test_cli_runner().invoke(args=["queue", "show", str(stuck.id)])
    assert shown.exit_code == 0, shown.output
    assert "JobTimeout: timed out after 1s" in shown.output
    assert "1s (enforced only with --processes)" in shown.output


@pytest.mark.slow
def test_isolated_tasks_on_a_thread_worker(tapp: Flask, database_uri: str, tmp_path: Path) -> None:
    side = tmp_path / "side.log"
    with tapp.app_context():
        stuck = tasks.stuck.enqueue(str(side), "stuck")  # isolate=True, timeout=1
        exits = tasks.exits.enqueue(str(side), "exits")  # os._exit(1) in its child
        quick = tasks.quick.enqueue(str(side), "quick")  # not isolated: runs on a thread
        inside = tasks.inside.enqueue(str(side), "fx-1")
        permanent = tasks.raises.enqueue("permanent")
        retry = tasks.raises.enqueue("retry")
        other = tasks.raises.enqueue("other")
    output = tmp_path / "worker.out"
    with spawn([*FLASK, "queue", "work", "--burst"], env_for(database_uri), output) as proc:
        code = wait_exit(proc, 90, output)
    log = output.read_text()
    assert code == 0, log
    assert "mode=threads, isolated: " in log

    assert stuck.refresh().status is JobStatus.DEAD
    assert [e["type"] for e in stuck.errors] == ["JobTimeout", "JobTimeout"]

    exits.refresh()
    assert exits.status is JobStatus.DEAD
    assert exits.attempts == 1
    assert exits.last_error == "JobProcessDied: the process running the attempt exited with code 1"

    assert quick.refresh().status is JobStatus.COMPLETED
    assert int(lines_of(side, "quick")[0][4]) == proc.pid  # on the worker's own thread

    inside.refresh()
    assert inside.status is JobStatus.COMPLETED, inside.last_error
    result = inside.result
    child = result.pop("pid")
    assert child != proc.pid
    assert result == {
        "id": inside.id,
        "attempts": 1,
        "max_attempts": 1,
        "task": "tests.timeouts_app.inside",
        "effects": [True, False],
        "logged_job": inside.id,
    }
    with tapp.extensions["sqlqueue"].store.read() as conn:
        owners = conn.execute(sa.select(effects.c.job_id).where(effects.c.key == "fx-1")).all()
    assert [owner.job_id for owner in owners] == [inside.id]  # written by the child's engine

    # The child's own exception types and tracebacks steer retries and are recorded.
    permanent.refresh()
    assert permanent.status is JobStatus.DEAD
    assert permanent.attempts == 1
    assert permanent.last_error == "flask_sqlqueue.exceptions.PermanentFailure: no such account"
    assert 'raise PermanentFailure("no such account")' in permanent.errors[0]["traceback"]
    retry.refresh()
    assert retry.status is JobStatus.PENDING
    assert retry.run_at > tapp.extensions["sqlqueue"].store.now() + timedelta(minutes=50)
    other.refresh()
    assert other.status is JobStatus.DEAD
    assert [e["type"] for e in other.errors] == ["KeyError"] * 3
    assert other.last_error == "KeyError: 'other'"


@pytest.mark.slow
def test_a_thread_worker_only_reports_a_timeout(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    with tapp.app_context():
        job = tasks.overruns.enqueue(str(side), "over", 1.5)  # timeout=0.5, not isolated
    output = tmp_path / "worker.out"
    with spawn([*FLASK, "queue", "work", "--burst"], env_for(database_uri), output) as proc:
        code = wait_exit(proc, 60, output)
    log = output.read_text()
    assert code == 0, log
    # Said at start, and when the attempt passes its timeout; the attempt is not stopped.
    assert "have a timeout but run on threads here" in log
    assert "tests.timeouts_app.overruns" in log.split("have a timeout")[0].splitlines()[-1]
    assert f"job={job.id} task=tests.timeouts_app.overruns attempt=1/5: still running" in log
    assert "after its timeout of 0.5s" in log
    job.refresh()
    assert job.status is JobStatus.COMPLETED
    assert job.result == "over"
    assert job.attempts == 1
    assert job.last_error is None
    assert [parts[0] for parts in lines_of(side, "over")] == ["start", "done"]


# -- cancellation, stops and crashes ----------------------------------------------------------


@pytest.mark.slow
def test_cancelling_a_running_isolated_job_stops_its_process(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    store = tapp.extensions["sqlqueue"].store
    with tapp.app_context():
        job = tasks.waits.enqueue(str(side), "long")  # never checks cancel_requested
    output = tmp_path / "worker.out"
    with spawn([*FLASK, "queue", "work"], env_for(database_uri), output) as proc:
        start = wait_for_line(side, "start", "long", 60, proc)
        child = int(start[4])
        assert child != proc.pid
        done = store.run_write(lambda conn: actions.cancel_jobs(conn, [job.id], store.now()))
        assert done.requested == [job.id]
        wait_until(lambda: job.refresh().status is JobStatus.CANCELLED, 20, "the cancel", proc)
        wait_until(lambda: not alive(child), 10, "the child's end", proc)
        with tapp.app_context():
            after = tasks.quick.enqueue(str(side), "after")
        wait_until(lambda: after.refresh().status is JobStatus.COMPLETED, 20, "the next job", proc)
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 20, output)
    assert code == 0, output.read_text()
    assert job.attempts == 1
    assert job.finished_at is not None
    assert job.errors == []  # cancelled, not a failed attempt
    assert [parts[0] for parts in lines_of(side, "long")] == ["start"]


@pytest.mark.slow
def test_sigterm_in_process_mode_hands_back_the_job_and_stops_the_child(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    with tapp.app_context():
        job = tasks.waits.enqueue(str(side), "long")
    output = tmp_path / "worker.out"
    command = [*FLASK, "queue", "work", "--processes", "1", "--grace", "1"]
    with spawn(command, env_for(database_uri), output) as proc:
        child = int(wait_for_line(side, "start", "long", 60, proc)[4])
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, 30, output)
    assert code == 0, output.read_text()
    assert not alive(child)
    job.refresh()
    assert job.status is JobStatus.PENDING  # handed back: the stop burns no attempt
    assert job.attempts == 0
    assert job.releases == 1
    assert job.errors == []


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_lets_the_attempt_finish(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    """What systemd's default KillMode does: SIGTERM to the worker and its children."""
    side = tmp_path / "side.log"
    with tapp.app_context():
        job = tasks.naps.enqueue(str(side), "nap", 2.0)
    output = tmp_path / "worker.out"
    command = [*FLASK, "queue", "work", "--processes", "1", "--grace", "30"]
    # Its own process group, so the test can signal it all.
    with spawn(command, env_for(database_uri), output, new_session=True) as proc:
        wait_for_line(side, "start", "nap", 60, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        code = wait_exit(proc, 30, output)
    assert code == 0, output.read_text()
    job.refresh()
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert job.result == "nap"
    assert [parts[0] for parts in lines_of(side, "nap")] == ["start", "done"]


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_child_ends_when_its_worker_is_killed(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    side = tmp_path / "side.log"
    with tapp.app_context():
        tasks.waits.enqueue(str(side), "long")
    with spawn([*FLASK, "queue", "work"], env_for(database_uri), tmp_path / "w.out") as proc:
        child = int(wait_for_line(side, "start", "long", 60, proc)[4])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    wait_until(lambda: not alive(child), WAIT, "the orphaned child's exit")


@pytest.mark.slow
def test_a_child_that_cannot_load_the_app_stops_a_process_worker_at_start(
    tapp: Flask, database_uri: str, tmp_path: Path
) -> None:
    with tapp.app_context():
        job = tasks.quick.enqueue(str(tmp_path / "side.log"), "never")
    output = tmp_path / "worker.out"
    env = env_for(database_uri, TIMEOUTS_BREAK_CHILD="1")
    command = [*FLASK, "queue", "work", "--processes", "1", "--burst"]
    with spawn(command, env, output) as proc:
        code = wait_exit(proc, 60, output)
    log = output.read_text()
    assert code == 1, log
    assert "child processes cannot run tasks: the child could not load the app" in log
    assert "RuntimeError: this app refuses to load in a child process" in log
    job.refresh()
    assert job.status is JobStatus.PENDING  # nothing was claimed
    assert job.attempts == 0

    # On a thread worker, only the isolated task's attempt fails; the rest runs.
    with tapp.app_context():
        isolated = tasks.inside.enqueue(str(tmp_path / "side.log"), "never")
    command = [*FLASK, "queue", "work", "--burst"]
    with spawn(command, env, output) as proc:
        code = wait_exit(proc, 60, output)
    assert code == 0, output.read_text()
    assert job.refresh().status is JobStatus.COMPLETED
    isolated.refresh()
    assert isolated.status is JobStatus.DEAD  # max_attempts=1
    assert isolated.last_error is not None
    assert isolated.last_error.startswith(
        "JobProcessStartFailed: the child could not load the app: RuntimeError: this app refuses"
    )


def test_status_and_dashboard_say_which_timeouts_are_enforced(tapp: Flask) -> None:
    output = tapp.test_cli_runner().invoke(args=["queue", "status"]).output
    assert "task tests.timeouts_app.stuck: timeout 1s, enforced (isolate=True)" in output
    assert (
        "task tests.timeouts_app.stuck_anywhere: timeout 1s, enforced only with --processes"
        in output
    )
    assert "task tests.timeouts_app.exits: no timeout, enforced (isolate=True)" in output
    assert "tests.timeouts_app.quick" not in output  # neither a timeout nor isolated

    tapp.secret_key = "test"
    tapp.register_blueprint(tasks.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    page = tapp.test_client().get("/q/").get_data(as_text=True)
    assert "Workers prune finished jobs: completed and cancelled 7d, dead 30d" in page
    assert "tests.timeouts_app.stuck_anywhere</a>" in page
    assert "enforced only there" in page


def test_a_child_stopped_by_two_threads_at_once_closes_its_pipe_once() -> None:
    """A busy child is stopped by its job's thread (timeout, lost claim) and by the
    worker's shutdown; two closes of one pipe at once failed with EBADF."""
    import threading

    from flask_sqlqueue.core.isolation import _Child

    inside = 0
    most = 0
    guard = threading.Lock()

    class Pipe:
        def close(self) -> None:
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.2)
            with guard:
                inside -= 1

    class Ended:
        pid = None

        def is_alive(self) -> bool:
            return False

    child = _Child.__new__(_Child)
    child.conn = Pipe()
    child.process = Ended()
    child._stop_lock = threading.Lock()
    stoppers = [threading.Thread(target=child.stop, args=(0,)) for _ in range(2)]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(5)
    assert most == 1

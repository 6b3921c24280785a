"""The crash budget and effects with an outcome, on every backend.

A job whose attempts are lost with their worker (SIGKILLed here, mid-job, in real worker
processes) counts each loss in ``crashes``, apart from its task's own failures, and is
quarantined once they reach ``SQLQUEUE_MAX_CRASHES``: ``dead`` with a ``Quarantined``
last error, shown as quarantined by ``flask queue show``/``list`` and the admin, and
replayed by hand like any dead job. ``current_job.effect(key)`` marks a reservation done
when its block ends, so the dead-letter views can tell a job safe to replay from one
whose reserved effects must be reconciled first.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import current_job
from flask_sqlqueue.core import operations
from flask_sqlqueue.core import roster
from flask_sqlqueue.core.models import effects
from flask_sqlqueue.core.models import workers
from flask_sqlqueue.exceptions import ConfigurationError
from flask_sqlqueue.exceptions import NoJobContext
from tests import crash_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.waiting import WAIT
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import run_burst
from tests.workers import running
from tests.workers import spawn

# Rescues nothing itself (stale after an hour): another worker or `flask queue rescue` does.
WORKER = (
    "from flask_sqlqueue import WorkerOptions\n"
    "from tests import crash_app\n"
    "app = crash_app.create_app()\n"
    "options = WorkerOptions(poll_interval=0.2, stale_after=3600, grace=1)\n"
    "crash_app.queue.worker(options, app).run()\n"
)
# Heartbeats every 0.5 s, so that it learns soon after a pause that it was declared dead.
PAUSED_WORKER = WORKER.replace("stale_after=3600", "stale_after=2")


@pytest.fixture
def app(make_app: Any, database_uri: str) -> Iterator[Flask]:
    """The crash app on the test's database: 2 crashes quarantine, stale after 1 s."""
    make_app()  # the schema
    made = crash_app.create_app(
        {
            "SQLQUEUE_DATABASE_URI": database_uri,
            "SQLQUEUE_MAX_CRASHES": 2,
            "SQLQUEUE_STALE_AFTER": 1,
        }
    )
    made.secret_key = "test"
    made.register_blueprint(
        crash_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    yield made
    made.extensions["sqlqueue"].store.engine.dispose()


def job(app: Flask, job_id: int) -> Any:
    found = crash_app.queue.state(app).store.get_job(job_id)
    assert found is not None
    return found


def cli(app: Flask, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["queue", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def page(app: Flask, path: str) -> str:
    response = app.test_client().get("/q" + path)
    assert response.status_code == 200
    return response.get_data(as_text=True)


def enqueue(app: Flask, task: Any, *args: Any, **kwargs: Any) -> int:
    with app.app_context():
        return task.enqueue(*args, **kwargs).id  # type: ignore[no-any-return]


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def worker_process(database_uri: str, script: str) -> AbstractContextManager[subprocess.Popen[str]]:
    """A worker process running ``script`` on the test's database, for a ``with`` block
    that ends it with SIGKILL if it still runs."""
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    return spawn([sys.executable, "-c", script], flask_env(database_uri), **quiet)


def kill_mid_job(database_uri: str, path: Path, runs: int) -> None:
    """Start a worker process, wait until it runs the hanging job (its ``runs``-th run),
    and SIGKILL it there."""
    with worker_process(database_uri, WORKER) as worker:
        wait_for(
            lambda: len(lines(path)) >= runs or worker.poll() is not None, f"run {runs} to start"
        )
        assert worker.poll() is None, worker.communicate()[1]
        assert lines(path)[-1].split()[2] == str(worker.pid)


def worker_thread(app: Flask) -> Any:
    """A live in-process worker that rescues the jobs of workers silent for 1 s."""
    options = WorkerOptions(poll_interval=0.2, stale_after=1)
    return crash_app.queue.worker(options, app)


# -- the crash budget ----------------------------------------------------------------------------


def test_a_job_that_keeps_killing_its_worker_is_quarantined(
    app: Flask, database_uri: str, tmp_path: Path
) -> None:
    path = tmp_path / "runs.txt"
    job_id = enqueue(app, crash_app.hang, str(path), "mail:1")

    # Crash 1, taken back by `flask queue rescue`: pending again, an attempt spent.
    kill_mid_job(database_uri, path, runs=1)
    wait_for(lambda: "Rescued 1 job(s)." in cli(app, "rescue"), "the rescue of crash 1")
    first = job(app, job_id)
    assert (first.status, first.attempts, first.crashes, first.rescues) == ("pending", 1, 1, 1)
    # Asked from the command line: audited, naming the lost worker.
    entries = operations.audit_entries(crash_app.queue.state(app).store, limit=10)
    (entry,) = [e for e in entries if e.action == "rescue"]
    assert (entry.job_id, entry.actor.startswith("cli:")) == (job_id, True)
    assert entry.detail["status"] == "pending" and entry.detail["lost_worker"]
    assert first.last_error.startswith("WorkerLost: worker lost: ")

    # Crash 2, taken back by a live worker: the budget (2) is spent, attempts are not (5).
    kill_mid_job(database_uri, path, runs=2)
    with running(worker_thread(app)):
        wait_for(lambda: job(app, job_id).status == "dead", "the quarantine")
    ended = job(app, job_id)
    assert (ended.attempts, ended.max_attempts, ended.crashes) == (2, 5, 2)
    assert ended.last_error.startswith("Quarantined: killed its worker 2 times")
    assert [record["type"] for record in ended.errors] == ["WorkerLost", "Quarantined"]
    assert [line.split()[3] for line in lines(path)] == ["True", "False"]

    # Shown as quarantined, with the effect it reserved and never finished.
    failed = enqueue(app, crash_app.fails)
    with app.app_context():
        run_burst(crash_app.queue.worker(WorkerOptions(poll_interval=0.1)))
    assert job(app, failed).status == "dead"
    shown = cli(app, "show", str(job_id))
    assert re.search(r"^status +dead \(quarantined\)$", shown, re.M), shown
    assert re.search(r"^crashes +2/2$", shown, re.M), shown
    assert "  mail:1  (" in shown and "outcome unknown)" in shown
    assert "replay: reserved, outcome unknown: reconcile first: mail:1" in shown
    listed = cli(app, "list", "--quarantined")
    assert re.search(rf"^{job_id} .*dead \(quarantined\)", listed, re.M), listed
    assert not re.search(rf"^{failed} ", listed, re.M), listed
    assert "No jobs match." in cli(app, "list", "--quarantined", "--task", "nothing.here")
    body = page(app, f"/jobs/{job_id}")
    assert 'id="sqlqueue-quarantined"' in body and "killed its worker 2 times" in body
    assert "reserved, outcome unknown: reconcile first: mail:1" in body
    dead_list = page(app, "/jobs?status=dead")
    assert dead_list.count("muted quarantined") == 1

    # Replayed by hand like any dead job: a fresh crash budget.
    assert cli(app, "retry", str(job_id)).strip() == "Replayed 1 job(s)."
    replayed = job(app, job_id)
    assert (replayed.status, replayed.attempts, replayed.crashes) == ("pending", 0, 0)


def test_a_crash_still_spends_an_attempt(app: Flask, database_uri: str, tmp_path: Path) -> None:
    # max_attempts=1 means one start, crash or not: the lost attempt ends the job, and
    # it is dead for its attempts, not quarantined (1 crash of 2).
    path = tmp_path / "runs.txt"
    with app.app_context():
        job_id = crash_app.hang.using(max_attempts=1).enqueue(str(path), "mail:2").id
    kill_mid_job(database_uri, path, runs=1)
    wait_for(lambda: "Rescued 1 job(s)." in cli(app, "rescue"), "the rescue")
    ended = job(app, job_id)
    assert (ended.status, ended.attempts, ended.crashes) == ("dead", 1, 1)
    assert ended.last_error.startswith("WorkerLost: ")
    shown = cli(app, "show", str(job_id))
    assert re.search(r"^status +dead$", shown, re.M), shown
    assert "No jobs match." in cli(app, "list", "--quarantined")


# Rescues with the fixture's budget and staleness, in a process of its own: one the test
# can give up on while a paused worker holds a lock it waits for.
RESCUE = (
    "from tests import crash_app\n"
    "app = crash_app.create_app({'SQLQUEUE_MAX_CRASHES': 2, 'SQLQUEUE_STALE_AFTER': 1})\n"
    "print(app.test_cli_runner().invoke(args=['queue', 'rescue']).output)\n"
)


def pause_until_rescued(worker: subprocess.Popen[str], database_uri: str) -> None:
    """SIGSTOP ``worker`` until ``flask queue rescue`` has taken its job back. A worker
    stopped inside a write transaction (a heartbeat, a claim) holds its lock: the rescue
    then waits, and the worker runs on a moment before it is stopped again."""
    deadline = time.monotonic() + WAIT
    worker.send_signal(signal.SIGSTOP)
    time.sleep(1.2)  # past the rescuer's STALE_AFTER
    while time.monotonic() < deadline:
        try:
            rescue = subprocess.run(
                [sys.executable, "-c", RESCUE],
                env=flask_env(database_uri),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=scaled(5),
            )
        except subprocess.TimeoutExpired:
            worker.send_signal(signal.SIGCONT)
            time.sleep(0.05)
            worker.send_signal(signal.SIGSTOP)
            continue
        if "Rescued 1 job(s)." in rescue.stdout:
            return
        time.sleep(0.2)
    raise AssertionError("no rescue took the paused worker's job")


@pytest.mark.slow
def test_a_worker_paused_three_times_spends_no_crash(
    app: Flask, database_uri: str, tmp_path: Path
) -> None:
    """SIGSTOPped past STALE_AFTER three times, mid-job: each time rescued, counted as a
    crash while it is silent; each time it comes back (SIGCONT), reports in and takes
    the crash back. Its attempts ran; the job completes, never quarantined (budget 2)."""
    path = tmp_path / "runs.txt"
    job_id = enqueue(app, crash_app.naps, str(path), 3.0)
    with paused_worker(database_uri) as worker:  # SIGKILL ends it paused or not
        for attempt in (1, 2, 3):
            wait_for(
                lambda a=attempt: len(lines(path)) >= a or worker.poll() is not None,
                f"attempt {attempt} to start",
            )
            assert worker.poll() is None, worker.communicate()[1]
            pause_until_rescued(worker, database_uri)
            lost = job(app, job_id)
            assert (lost.status, lost.attempts, lost.crashes) == ("pending", attempt, 1), lost
            worker.send_signal(signal.SIGCONT)
            wait_for(lambda: job(app, job_id).crashes == 0, f"rescue {attempt} taken back")
        wait_for(lambda: job(app, job_id).status == "completed", "the job to complete")
    done = job(app, job_id)
    assert (done.attempts, done.rescues, done.crashes, done.result) == (4, 3, 0, 4)
    assert [r["type"] for r in done.errors] == ["WorkerLost"] * 3
    assert all(r["came_back"] and "not counted as a crash" in r["message"] for r in done.errors)
    assert [line.split()[1] for line in lines(path)] == ["1", "2", "3", "4"]


def paused_worker(database_uri: str) -> AbstractContextManager[subprocess.Popen[str]]:
    return worker_process(database_uri, PAUSED_WORKER)


@pytest.mark.slow
def test_a_quarantine_by_paused_workers_is_taken_back_when_they_return(
    app: Flask, database_uri: str, tmp_path: Path
) -> None:
    """Two workers paused in turn under one job, neither back before the next rescue:
    the second rescue spends the budget (2) and quarantines the job. The second worker
    reports in: the job is pending again and completes; the first reports in: 0 crashes."""
    path = tmp_path / "runs.txt"
    job_id = enqueue(app, crash_app.naps, str(path), 3.0)
    with ExitStack() as workers_started:
        first = workers_started.enter_context(paused_worker(database_uri))
        wait_for(lambda: len(lines(path)) >= 1 or first.poll() is not None, "attempt 1")
        pause_until_rescued(first, database_uri)
        second = workers_started.enter_context(paused_worker(database_uri))
        wait_for(lambda: len(lines(path)) >= 2 or second.poll() is not None, "attempt 2")
        assert lines(path)[-1].split()[2] == str(second.pid)
        pause_until_rescued(second, database_uri)
        ended = job(app, job_id)
        assert (ended.status, ended.crashes) == ("dead", 2), ended
        assert ended.last_error.startswith("Quarantined: killed its worker 2 times")

        second.send_signal(signal.SIGCONT)
        wait_for(lambda: job(app, job_id).status == "completed", "the job to complete")
        assert job(app, job_id).crashes == 1
        first.send_signal(signal.SIGCONT)
        wait_for(lambda: job(app, job_id).crashes == 0, "the first rescue taken back")
    done = job(app, job_id)
    assert (done.status, done.attempts, done.rescues, done.result) == ("completed", 3, 2, 3)
    assert [r["type"] for r in done.errors] == ["WorkerLost", "WorkerLost"]
    assert all(r["came_back"] for r in done.errors)


def test_a_live_worker_whose_heartbeat_waits_is_not_rescued(
    app: Flask, database_uri: str, tmp_path: Path
) -> None:
    """A worker whose heartbeat write waits behind another transaction (here one that
    holds the database's write lock, or the worker's row) looks stale by its row, but
    its beat file, stamped by a thread that never waits for the database, is fresh: a
    rescuer of the same boot takes nothing. Once the worker is killed, the file goes
    stale too and its job is rescued."""
    store = crash_app.queue.state(app).store
    assert store.beats is not None
    path = tmp_path / "runs.txt"
    job_id = enqueue(app, crash_app.naps, str(path), 3600.0)
    with paused_worker(database_uri) as worker:
        wait_for(lambda: len(lines(path)) >= 1 or worker.poll() is not None, "the job to start")
        assert worker.poll() is None, worker.communicate()[1]
        with store.read() as conn:
            (worker_id,) = conn.execute(
                sa.select(workers.c.id).where(workers.c.pid == worker.pid)
            ).scalars()
        with store.write() as conn:
            # SQLite: this transaction holds the one write lock; a server: the row.
            conn.execute(
                sa.select(workers.c.id).where(workers.c.id == worker_id).with_for_update()
            ).all()
            time.sleep(2.0)  # past the rescuer's 1 s, without a heartbeat of its row
            stale = conn.execute(
                sa.select(workers.c.id).where(sa.not_(roster.heartbeat_fresh(store, 1.0)))
            ).scalars()
            assert list(stale) == [worker_id]
            assert roster.rescue_in(store, conn, 1.0) == []
        assert job(app, job_id).status == "running"

        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=WAIT)
        time.sleep(1.2)
        rescued = roster.rescue(store, 1.0)
        assert [(i, status) for i, status, _ in rescued] == [(job_id, "pending")]
    # The killed worker's file is swept once it is not a live worker's.
    assert store.beats.path(worker_id).exists(), sorted(store.beats.folder.iterdir())
    store.beats.prune(set(), older_than=0)
    assert not store.beats.path(worker_id).exists()


def test_a_task_that_raises_never_counts_a_crash(app: Flask) -> None:
    job_id = enqueue(app, crash_app.fails)
    with app.app_context():
        run_burst(crash_app.queue.worker(WorkerOptions(poll_interval=0.1)))
    ended = job(app, job_id)
    assert (ended.status, ended.attempts, ended.crashes) == ("dead", 2, 0)
    assert "(quarantined)" not in cli(app, "show", str(job_id))
    assert 'id="sqlqueue-quarantined"' not in page(app, f"/jobs/{job_id}")
    assert "No jobs match." in cli(app, "list", "--quarantined")


def test_the_crash_budget_is_a_whole_number_of_one_or_more(tmp_path: Path) -> None:
    config = {"SQLQUEUE_DATABASE_URI": f"sqlite:///{tmp_path / 'queue.db'}"}
    assert (
        crash_app.queue_app("budget", SQLQueue(), config)
        .extensions["sqlqueue"]
        .settings.max_crashes
        == 3
    )
    given = {**config, "SQLQUEUE_MAX_CRASHES": "7"}
    assert (
        crash_app.queue_app("given", SQLQueue(), given).extensions["sqlqueue"].settings.max_crashes
        == 7
    )
    for bad in (0, "two", 1.5):
        with pytest.raises(
            ConfigurationError, match="SQLQUEUE_MAX_CRASHES must be a whole number >= 1"
        ):
            crash_app.queue_app("bad", SQLQueue(), {**config, "SQLQUEUE_MAX_CRASHES": bad})
    assert not (tmp_path / "queue.db").exists()


# -- effects with an outcome ---------------------------------------------------------------------


def run_all(app: Flask) -> None:
    with app.app_context():
        run_burst(crash_app.queue.worker(WorkerOptions(poll_interval=0.1)))


def outcomes(app: Flask) -> dict[str, tuple[int, bool]]:
    """Each effect key: its job, and whether it is marked done."""
    with crash_app.queue.state(app).store.read() as conn:
        rows = conn.execute(sa.select(effects.c.key, effects.c.job_id, effects.c.done_at))
        return {key: (job_id, done is not None) for key, job_id, done in rows}


def test_an_effect_is_done_when_its_block_ends(app: Flask) -> None:
    mixed = enqueue(app, crash_app.effects_then_fail, ["charge:1"], ["mail:1", "sms:1"])
    inside = enqueue(app, crash_app.fails_inside, "charge:2")
    settled = enqueue(app, crash_app.effects_then_fail, ["charge:3"], [])
    bare = enqueue(app, crash_app.fails)
    run_all(app)
    assert outcomes(app) == {
        "charge:1": (mixed, True),
        "mail:1": (mixed, False),
        "sms:1": (mixed, False),
        "charge:2": (inside, False),  # its block raised: the call may or may not have happened
        "charge:3": (settled, True),
    }

    shown = cli(app, "show", str(mixed))
    assert "  charge:1  (" in shown and re.search(r"charge:1  \(.*, done .*\)", shown)
    assert "replay: reserved, outcome unknown: reconcile first: mail:1, sms:1" in shown
    assert "replay: reserved, outcome unknown: reconcile first: charge:2" in cli(
        app, "show", str(inside)
    )
    assert "replay: safe to replay (every reserved effect is done)" in cli(
        app, "show", str(settled)
    )
    assert "replay: safe to replay\n" in cli(app, "show", str(bare))

    body = page(app, f"/jobs/{mixed}")
    assert "Replay: reserved, outcome unknown: reconcile first: mail:1, sms:1" in body
    assert "Replay: safe to replay" in page(app, f"/jobs/{settled}")
    assert "Replay: safe to replay" in page(app, f"/jobs/{bare}")
    listed = page(app, "/jobs?status=dead")
    rows = dict(
        re.findall(r'name="ids" value="(\d+)".*?<td class="effects"[^>]*>(.*?)</td>', listed, re.S)
    )
    assert "reconcile first" in rows[str(mixed)] and "sms:1" in rows[str(mixed)]
    assert "charge:1" not in rows[str(mixed)] and "3 reserved, 1 done" in rows[str(mixed)]
    assert "safe to replay" in rows[str(settled)] and "1 reserved, 1 done" in rows[str(settled)]
    assert "safe to replay" in rows[str(bare)] and "none reserved" in rows[str(bare)]

    # A replay skips every reservation, done or not; its blocks mark nothing again.
    assert cli(app, "retry", str(mixed)).strip() == "Replayed 1 job(s)."
    run_all(app)
    assert outcomes(app)["mail:1"] == (mixed, False)


def test_only_the_first_caller_marks_an_effect_done(app: Flask) -> None:
    first = enqueue(app, crash_app.effect_once, "receipt:9")
    run_all(app)
    second = enqueue(app, crash_app.effect_once, "receipt:9")
    run_all(app)
    assert (job(app, first).result, job(app, second).result) == (True, False)
    assert outcomes(app) == {"receipt:9": (first, True)}
    with app.app_context():
        keyed = crash_app.effect_once.using(idempotency_key="order-5").enqueue().id
    run_all(app)
    assert job(app, keyed).result is True and outcomes(app)["order-5"] == (keyed, True)


def test_effect_without_a_key_names_the_fix(app: Flask) -> None:
    job_id = enqueue(app, crash_app.effect_once)
    run_all(app)
    ended = job(app, job_id)
    assert ended.status == "dead"
    assert "pass effect(key) explicitly" in ended.last_error
    assert outcomes(app) == {}
    with pytest.raises(NoJobContext):
        current_job.effect("outside")

"""Every write that makes a job runnable wakes idle workers, whichever door it came
through: the ``flask queue`` commands, the admin's buttons, or ``queue.resume()``.

An idle worker in another process, polling far less often than any wait here, must run
the job the door made runnable: woken by PostgreSQL's NOTIFY, or on SQLite by the
same-host socket, as on MariaDB (whose workers on other hosts poll).
Before the operations layer, retries and ``flask queue rescue`` sent no NOTIFY, so on
PostgreSQL their jobs waited for the next poll.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue.core.dialects import for_dialect
from flask_sqlqueue.core.dialects.postgresql import CHANNEL
from flask_sqlqueue.core.models import jobs
from tests import sample_app
from tests.conftest import flask_env
from tests.conftest import fresh_database
from tests.conftest import query
from tests.waiting import WAIT
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import spawn
from tests.workers import stop

pytestmark = pytest.mark.slow

#: The worker's poll interval: far beyond any wait here, so only a wake-up runs a job.
POLL = 10 * WAIT
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')

WORKER = (
    "import signal, sys\n"
    "from flask_sqlqueue import WorkerOptions\n"
    "from tests import sample_app\n"
    "app = sample_app.create_app()\n"
    # Rescues nothing itself: only `flask queue rescue` (stale after 60 s) takes back a job.
    "options = WorkerOptions(poll_interval=float(sys.argv[1]), stale_after=3600, grace=1)\n"
    "worker = sample_app.queue.worker(options, app)\n"
    "signal.signal(signal.SIGTERM, lambda *_: worker.stop())\n"
    "worker.run()\n"
)


@dataclass
class Doors:
    """The app in this process, whose doors the tests use, and the worker's process."""

    app: Flask
    worker: subprocess.Popen[str]

    @property
    def engine(self) -> sa.Engine:
        return sample_app.queue.state(self.app).store.engine

    def now(self) -> Any:
        return sample_app.queue.state(self.app).store.now()

    def job(self, job_id: int) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one()

    def update(self, job_id: int, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))

    def not_due(self, task: Any = sample_app.add, *args: Any) -> int:
        """A job the worker will not claim for an hour."""
        with self.app.app_context():
            return task.using(delay=3600).enqueue(*(args or (2, 3))).id  # type: ignore[no-any-return]

    def dead(self, error: str = "RuntimeError: boom") -> int:
        job_id = self.not_due()
        now = self.now()
        self.update(job_id, status="dead", attempts=1, last_error=error, finished_at=now)
        return job_id

    def cli(self, *args: str) -> str:
        result = self.app.test_cli_runner().invoke(args=["queue", *args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.output

    def post(self, path: str, data: dict[str, Any] | None = None) -> None:
        client = self.app.test_client()
        page = client.get("/q/jobs").get_data(as_text=True)
        found = TOKEN.search(page)
        assert found, page
        response = client.post("/q" + path, data={**(data or {}), "csrf_token": found.group(1)})
        assert response.status_code == 303, response.get_data(as_text=True)

    def settle(self) -> None:
        """Let the worker finish its claim after the last job it recorded, and wait.

        A door's write made before that claim would be found by it without any wake-up,
        so a door that forgot to wake could pass. The claim follows the recording within
        milliseconds; waiting longer can only make the test slower, never fail it.
        """
        time.sleep(scaled(0.3))

    def runs(self, job_id: int, what: str) -> None:
        """Wait for the worker to have run ``job_id`` (well before its next poll)."""
        wait_for(lambda: self.job(job_id).status == "completed", what)


def _listening(uri: str, pid: int) -> bool:
    """Whether the worker process listens for wake-ups (so none it is sent is lost)."""
    url = sa.make_url(uri)
    if url.get_backend_name() != "postgresql":
        folder = for_dialect(url.get_backend_name()).wake_dir(url)
        return (
            folder is not None
            and folder.exists()
            and any(name.startswith(f"{pid}-") for name in os.listdir(folder))
        )
    rows = query(
        uri,
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query = :listen",
        listen=f"LISTEN {CHANNEL}",
    )
    return bool(rows[0][0])


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mysql"])
def wake_uri(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('doors') / 'queue.db'}"
    else:
        with fresh_database(request.param) as uri:
            yield uri


@pytest.fixture(scope="module")
def doors(wake_uri: str) -> Iterator[Doors]:
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": wake_uri})
    app.secret_key = "test"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    sample_app.queue.upgrade_database(app=app)
    command = [sys.executable, "-c", WORKER, str(POLL)]
    quiet: dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
    with spawn(command, flask_env(wake_uri), **quiet) as worker:
        found = Doors(app, worker)
        try:
            wait_for(
                lambda: _listening(wake_uri, worker.pid) or worker.poll() is not None, "listening"
            )
            assert worker.poll() is None, worker.communicate()[1]
            # Enqueueing wakes it (what every door must do too); then it is idle.
            with app.app_context():
                canary = sample_app.add.enqueue(20, 22).id
            found.runs(canary, "the worker woken by an enqueue")
            yield found
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):  # then killed by spawn
                stop(worker)
            found.engine.dispose()


# -- retry ---------------------------------------------------------------------------------


def test_admin_retry_wakes_the_workers(doors: Doors) -> None:
    job_id = doors.dead()
    doors.settle()
    doors.post(f"/jobs/{job_id}/retry")
    doors.runs(job_id, "the job retried from the admin")


def test_admin_bulk_retry_wakes_the_workers(doors: Doors) -> None:
    job_id = doors.dead()
    doors.settle()
    doors.post("/jobs/bulk", {"ids": [str(job_id)], "action": "retry"})
    doors.runs(job_id, "the job retried from the admin's selection")


def test_admin_retry_of_every_dead_job_wakes_the_workers(doors: Doors) -> None:
    plain, found = doors.dead(), doors.dead("RuntimeError: needle in a haystack")
    doors.settle()
    doors.post("/jobs/retry-dead", {"task": "tests.sample_app.add", "q": "needle"})
    doors.runs(found, "the dead job found by text, replayed from the admin")
    assert doors.job(plain).status == "dead"
    doors.settle()
    doors.post("/jobs/retry-dead", {"task": "tests.sample_app.add"})
    doors.runs(plain, "the dead jobs of a task, replayed from the admin")


def test_cli_retry_wakes_the_workers(doors: Doors) -> None:
    job_id = doors.dead()
    doors.settle()
    assert doors.cli("retry", str(job_id)).strip() == "Replayed 1 job(s)."
    doors.runs(job_id, "the job retried by flask queue retry")


def test_cli_retry_of_every_dead_job_wakes_the_workers(doors: Doors) -> None:
    job_id = doors.dead()
    doors.settle()
    doors.cli("retry", "--dead", "--task", "tests.sample_app.add")
    doors.runs(job_id, "the job retried by flask queue retry --dead")


# -- rescue --------------------------------------------------------------------------------


def test_cli_rescue_wakes_the_workers(doors: Doors) -> None:
    job_id = doors.not_due()
    long_ago = doors.now() - timedelta(minutes=30)
    doors.update(
        job_id,
        status="running",
        attempts=1,
        run_at=long_ago,
        started_at=long_ago,
        worker_id="ghost:9:zzz",  # no worker row: lost, by the CLI's 60 s
        claim_token="t" * 32,
    )
    doors.settle()
    assert f"job {job_id}: worker ghost:9:zzz lost; now pending" in doors.cli("rescue")
    doors.runs(job_id, "the job rescued by flask queue rescue")


# -- resume --------------------------------------------------------------------------------


def _paused_job(doors: Doors) -> int:
    with doors.app.app_context():
        sample_app.queue.pause("reports")
        job_id: int = sample_app.report.enqueue(7).id
    return job_id


@pytest.mark.parametrize(
    "resume",
    [
        pytest.param(lambda d: d.post("/queues/reports/resume"), id="admin"),
        pytest.param(lambda d: d.cli("resume", "reports"), id="cli"),
        pytest.param(lambda d: d.cli("resume", "--all"), id="cli-all"),
        pytest.param(lambda d: _in_app(d, sample_app.queue.resume, "reports"), id="python"),
    ],
)
def test_resume_wakes_the_workers(doors: Doors, resume: Callable[[Doors], Any]) -> None:
    job_id = _paused_job(doors)
    doors.settle()
    assert doors.job(job_id).status == "pending"
    resume(doors)
    doors.runs(job_id, "the job of the resumed queue")


def _in_app(doors: Doors, fn: Callable[..., Any], *args: Any) -> Any:
    with doors.app.app_context():
        return fn(*args)

"""Pausing and resuming queues, on every backend: the API, a running worker, the CLI
and the admin's buttons."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import JobStatus
from flask_sqlqueue import UnknownQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.worker import Worker
from tests import limits_app
from tests.conftest import query
from tests.stores import burst
from tests.waiting import wait_for
from tests.workers import running

TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


def statuses(database_uri: str) -> dict[int, str]:
    return dict(query(database_uri, "SELECT id, status FROM sqlqueue_jobs"))  # type: ignore[arg-type]


# -- the Python API -------------------------------------------------------------------------


def test_a_paused_queue_is_not_claimed_and_runs_after_resume(
    lapp: Flask, database_uri: str
) -> None:
    with lapp.app_context():
        mail = limits_app.mail.enqueue(1)
        report = limits_app.report.enqueue(2)
        assert limits_app.queue.pause("reports") is True
        assert limits_app.queue.pause("reports") is False  # already paused
        assert set(limits_app.queue.paused_queues()) == {"reports"}
    burst(lapp, poll_interval=0.05)
    assert statuses(database_uri) == {mail.id: "completed", report.id: "pending"}

    with lapp.app_context():
        assert limits_app.queue.resume("reports") is True
        assert limits_app.queue.resume("reports") is False  # not paused any more
        assert limits_app.queue.paused_queues() == {}
    burst(lapp, poll_interval=0.05)
    assert statuses(database_uri) == {mail.id: "completed", report.id: "completed"}


def test_a_queue_can_be_paused_before_it_has_jobs(lapp: Flask, database_uri: str) -> None:
    with lapp.app_context():
        assert limits_app.queue.pause("mail")  # declared by a task, no job yet
        job = limits_app.mail.enqueue(1)
    burst(lapp, poll_interval=0.05)
    assert statuses(database_uri) == {job.id: "pending"}


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("reprots", UnknownQueue),
        ("no spaces", ValueError),
        ("", ValueError),
        ("x" * 101, ValueError),
    ],
)
def test_bad_queue_names_are_refused_and_change_nothing(
    lapp: Flask, database_uri: str, name: str, error: type[Exception]
) -> None:
    with lapp.app_context():
        with pytest.raises(error) as raised:
            limits_app.queue.pause(name)
        with pytest.raises(error):
            limits_app.queue.resume(name)
    if error is UnknownQueue:
        message = str(raised.value)
        assert "'reprots'" in message and "reports" in message and "nothing was changed" in message
    assert query(database_uri, "SELECT name FROM sqlqueue_queues") == []


def test_a_queue_known_only_by_its_jobs_can_be_paused(lapp: Flask, database_uri: str) -> None:
    with lapp.app_context():
        job = limits_app.queue.enqueue("elsewhere.task", queue="legacy", unregistered=True)
        assert limits_app.queue.pause("legacy")
    assert query(database_uri, "SELECT name FROM sqlqueue_queues") == [("legacy",)]
    assert statuses(database_uri) == {job.id: "pending"}


# -- a running worker ---------------------------------------------------------------------------


@pytest.fixture
def running_worker(lapp: Flask) -> Iterator[Worker]:
    options = WorkerOptions(poll_interval=0.05, concurrency=2, grace=5)
    with running(limits_app.queue.worker(options, lapp)) as worker:
        yield worker


def test_a_running_worker_stops_claiming_a_paused_queue_and_resumes(
    lapp: Flask, database_uri: str, running_worker: Worker, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    with lapp.app_context():
        # A job that is running when the pause comes: it must still finish.
        long = limits_app.report.enqueue(0, str(gate))
        wait_for(lambda: statuses(database_uri)[long.id] == "running", "the report to start")
        limits_app.queue.pause("reports")
        held = limits_app.report.enqueue(1)
        # Claimed in (priority, run_at, id) order: once the later mail job has run, the
        # worker has claimed past the paused report.
        later = limits_app.mail.enqueue(2)
        wait_for(lambda: statuses(database_uri)[later.id] == "completed", "the mail job")
        assert statuses(database_uri)[held.id] == "pending"
        gate.touch()
        wait_for(lambda: statuses(database_uri)[long.id] == "completed", "the running report")
        again = limits_app.mail.enqueue(3)
        wait_for(lambda: statuses(database_uri)[again.id] == "completed", "another mail job")
        assert statuses(database_uri)[held.id] == "pending"

        limits_app.queue.resume("reports")
        wait_for(lambda: statuses(database_uri)[held.id] == "completed", "the held report")
        assert limits_app.queue.get_job(held.id).result == 1  # type: ignore[union-attr]


# -- the command line -----------------------------------------------------------------------------


def cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["queue", *args])


def test_cli_pause_status_and_resume(lapp: Flask, database_uri: str) -> None:
    with lapp.app_context():
        job = limits_app.report.enqueue(1)

    paused = cli(lapp, "pause", "reports")
    assert paused.exit_code == 0, paused.output + paused.stderr
    assert paused.output == "Paused queue 'reports'.\n"
    assert cli(lapp, "pause", "reports").output == "Queue 'reports' was already paused.\n"
    status = cli(lapp, "status")
    assert status.exit_code == 0
    assert re.search(
        r"^paused reports: since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", status.output, re.M
    )
    burst(lapp, poll_interval=0.05)
    assert statuses(database_uri) == {job.id: "pending"}

    resumed = cli(lapp, "resume", "reports")
    assert resumed.exit_code == 0
    assert resumed.output == "Resumed queue 'reports'.\n"
    assert "paused" not in cli(lapp, "status").output
    burst(lapp, poll_interval=0.05)
    assert statuses(database_uri) == {job.id: "completed"}


def test_cli_pause_all_and_resume_all(lapp: Flask, database_uri: str) -> None:
    result = cli(lapp, "pause", "--all")
    assert result.exit_code == 0, result.output + result.stderr
    declared = {"default", "mail", "reports"}
    assert set(dict(query(database_uri, "SELECT name, paused_at FROM sqlqueue_queues"))) == declared
    result = cli(lapp, "resume", "--all")
    assert result.exit_code == 0
    assert sorted(result.output.splitlines()) == sorted(
        f"Resumed queue {name!r}." for name in declared
    )
    assert cli(lapp, "resume", "--all").output == "No queue is paused.\n"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["pause", "reprots"], "No queue 'reprots'"),
        (["pause", "mail", "reprots"], "No queue 'reprots'"),  # all or nothing
        (["pause", "bad name"], "not a valid queue name"),
        (["pause"], "Give queue names or --all"),
        (["pause", "mail", "--all"], "Give queue names or --all"),
        (["resume", "reprots"], "No queue 'reprots'"),
    ],
)
def test_cli_refuses_bad_names_and_changes_nothing(
    lapp: Flask, database_uri: str, args: list[str], fragment: str
) -> None:
    result = cli(lapp, *args)
    assert result.exit_code != 0
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert query(database_uri, "SELECT name FROM sqlqueue_queues") == []


# -- the admin ---------------------------------------------------------------------------------


def test_admin_pause_and_resume_buttons(lapp: Flask, database_uri: str) -> None:
    lapp.secret_key = "test secret"
    lapp.register_blueprint(
        limits_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    client = lapp.test_client()
    with lapp.app_context():
        limits_app.report.enqueue(1)
    page = client.get("/queue/").get_data(as_text=True)
    assert 'action="/queue/queues/reports/pause"' in page
    token = TOKEN.search(page)
    assert token

    refused = client.post("/queue/queues/reports/pause", data={})
    assert refused.status_code == 400  # no CSRF token
    assert query(database_uri, "SELECT name FROM sqlqueue_queues") == []

    done = client.post("/queue/queues/reports/pause", data={"csrf_token": token.group(1)})
    assert done.status_code == 303
    page = client.get("/queue/").get_data(as_text=True)
    assert "Queue reports is paused" in page
    assert 'action="/queue/queues/reports/resume"' in page
    with lapp.app_context():
        assert set(limits_app.queue.paused_queues()) == {"reports"}

    unknown = client.post("/queue/queues/reprots/pause", data={"csrf_token": token.group(1)})
    assert unknown.status_code == 400
    assert "No queue" in unknown.get_data(as_text=True)

    done = client.post("/queue/queues/reports/resume", data={"csrf_token": token.group(1)})
    assert done.status_code == 303
    with lapp.app_context():
        assert limits_app.queue.paused_queues() == {}
    assert JobStatus.PENDING.value in statuses(database_uri).values()

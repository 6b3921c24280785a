"""Rows edited by hand into values this version cannot read, on every backend.

Each backend keeps some timestamp no ``datetime`` can hold: SQLite any text; MariaDB a
zero date, even in its default strict ``sql_mode`` (which lacks ``NO_ZERO_DATE``);
PostgreSQL ``infinity`` and years past 9999. A page or command that reads such a row
shows it as unreadable, naming the column and what it holds, and every other row as usual.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

import pytest
import sqlalchemy as sa
from click.testing import Result
from flask import Flask
from sqlalchemy.pool import NullPool

from flask_sqlqueue.testing import enqueued
from tests import sample_app

#: Per backend, two values a hand edit can leave in a timestamp column.
ODD = {
    "sqlite": ("not a date", "2026-13-45 99:99"),
    "mysql": ("0000-00-00 00:00:00", "2026-00-00 00:00:00"),
    "postgresql": ("infinity", "20000-01-01 00:00:00+00"),
}
COLUMNS = ("run_at", "created_at", "updated_at", "started_at", "finished_at")
#: Those a list reads (it never reads started_at or finished_at).
LISTED = ("run_at", "created_at", "updated_at")
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def spoil(database_uri: str, job_id: int, column: str, value: str) -> None:
    """Write ``value`` into one job's column as a person at a SQL prompt would."""
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "mysql":  # as any client may have it configured
                conn.exec_driver_sql("SET SESSION sql_mode = ''")
            conn.execute(
                sa.text(f"UPDATE sqlqueue_jobs SET {column} = :value WHERE id = :id"),
                {"value": value, "id": job_id},
            )
    finally:
        engine.dispose()


def shown(value: str) -> str:
    """How the start of ``value`` reads back as text (MariaDB adds the microseconds,
    PostgreSQL renders the zone of the session)."""
    return value[:10]


Spoiled = tuple[Flask, list[int], dict[int, tuple[str, str]]]


@pytest.fixture
def spoiled(make_app: Callable[..., Flask], database_uri: str, backend: str) -> Spoiled:
    """Seven pending jobs; the five in the middle each with one timestamp spoiled."""
    app = make_app()
    with app.app_context():
        ids = [sample_app.add.enqueue(1, n).id for n in range(len(COLUMNS) + 2)]
    bad = {}
    for n, (job_id, column) in enumerate(zip(ids[1:], COLUMNS, strict=False)):
        value = ODD[backend][n % 2]
        spoil(database_uri, job_id, column, value)
        bad[job_id] = (column, value)
    return app, ids, bad


def cli(app: Flask, *args: str) -> Result:
    return app.test_cli_runner().invoke(args=["queue", *args])


def table_rows(output: str) -> dict[int, str]:
    return {int(line.split()[0]): line for line in output.splitlines() if line[:1].isdigit()}


@pytest.mark.parametrize("args", [(), ("--status", "pending")])
def test_list_shows_an_unreadable_row_and_the_others(spoiled: Spoiled, args: tuple[str]) -> None:
    app, ids, bad = spoiled
    result = cli(app, "list", *args)
    assert result.exit_code == 0, (result.output, result.exception)
    rows = table_rows(result.stdout)
    assert list(rows) == ids[::-1]
    for job_id in set(ids) - set(bad):
        assert STAMP.search(rows[job_id]), rows[job_id]
    for job_id, (column, value) in bad.items():
        if column not in LISTED:
            assert f"job {job_id} " not in result.stderr and STAMP.search(rows[job_id])
            continue
        assert f"job {job_id} " in result.stderr, result.stderr
        assert f"{column} holds '{shown(value)}" in result.stderr, result.stderr
        if column == "run_at":
            assert "unreadable" in rows[job_id] and not STAMP.search(rows[job_id])
        else:
            assert STAMP.search(rows[job_id]), rows[job_id]


def test_show_names_the_unreadable_column(spoiled: Spoiled) -> None:
    app, ids, bad = spoiled
    for job_id, (column, value) in bad.items():
        result = cli(app, "show", str(job_id))
        assert result.exit_code == 0, (result.output, result.exception)
        out = result.stdout
        assert f"unreadable: {column} holds '{shown(value)}" in out, out
        assert "tests.sample_app.add" in out and "args:" in out and "[\n    1," in out
        fields = dict(line.split("  ", 1) for line in out.split("\n\n")[0].splitlines()[1:])
        for label, other in (("run at", "run_at"), ("created", "created_at")):
            if other != column:
                assert STAMP.match(fields[label].strip()), fields
        with app.app_context():
            job = sample_app.queue.get_job(job_id)
        assert job is not None and job.id == job_id and getattr(job, column) is None
        assert list(job.unreadable) == [column]
    with app.app_context():
        good = sample_app.queue.get_job(ids[0])
    assert good is not None and good.unreadable == {} and good.run_at is not None


def test_show_prints_errors_that_are_not_json_as_one_block(
    make_app: Callable[..., Flask], database_uri: str
) -> None:
    app = make_app()
    with app.app_context():
        job = sample_app.add.enqueue(1, 2)
    engine = sa.create_engine(database_uri, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE sqlqueue_jobs SET errors = :e WHERE id = :id"),
            {"e": "not json\nsecond line", "id": job.id},
        )
    engine.dispose()
    result = cli(app, "show", str(job.id))
    assert result.exit_code == 0, (result.output, result.exception)
    tail = result.stdout[result.stdout.index("\nerrors") + 1 :].splitlines()
    assert tail == [
        "errors: unreadable (not a JSON list), as stored:",
        "  not json",
        "  second line",
    ]


def test_admin_pages_show_an_unreadable_row_and_the_others(spoiled: Spoiled) -> None:
    app, ids, bad = spoiled
    app.secret_key = "test secret"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    client = app.test_client()

    def page(path: str) -> str:
        response = client.get("/q" + path)
        assert response.status_code == 200, (path, response.get_data(as_text=True)[-2000:])
        return response.get_data(as_text=True)

    for path in ("/jobs", "/jobs?status=pending", "/jobs?q=" + str(ids[1])):
        body = page(path)
        listed = [int(i) for i in re.findall(r'name="ids" value="(\d+)"', body)]
        assert listed == (ids[::-1] if "q=" not in path else [ids[1]])
        for job_id, (column, value) in bad.items():
            if "q=" in path and job_id != ids[1]:
                continue
            row = body[body.index(f'name="ids" value="{job_id}"') :].split("</tr>")[0]
            if column not in LISTED:
                assert "unreadable" not in row, row
                continue
            assert "unreadable" in row and f"{column} holds &#39;{shown(value)}" in row, row
    for job_id, (column, value) in bad.items():
        body = page(f"/jobs/{job_id}")
        assert f"unreadable: {column} holds &#39;{shown(value)}" in body
        assert "tests.sample_app.add" in body
    good = page(f"/jobs/{ids[0]}")
    assert "unreadable" not in good and " UTC" in good


#: Per backend, a value a hand edit can leave in ``run_at`` that counts as due now: the
#: oldest eligible job of its queue (SQLite compares the text, MariaDB's zero date and
#: PostgreSQL's -infinity come before any time).
DUE = {"sqlite": "1999 by hand", "mysql": "0000-00-00 00:00:00", "postgresql": "-infinity"}

Due = tuple[Flask, int]


@pytest.fixture
def due_odd(make_app: Callable[..., Flask], database_uri: str, backend: str) -> Due:
    """Queue "default": two pending jobs due now, the first with a run_at no datetime
    holds; queue "reports": one pending job due now, as usual."""
    app = make_app()
    with app.app_context():
        bad = sample_app.add.enqueue(1, 2).id
        sample_app.add.enqueue(3, 4)
        sample_app.report.enqueue(5)
    spoil(database_uri, bad, "run_at", DUE[backend])
    return app, bad


def test_status_says_the_oldest_eligible_is_unreadable(due_odd: Due, backend: str) -> None:
    app, _ = due_odd
    result = cli(app, "status")
    assert result.exit_code == 0, (result.output, result.exception)
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    header = rows["queue"]
    default = dict(zip(header, rows["default"], strict=False))
    reports = dict(zip(header, rows["reports"], strict=False))
    assert default["pending"] == "2" and reports["pending"] == "1"
    assert rows["default"][-1] == "unreadable", result.stdout
    assert rows["reports"][-1] not in ("unreadable", "-"), result.stdout
    assert rows["total"][header.index("pending")] == "3"
    assert "queue 'default'" in result.stderr, result.stderr
    assert f"run_at holds '{shown(DUE[backend])}" in result.stderr, result.stderr
    assert "queue 'reports'" not in result.stderr

    result = cli(app, "status", "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    queues = json.loads(result.stdout)["queues"]
    assert queues["default"]["counts"] == {"pending": 2} and queues["default"]["eligible"] == 2
    assert queues["default"]["oldest_eligible_seconds"] is None
    assert queues["default"]["oldest_eligible_unreadable"].startswith(shown(DUE[backend]))
    assert queues["reports"]["oldest_eligible_seconds"] >= 0
    assert "oldest_eligible_unreadable" not in queues["reports"]


def test_dashboard_says_the_oldest_eligible_is_unreadable(due_odd: Due, backend: str) -> None:
    app, _ = due_odd
    app.secret_key = "test secret"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/q"
    )
    response = app.test_client().get("/q/")
    body = response.get_data(as_text=True)
    assert response.status_code == 200, body[-2000:]

    def row(queue: str) -> str:
        return body[body.index(f'<th scope="row"><a href="/q/jobs?queue={queue}">') :].split(
            "</tr>"
        )[0]

    assert "unreadable" in row("default"), row("default")
    assert f"run_at holds &#39;{shown(DUE[backend])}" in row("default"), row("default")
    assert "unreadable" not in row("reports") and "<time" in row("reports"), row("reports")


def test_metrics_give_no_number_for_an_unreadable_oldest_eligible(due_odd: Due) -> None:
    from flask_sqlqueue.metrics import QueueMetrics

    app, _ = due_odd
    value = QueueMetrics(app).registry.get_sample_value
    assert value("sqlqueue_jobs", {"queue": "default", "status": "pending"}) == 2
    assert value("sqlqueue_queue_depth", {"queue": "default"}) == 2
    age = value("sqlqueue_oldest_eligible_age_seconds", {"queue": "default"})
    assert age is not None and math.isnan(age)
    reports = value("sqlqueue_oldest_eligible_age_seconds", {"queue": "reports"})
    assert reports is not None and reports >= 0


def test_doctor_runs_with_an_unreadable_oldest_eligible(due_odd: Due) -> None:
    app, _ = due_odd
    result = cli(app, "doctor")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "connected to" in result.stdout and "job(s) running" in result.stdout


def test_batch_jobs_and_test_helpers_read_an_unreadable_row(
    make_app: Callable[..., Flask], database_uri: str, backend: str
) -> None:
    app = make_app()
    with app.app_context():
        batch = sample_app.queue.batch([sample_app.add.step(1, n) for n in range(3)])
        ids = [job.id for job in batch.jobs]
    spoil(database_uri, ids[1], "created_at", ODD[backend][0])
    with app.app_context():
        found = sample_app.queue.get_batch(batch.id)
        assert found is not None
        members = found.jobs
        helped = enqueued(sample_app.add)
    for listed in (members, helped):
        assert [job.id for job in listed] == ids
        assert [list(job.unreadable) for job in listed] == [[], ["created_at"], []]
        assert listed[1].created_at is None and listed[1].args == [1, 1]
        assert listed[0].created_at is not None

"""``flask queue ...``: every command, in-process with Flask's CLI runner, on every backend.

Where a real process matters (``work --burst``) the command runs as ``flask`` in a subprocess.
"""

from __future__ import annotations

import json
import re
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import click
import pytest
import sqlalchemy as sa
from click.testing import Result
from flask import Flask

from flask_sqlqueue import schema
from flask_sqlqueue.cli import queue_cli
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import workers
from tests import sample_app
from tests.conftest import run_flask

ADD = "tests.sample_app.add"
REPORT = "tests.sample_app.report"
ALWAYS_FAILS = "tests.sample_app.always_fails"
GIVES_UP = "tests.sample_app.gives_up"
QUEUE_TABLES = {
    "sqlqueue_jobs",
    "sqlqueue_job_effects",
    "sqlqueue_workers",
    "sqlqueue_queues",
    "sqlqueue_limits",
    "sqlqueue_schedules",
}


# -- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def flask_app(sq_app: Flask) -> Flask:
    return sq_app


def cli(flask_app: Flask, *args: str) -> Result:
    return flask_app.test_cli_runner().invoke(args=["queue", *args])


def assert_ok(result: Result) -> None:
    assert result.exit_code == 0, (result.output, result.exception)


def assert_clean_error(result: Result, *fragments: str, code: int = 1) -> str:
    """A non-zero exit with exactly one ``Error:`` line and no crash; returns that line."""
    assert result.exit_code == code, (result.output, result.exception)
    # The runner swallows real exceptions, so a crash shows up here rather than as a traceback.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    if code == 1:
        assert result.stderr.strip() == errors[0], result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def engine(flask_app: Flask) -> sa.Engine:
    return flask_app.extensions["sqlqueue"].store.engine  # type: ignore[no-any-return]


def rows(flask_app: Flask) -> dict[int, dict[str, Any]]:
    """Every job row as stored, to compare before and after a refused command."""
    with engine(flask_app).connect() as conn:
        return {row.id: dict(row._mapping) for row in conn.execute(sa.select(jobs))}


def row(flask_app: Flask, job_id: int) -> dict[str, Any]:
    return rows(flask_app)[job_id]


def state(flask_app: Flask, job_id: int) -> tuple[str, int]:
    """``(status, attempts)`` of one job."""
    found = row(flask_app, job_id)
    return found["status"], found["attempts"]


def update(flask_app: Flask, job_id: int, **values: Any) -> None:
    with engine(flask_app).begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))


def enqueue(flask_app: Flask, task: Any, *args: Any, **options: Any) -> int:
    with flask_app.app_context():
        producer = task.using(**options) if options else task
        return producer.enqueue(*args).id  # type: ignore[no-any-return]


def run_worker(flask_app: Flask) -> None:
    with flask_app.app_context():
        sample_app.queue.worker().run(burst=True)


def make_dead(flask_app: Flask, task: Any = sample_app.always_fails, **options: Any) -> int:
    job_id = enqueue(flask_app, task, **{"max_attempts": 1, **options})
    run_worker(flask_app)
    assert row(flask_app, job_id)["status"] == "dead"
    return job_id


def mark_running(
    flask_app: Flask, job_id: int, worker_id: str, *, started: datetime, attempts: int = 1
) -> None:
    update(
        flask_app,
        job_id,
        status="running",
        attempts=attempts,
        started_at=started,
        worker_id=worker_id,
        claim_token="t" * 32,
    )


def listed_ids(output: str) -> list[int]:
    lines = output.splitlines()
    assert lines[0].split()[:4] == ["id", "queue", "task", "status"], output
    return [int(line.split()[0]) for line in lines[1:] if not line.startswith("(more")]


def shown_json(output: str, section: str, next_section: str) -> Any:
    """The JSON that ``flask queue show`` prints between two section headings."""
    text = output.split(f"\n{section}:\n", 1)[1].split(f"\n{next_section}:", 1)[0]
    return json.loads(text)


def now() -> datetime:
    return datetime.now(UTC)


# -- help ------------------------------------------------------------------------------------------


def _leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += _leaf_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


LEAF_COMMANDS = _leaf_commands(queue_cli)


def test_every_contract_command_exists() -> None:
    expected = {
        ("work",),
        ("status",),
        ("list",),
        ("show",),
        ("retry",),
        ("cancel",),
        ("purge",),
        ("rescue",),
        ("enqueue",),
        ("db", "upgrade"),
        ("db", "downgrade"),
        ("db", "current"),
    }
    assert expected <= set(LEAF_COMMANDS)


@pytest.mark.parametrize("path", LEAF_COMMANDS, ids=" ".join)
def test_help_has_an_example(flask_app: Flask, path: tuple[str, ...]) -> None:
    result = cli(flask_app, *path, "--help")
    assert_ok(result)
    assert "Example:" in result.output
    example = result.output.split("Example:", 1)[1]
    assert f"flask queue {' '.join(path)}" in example


# -- work ------------------------------------------------------------------------------------------


def test_work_burst_runs_eligible_jobs_and_exits_0(flask_app: Flask) -> None:
    added = enqueue(flask_app, sample_app.add, 1, 2)
    reported = enqueue(flask_app, sample_app.report, 5)
    # Failing jobs come back eligible at once (no backoff in the sample app): a burst must
    # see them through to dead rather than exit while one is momentarily running.
    failing = [enqueue(flask_app, sample_app.always_fails, f"kaboom {n}") for n in range(3)]
    later = enqueue(flask_app, sample_app.add, 3, 4, delay=3600)

    result = cli(flask_app, "work", "--burst", "--concurrency", "3")

    assert_ok(result)
    assert row(flask_app, added)["status"] == "completed"
    assert row(flask_app, added)["result"] == "3"
    assert row(flask_app, reported)["status"] == "completed"
    assert row(flask_app, reported)["result"] == '"report 5"'
    for n, job_id in enumerate(failing):
        assert state(flask_app, job_id) == ("dead", 3)
        assert row(flask_app, job_id)["last_error"] == f"RuntimeError: kaboom {n}"
    # Not eligible now: --burst leaves it alone instead of waiting for it.
    assert state(flask_app, later) == ("pending", 0)


def test_work_queue_restricts_to_that_queue(flask_app: Flask) -> None:
    on_default = enqueue(flask_app, sample_app.add, 1, 1)
    on_reports = enqueue(flask_app, sample_app.report, 9)

    assert_ok(cli(flask_app, "work", "--burst", "--queue", "reports"))

    assert row(flask_app, on_reports)["status"] == "completed"
    assert state(flask_app, on_default) == (
        "pending",
        0,
    )


def test_work_burst_in_a_real_process(flask_app: Flask, database_uri: str) -> None:
    on_default = enqueue(flask_app, sample_app.add, 20, 22)
    on_reports = enqueue(flask_app, sample_app.report, 1)

    done = run_flask(database_uri, "queue", "work", "--burst", "--queue", "default", timeout=60)

    assert done.returncode == 0, done.stderr
    assert row(flask_app, on_default)["status"] == "completed"
    assert row(flask_app, on_default)["result"] == "42"
    assert row(flask_app, on_reports)["status"] == "pending"


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--concurrency", "0"], 2, "--concurrency"),
        (["--concurrency", "x"], 2, "--concurrency"),
        (["--poll-interval", "0"], 2, "--poll-interval"),
        (["--queue", "bad name"], 1, "'bad name'"),
        (["--queue", ""], 1, "queue=''"),
    ],
)
def test_work_bad_options(flask_app: Flask, args: list[str], code: int, fragment: str) -> None:
    job_id = enqueue(flask_app, sample_app.add, 1, 2)
    assert_clean_error(cli(flask_app, "work", "--burst", *args), fragment, code=code)
    assert row(flask_app, job_id)["status"] == "pending"


# -- status ----------------------------------------------------------------------------------------


def test_status_without_jobs(flask_app: Flask) -> None:
    result = cli(flask_app, "status")
    assert_ok(result)
    assert result.output.strip() == "No jobs."


def test_status_table_counts_totals_and_oldest_age(flask_app: Flask) -> None:
    old = enqueue(flask_app, sample_app.add, 1, 2)
    enqueue(flask_app, sample_app.add, 3, 4)
    cancelled = enqueue(flask_app, sample_app.add, 5, 6)
    enqueue(flask_app, sample_app.report, 1, delay=3600)  # pending, but not eligible
    dead = enqueue(flask_app, sample_app.report, 2)
    update(flask_app, old, run_at=now() - timedelta(hours=2, seconds=5))
    update(flask_app, cancelled, status="cancelled")
    update(flask_app, dead, status="dead")

    result = cli(flask_app, "status")

    assert_ok(result)
    assert result.stderr == (
        "warning: no live worker; 3 pending job(s) wait for one; flask queue work.\n"
    )
    lines = result.output.splitlines()
    # The table ends with its total; lines about periodic tasks, limits, retention follow.
    lines = lines[: next(i for i, line in enumerate(lines) if line.startswith("total")) + 1]
    header = lines[0]
    columns = ["queue", "waiting", "pending", "running", "completed", "dead", "cancelled"]
    columns.append("oldest eligible")
    assert re.split(r"\s{2,}", header.strip()) == columns
    table = {line.split()[0]: line for line in lines[1:]}
    assert set(table) == {"default", "reports", "total"}
    assert table["default"].split() == ["default", "0", "2", "0", "0", "0", "1", "2h00m"]
    assert table["reports"].split() == ["reports", "0", "1", "0", "0", "1", "0", "-"]
    assert table["total"].split() == ["total", "0", "3", "0", "0", "1", "1"]
    # Aligned: every cell starts under its column's header.
    starts = [header.index(c) for c in columns]
    for line in lines[1:]:
        cells = [i for i in range(len(line)) if line[i] != " " and (i == 0 or line[i - 1] == " ")]
        assert cells == starts[: len(cells)], line


def test_status_warns_about_unregistered_pending_tasks(flask_app: Flask) -> None:
    with flask_app.app_context():
        sample_app.queue.enqueue("not.registered", unregistered=True)
        sample_app.queue.enqueue("not.registered", unregistered=True)
    enqueue(flask_app, sample_app.add, 1, 2)

    result = cli(flask_app, "status")

    assert_ok(result)
    assert "not.registered" not in result.stdout
    warning = result.stderr.strip()
    assert warning.splitlines() == [
        "warning: no live worker; 1 pending job(s) wait for one; flask queue work.",
        "warning: 2 pending job(s) of task 'not.registered' in queue 'default': no live "
        "worker runs them; this app does not register the task either: import the module "
        "that defines it.",
    ]


# -- list ------------------------------------------------------------------------------------------


def test_list_filters(flask_app: Flask) -> None:
    added = enqueue(flask_app, sample_app.add, 1, 2)
    reported = enqueue(flask_app, sample_app.report, 3)
    dead = make_dead(flask_app)
    pending = enqueue(flask_app, sample_app.add, 5, 6)
    assert row(flask_app, added)["status"] == "completed"

    everything = cli(flask_app, "list")
    assert_ok(everything)
    assert listed_ids(everything.output) == [pending, dead, reported, added]
    assert "(more" not in everything.output

    by_status = cli(flask_app, "list", "--status", "dead")
    assert listed_ids(by_status.output) == [dead]
    assert "RuntimeError: boom" in by_status.output
    assert listed_ids(cli(flask_app, "list", "--status", "pending").output) == [pending]
    assert listed_ids(cli(flask_app, "list", "--queue", "reports").output) == [reported]
    assert listed_ids(cli(flask_app, "list", "--task", ADD).output) == [pending, added]
    assert listed_ids(cli(flask_app, "list", "--task", ALWAYS_FAILS).output) == [dead]
    both = cli(flask_app, "list", "--task", ADD, "--status", "completed")
    assert listed_ids(both.output) == [added]

    none = cli(flask_app, "list", "--queue", "nowhere")
    assert_ok(none)
    assert none.output.strip() == "No jobs match."


def test_list_pages_with_before(flask_app: Flask) -> None:
    ids = [enqueue(flask_app, sample_app.add, n, n) for n in range(4)]

    first = cli(flask_app, "list", "--limit", "2")
    assert_ok(first)
    assert listed_ids(first.output) == [ids[3], ids[2]]
    assert first.output.splitlines()[-1] == f"(more: --before {ids[2]})"

    second = cli(flask_app, "list", "--limit", "2", "--before", str(ids[2]))
    assert_ok(second)
    assert listed_ids(second.output) == [ids[1], ids[0]]
    # The last page fits exactly: no hint that leads to an empty page.
    assert "(more" not in second.output

    third = cli(flask_app, "list", "--limit", "3", "--before", str(ids[3]))
    assert listed_ids(third.output) == [ids[2], ids[1], ids[0]]
    assert "(more" not in third.output


@pytest.mark.parametrize(
    "args",
    [
        ["--status", "sleeping"],
        ["--status", "PENDING!"],
        ["--limit", "0"],
        ["--before", "0"],
        ["--before", "99999999999999999999999"],
    ],
)
def test_list_rejects_bad_options(flask_app: Flask, args: list[str]) -> None:
    enqueue(flask_app, sample_app.add, 1, 2)
    assert_clean_error(cli(flask_app, "list", *args), args[0], code=2)


# -- show ------------------------------------------------------------------------------------------


def test_show_completed_job_with_args_kwargs_and_result(flask_app: Flask) -> None:
    with flask_app.app_context():
        job_id = sample_app.echo.enqueue(7, "seven", flag=True, nested={"k": [1, None]}).id
    run_worker(flask_app)

    result = cli(flask_app, "show", str(job_id))

    assert_ok(result)
    out = result.output
    assert f"id               {job_id}" in out
    assert "task             echo" in out
    assert "status           completed" in out
    assert "attempts         1/5" in out
    kwargs = {"flag": True, "nested": {"k": [1, None]}}
    assert shown_json(out, "args", "kwargs") == [7, "seven"]
    assert shown_json(out, "kwargs", "result") == kwargs
    assert shown_json(out, "result", "effects reserved") == {"args": [7, "seven"], "kwargs": kwargs}
    assert "effects reserved: 0" in out
    assert "errors: 0" in out


def test_show_every_error_with_its_traceback(flask_app: Flask) -> None:
    job_id = enqueue(flask_app, sample_app.always_fails, "kaboom")
    run_worker(flask_app)

    result = cli(flask_app, "show", str(job_id))

    assert_ok(result)
    out = result.output
    assert "status           dead" in out
    assert "last error       RuntimeError: kaboom" in out
    assert "errors: 3" in out
    for attempt in (1, 2, 3):
        assert f"  attempt {attempt} at " in out
    assert out.count(": RuntimeError: kaboom\n") == 3
    assert out.count("Traceback (most recent call last)") == 3
    assert out.count("raise RuntimeError(message)") == 3


def test_show_reserved_effects(flask_app: Flask) -> None:
    job_id = enqueue(flask_app, sample_app.reserve, "effect-key-1")
    run_worker(flask_app)

    result = cli(flask_app, "show", str(job_id))

    assert_ok(result)
    assert "effects reserved: 1\n  effect-key-1  (" in result.output
    assert shown_json(result.output, "result", "effects reserved") == [True, False]


def test_show_unknown_id(flask_app: Flask) -> None:
    enqueue(flask_app, sample_app.add, 1, 2)
    assert_clean_error(cli(flask_app, "show", "99"), "No job with id 99")
    assert_clean_error(cli(flask_app, "show", "0"), "JOB_ID", code=2)
    assert_clean_error(cli(flask_app, "show", "abc"), "JOB_ID", code=2)
    assert_clean_error(cli(flask_app, "show", "99999999999999999999999"), "JOB_ID", code=2)


# -- retry -----------------------------------------------------------------------------------------


def test_retry_ids_replays_dead_jobs(flask_app: Flask) -> None:
    first = make_dead(flask_app)
    second = make_dead(flask_app)
    before = row(flask_app, first)
    assert before["last_error"] == "RuntimeError: boom"

    result = cli(flask_app, "retry", str(first))

    assert_ok(result)
    assert result.output.strip() == "Replayed 1 job(s)."
    replayed = row(flask_app, first)
    assert (replayed["status"], replayed["attempts"], replayed["last_error"]) == (
        "pending",
        0,
        None,
    )
    assert replayed["run_at"] <= now()
    assert row(flask_app, second)["status"] == "dead"

    # A replayed job really runs again, with fresh attempts.
    run_worker(flask_app)
    assert state(flask_app, first) == ("dead", 1)


def test_retry_dead_in_bulk_with_filters(flask_app: Flask) -> None:
    default_fail = make_dead(flask_app)
    other_fail = make_dead(flask_app, queue="other")
    gave_up = make_dead(flask_app, sample_app.gives_up)
    completed = enqueue(flask_app, sample_app.add, 1, 2)
    run_worker(flask_app)
    assert row(flask_app, completed)["status"] == "completed"

    result = cli(flask_app, "retry", "--dead", "--queue", "other")
    assert_ok(result)
    assert result.output.strip() == "Replayed 1 job(s)."
    assert row(flask_app, other_fail)["status"] == "pending"
    assert row(flask_app, default_fail)["status"] == row(flask_app, gave_up)["status"] == "dead"

    result = cli(flask_app, "retry", "--dead", "--task", GIVES_UP)
    assert result.output.strip() == "Replayed 1 job(s)."
    assert state(flask_app, gave_up) == ("pending", 0)
    assert row(flask_app, default_fail)["status"] == "dead"

    result = cli(flask_app, "retry", "--dead", "--queue", "default", "--task", GIVES_UP)
    assert result.output.strip() == "Replayed 0 job(s)."
    assert row(flask_app, default_fail)["status"] == "dead"

    result = cli(flask_app, "retry", "--dead")
    assert result.output.strip() == "Replayed 1 job(s)."
    assert row(flask_app, default_fail)["status"] == "pending"
    assert row(flask_app, completed)["status"] == "completed"


def test_retry_replays_a_cancelled_job(flask_app: Flask) -> None:
    job_id = enqueue(flask_app, sample_app.add, 1, 2)
    assert_ok(cli(flask_app, "cancel", str(job_id)))
    assert_ok(cli(flask_app, "retry", str(job_id)))
    assert row(flask_app, job_id)["status"] == "pending"


@pytest.mark.parametrize("current", ["pending", "running", "completed", "unknown"])
def test_retry_refuses_a_job_that_is_not_dead_and_changes_nothing(
    flask_app: Flask, current: str
) -> None:
    dead = make_dead(flask_app)
    other_dead = make_dead(flask_app)
    if current == "unknown":
        target = 999
    else:
        target = enqueue(flask_app, sample_app.add, 1, 2)
        if current == "completed":
            run_worker(flask_app)
        elif current == "running":
            mark_running(flask_app, target, "somewhere:1:abc", started=now())
        assert row(flask_app, target)["status"] == current
    before = rows(flask_app)

    result = cli(flask_app, "retry", str(dead), str(target), str(other_dead))

    line = assert_clean_error(result, str(target), "nothing replayed")
    assert ("No job with id" in line) if current == "unknown" else (f"is {current}" in line)
    assert rows(flask_app) == before
    assert row(flask_app, dead)["status"] == row(flask_app, other_dead)["status"] == "dead"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "Give job ids or --dead"),
        (["1", "--dead"], "Give job ids or --dead"),
        (["1", "--queue", "default"], "--queue and --task go with --dead"),
        (["1", "--task", ADD], "--queue and --task go with --dead"),
        (["0"], "JOB_IDS"),
    ],
)
def test_retry_usage_errors(flask_app: Flask, args: list[str], fragment: str) -> None:
    dead = make_dead(flask_app)
    before = rows(flask_app)
    assert_clean_error(cli(flask_app, "retry", *args), fragment, code=2)
    assert rows(flask_app) == before
    assert row(flask_app, dead)["status"] == "dead"


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_pending_jobs(flask_app: Flask) -> None:
    first = enqueue(flask_app, sample_app.add, 1, 2)
    second = enqueue(flask_app, sample_app.add, 3, 4, delay=3600)
    kept = enqueue(flask_app, sample_app.add, 5, 6)

    result = cli(flask_app, "cancel", str(first), str(second))

    assert_ok(result)
    assert result.output.strip() == "Cancelled 2 job(s)."
    assert row(flask_app, first)["status"] == row(flask_app, second)["status"] == "cancelled"
    assert row(flask_app, first)["finished_at"] is not None
    assert row(flask_app, kept)["status"] == "pending"
    # A cancelled job is never run.
    run_worker(flask_app)
    assert row(flask_app, first)["status"] == "cancelled"
    assert row(flask_app, kept)["status"] == "completed"


# A running job is asked to stop instead (tests/test_cancel.py).
@pytest.mark.parametrize("current", ["completed", "dead", "cancelled", "missing"])
def test_cancel_refuses_the_whole_batch(flask_app: Flask, current: str) -> None:
    if current == "dead":
        target = make_dead(flask_app)
    elif current == "missing":
        target = 999
    else:
        target = enqueue(flask_app, sample_app.add, 3, 4)
        if current == "completed":
            with flask_app.app_context():
                assert sample_app.queue.worker().run_once()
        elif current == "cancelled":
            update(flask_app, target, status="cancelled")
    pending = enqueue(flask_app, sample_app.add, 1, 2)
    later = enqueue(flask_app, sample_app.add, 5, 6)
    before = rows(flask_app)

    result = cli(flask_app, "cancel", str(pending), str(target), str(later))

    line = assert_clean_error(result, str(target), "nothing cancelled")
    assert ("No job with id" in line) if current == "missing" else (f"is {current}" in line)
    assert rows(flask_app) == before
    assert row(flask_app, pending)["status"] == row(flask_app, later)["status"] == "pending"


def test_cancel_needs_ids(flask_app: Flask) -> None:
    assert_clean_error(cli(flask_app, "cancel"), "JOB_IDS", code=2)


# -- purge -----------------------------------------------------------------------------------------


def test_purge_deletes_old_finished_jobs_of_one_status(flask_app: Flask) -> None:
    old_done = enqueue(flask_app, sample_app.add, 1, 2)
    new_done = enqueue(flask_app, sample_app.add, 3, 4)
    old_dead = make_dead(flask_app)
    run_worker(flask_app)
    long_ago = now() - timedelta(days=8)
    update(flask_app, old_done, updated_at=long_ago)
    update(flask_app, old_dead, updated_at=long_ago)
    assert row(flask_app, new_done)["status"] == "completed"

    result = cli(flask_app, "purge", "--status", "completed", "--older-than", "7d")

    assert_ok(result)
    assert result.output.strip() == "Purged 1 completed job(s)."
    assert set(rows(flask_app)) == {new_done, old_dead}

    # A short age reaches the recent job; the dead one needs its own --status.
    update(flask_app, new_done, updated_at=now() - timedelta(seconds=30))
    assert_ok(cli(flask_app, "purge", "--status", "completed", "--older-than", "1s"))
    assert set(rows(flask_app)) == {old_dead}
    result = cli(flask_app, "purge", "--status", "dead", "--older-than", "1h30m")
    assert result.output.strip() == "Purged 1 dead job(s)."
    assert rows(flask_app) == {}


def test_purge_keeps_jobs_younger_than_the_age(flask_app: Flask) -> None:
    done = enqueue(flask_app, sample_app.add, 1, 2)
    run_worker(flask_app)
    update(flask_app, done, updated_at=now() - timedelta(hours=2))
    result = cli(flask_app, "purge", "--status", "completed", "--older-than", "3h")
    assert result.output.strip() == "Purged 0 completed job(s)."
    assert set(rows(flask_app)) == {done}


@pytest.mark.parametrize(
    "age", ["7 days", "x", "", "7", "-1d", "d7", "1e3s", "100000000d", "99999999999999w"]
)
def test_purge_bad_age_deletes_nothing(flask_app: Flask, age: str) -> None:
    done = enqueue(flask_app, sample_app.add, 1, 2)
    run_worker(flask_app)
    update(flask_app, done, updated_at=now() - timedelta(days=30))
    assert_clean_error(cli(flask_app, "purge", "--status", "completed", "--older-than", age), "age")
    assert set(rows(flask_app)) == {done}


@pytest.mark.parametrize(
    "args",
    [
        ["--status", "pending", "--older-than", "1s"],
        ["--status", "running", "--older-than", "1s"],
        ["--status", "completed"],
        ["--older-than", "1s"],
    ],
)
def test_purge_refuses_unfinished_statuses_and_missing_options(
    flask_app: Flask, args: list[str]
) -> None:
    pending = enqueue(flask_app, sample_app.add, 1, 2)
    update(flask_app, pending, updated_at=now() - timedelta(days=30))
    assert_clean_error(cli(flask_app, "purge", *args), code=2)
    assert set(rows(flask_app)) == {pending}


# -- rescue ----------------------------------------------------------------------------------------


def test_rescue_takes_back_jobs_of_lost_workers(flask_app: Flask) -> None:
    hour_ago = now() - timedelta(hours=1)
    with engine(flask_app).begin() as conn:
        for worker_id, beat in (("stale:1:aaa", hour_ago), ("live:2:bbb", now())):
            conn.execute(
                sa.insert(workers).values(
                    id=worker_id,
                    host="h",
                    pid=1,
                    queues="",
                    concurrency=1,
                    started_at=hour_ago,
                    last_heartbeat_at=beat,
                )
            )
    no_row = enqueue(flask_app, sample_app.add, 1, 2)
    spent = enqueue(flask_app, sample_app.always_fails, max_attempts=2)
    stale = enqueue(flask_app, sample_app.add, 3, 4)
    alive = enqueue(flask_app, sample_app.add, 5, 6)
    mark_running(flask_app, no_row, "ghost:9:zzz", started=hour_ago)
    mark_running(flask_app, spent, "ghost:9:zzz", started=hour_ago, attempts=2)
    mark_running(flask_app, stale, "stale:1:aaa", started=hour_ago)
    mark_running(flask_app, alive, "live:2:bbb", started=hour_ago)

    result = cli(flask_app, "rescue")

    assert_ok(result)
    lines = result.output.strip().splitlines()
    assert sorted(lines[:-1]) == sorted(
        [
            f"job {no_row}: worker ghost:9:zzz lost; now pending",
            f"job {spent}: worker ghost:9:zzz lost; now dead",
            f"job {stale}: worker stale:1:aaa lost; now pending",
        ]
    )
    assert lines[-1] == "Rescued 3 job(s)."
    for job_id, status, worker in (
        (no_row, "pending", "ghost:9:zzz"),
        (spent, "dead", "ghost:9:zzz"),
        (stale, "pending", "stale:1:aaa"),
    ):
        rescued = row(flask_app, job_id)
        assert rescued["status"] == status
        assert rescued["last_error"] == f"WorkerLost: worker lost: {worker}"
        assert rescued["rescues"] == 1
        assert rescued["claim_token"] is None
    assert row(flask_app, spent)["finished_at"] is not None
    assert row(flask_app, alive)["status"] == "running"
    with engine(flask_app).connect() as conn:
        states = conn.execute(sa.select(workers.c.id, workers.c.stop_reason)).all()
    # The silent worker is kept, marked lost, so the dashboard lists it as gone.
    assert sorted(map(tuple, states)) == [("live:2:bbb", None), ("stale:1:aaa", "lost")]

    # The rescued pending jobs run again; the attempt lost with the worker counted.
    run_worker(flask_app)
    assert state(flask_app, no_row) == (
        "completed",
        2,
    )

    again = cli(flask_app, "rescue")
    assert again.output.strip() == "Rescued 0 job(s)."


def test_rescue_leaves_a_just_started_job_alone(flask_app: Flask) -> None:
    job_id = enqueue(flask_app, sample_app.add, 1, 2)
    mark_running(flask_app, job_id, "ghost:9:zzz", started=now())
    assert cli(flask_app, "rescue").output.strip() == "Rescued 0 job(s)."
    assert row(flask_app, job_id)["status"] == "running"


# -- enqueue ---------------------------------------------------------------------------------------


def test_enqueue_creates_the_job(flask_app: Flask) -> None:
    result = cli(flask_app, "enqueue", ADD, "--args", "[2, 3]")
    assert_ok(result)
    (job_id,) = rows(flask_app)
    assert result.output.strip() == f"Job {job_id} pending on queue 'default'."
    with flask_app.app_context():
        job = sample_app.queue.get_job(job_id)
    assert job is not None
    assert (job.task, job.args, job.kwargs, job.queue) == (ADD, [2, 3], {}, "default")
    run_worker(flask_app)
    assert row(flask_app, job_id)["result"] == "5"


def test_enqueue_kwargs_task_defaults_and_options(flask_app: Flask) -> None:
    kwargs = '{"x": [1, {"y": null}], "s": "caf\\u00e9"}'
    assert_ok(cli(flask_app, "enqueue", "echo", "--kwargs", kwargs))
    assert_ok(cli(flask_app, "enqueue", REPORT, "--args", "[4]"))
    result = cli(
        flask_app, "enqueue", ADD, "--args", "[1, 1]", "--queue", "other", "--priority", "9",
        "--delay", "3600",
    )  # fmt: skip
    assert_ok(result)
    assert "on queue 'other'" in result.output

    with flask_app.app_context():
        echo_job, report_job, add_job = (sample_app.queue.get_job(i) for i in (1, 2, 3))
    assert echo_job is not None and report_job is not None and add_job is not None
    assert echo_job.kwargs == {"x": [1, {"y": None}], "s": "café"}
    assert (report_job.queue, report_job.priority, report_job.max_attempts) == ("reports", 3, 7)
    assert (add_job.queue, add_job.priority) == ("other", 9)
    assert add_job.run_at > now() + timedelta(minutes=59)


def test_enqueue_with_the_same_idempotency_key_makes_one_job(flask_app: Flask) -> None:
    first = cli(flask_app, "enqueue", ADD, "--args", "[1, 2]", "--idempotency-key", "hook-1")
    second = cli(flask_app, "enqueue", ADD, "--args", "[1, 2]", "--idempotency-key", "hook-1")
    assert_ok(first)
    assert_ok(second)
    assert len(rows(flask_app)) == 1
    assert first.output == second.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([ADD, "--args", "[1,"], "--args is not valid JSON"),
        ([ADD, "--args", "nope"], "--args is not valid JSON"),
        ([ADD, "--kwargs", "{'a': 1}"], "--kwargs is not valid JSON"),
        ([ADD, "--args", '{"a": 1}'], "--args must be a JSON array"),
        ([ADD, "--args", "1"], "--args must be a JSON array"),
        ([ADD, "--args", '"ab"'], "--args must be a JSON array"),
        ([ADD, "--kwargs", "[1]"], "--kwargs must be a JSON object"),
        ([ADD, "--kwargs", "null"], "--kwargs must be a JSON object"),
        (["not.registered", "--args", "[]"], "'not.registered'"),
        ([ADD, "--args", "[NaN, 1]"], "args[0]"),
        ([ADD, "--args", "[1, Infinity]"], "args[1]"),
        ([ADD, "--args", "[1e999]"], "args[0]"),
        ([ADD, "--kwargs", '{"a": "x\\u0000y"}'], "kwargs"),
        ([ADD, "--args", "[" * 100_000 + "]" * 100_000], "--args is not valid JSON"),
        ([ADD, "--queue", "bad name"], "'bad name'"),
        ([ADD, "--priority", "99999999999"], "priority"),
        ([ADD, "--delay", "inf"], "delay"),
        ([ADD, "--idempotency-key", ""], "idempotency_key"),
        # A command line's undecodable bytes, as Python's surrogateescape gives them.
        ([ADD, "--idempotency-key", "k\udcff"], "valid Unicode text"),
        ([ADD, "--unique", "--unique-key", "k\udcff"], "Unique(key='k\\udcff')"),
        ([ADD, "--args", "[1, 2, 3]"], "does not take these arguments (too many positional"),
        ([ADD, "--args", "[1, 2]", "--kwargs", '{"c": 3}'], "unexpected keyword argument 'c'"),
        ([ADD, "--args", "[1, 2]", "--delay", "1e12"], "due after 9999-12-30 (UTC)"),
        (["echo", "--args", "[" * 150 + "]" * 150], "nested more than 100 levels deep"),
        (["echo", "--kwargs", '{"\\ud800": 1}'], "kwargs key = '\\ud800' is not valid"),
    ],
)
def test_enqueue_bad_input_writes_nothing(flask_app: Flask, args: list[str], fragment: str) -> None:
    assert_clean_error(cli(flask_app, "enqueue", *args), fragment)
    assert rows(flask_app) == {}


def test_enqueue_arguments_over_the_value_limit_are_refused(flask_app: Flask) -> None:
    state = flask_app.extensions["sqlqueue"]
    state.ensure_schema()  # the server's own limit is read once; lower it after that
    state.store.value_limit = 1000
    too_big = json.dumps(["x" * 1000])
    assert_clean_error(
        cli(flask_app, "enqueue", "echo", "--args", too_big),
        "The job's arguments take 1,0",
        "bytes as JSON, over the 1,000 bytes",
    )
    assert rows(flask_app) == {}


def test_enqueue_with_an_expiry_and_uniqueness(flask_app: Flask) -> None:
    first = cli(flask_app, "enqueue", ADD, "--args", "[1, 2]", "--expires", "10m", "--unique")
    again = cli(flask_app, "enqueue", ADD, "--args", "[1, 2]", "--unique", "--expires", "10m")
    keyed = cli(
        flask_app, "enqueue", ADD, "--args", "[5, 5]", "--unique", "--unique-key", "k",
        "--on-conflict", "replace",
    )  # fmt: skip
    replaced = cli(
        flask_app, "enqueue", ADD, "--args", "[6, 6]", "--unique", "--unique-key", "k",
        "--on-conflict", "replace",
    )  # fmt: skip
    for result in (first, again, keyed, replaced):
        assert_ok(result)
    assert first.output == again.output  # the same job: it holds its arguments' key
    assert keyed.output == replaced.output
    assert len(rows(flask_app)) == 2
    with flask_app.app_context():
        job, holder = (sample_app.queue.get_job(i) for i in sorted(rows(flask_app)))
    assert job is not None and holder is not None
    assert job.expires_at is not None
    assert 590 <= (job.expires_at - job.created_at).total_seconds() <= 610
    assert (holder.args, holder.expires_at) == ([6, 6], None)


@pytest.mark.parametrize(
    ("args", "fragment", "code"),
    [
        ([ADD, "--args", "[1, 2]", "--expires", "soon"], "not an age", 2),
        ([ADD, "--args", "[1, 2]", "--unique-key", "k"], "go with --unique", 2),
        ([ADD, "--args", "[1, 2]", "--on-conflict", "replace"], "go with --unique", 2),
        ([ADD, "--args", "[1, 2]", "--unique", "--on-conflict", "merge"], "--on-conflict", 2),
    ],
)
def test_enqueue_bad_expiry_or_uniqueness_writes_nothing(
    flask_app: Flask, args: list[str], fragment: str, code: int
) -> None:
    assert_clean_error(cli(flask_app, "enqueue", *args), fragment, code=code)
    assert rows(flask_app) == {}


def test_enqueue_bad_usage(flask_app: Flask) -> None:
    assert_clean_error(cli(flask_app, "enqueue"), "TASK", code=2)
    assert_clean_error(cli(flask_app, "enqueue", ADD, "--delay", "-1"), "--delay", code=2)
    assert rows(flask_app) == {}


# -- db --------------------------------------------------------------------------------------------


def table_names(flask_app: Flask) -> set[str]:
    return set(sa.inspect(engine(flask_app)).get_table_names())


def test_db_current_upgrade_downgrade(make_app: Any) -> None:
    flask_app = make_app(upgrade=False)
    assert not table_names(flask_app) & QUEUE_TABLES

    current = cli(flask_app, "db", "current")
    assert current.exit_code == 1
    assert "No queue tables yet" in current.output
    assert "flask queue db upgrade" in current.output
    assert "Traceback" not in current.output

    status = cli(flask_app, "status")
    assert_clean_error(status, "do not exist", "flask queue db upgrade")

    upgraded = cli(flask_app, "db", "upgrade")
    assert_ok(upgraded)
    assert upgraded.output.strip() == f"Queue schema at {schema.head()}."
    assert QUEUE_TABLES <= table_names(flask_app)
    current = cli(flask_app, "db", "current")
    assert_ok(current)
    assert current.output.strip() == f"{schema.head()} (head)"
    assert cli(flask_app, "status").output.strip() == "No jobs."
    assert_ok(cli(flask_app, "enqueue", ADD, "--args", "[1, 2]"))

    downgraded = cli(flask_app, "db", "downgrade", "base")
    assert_ok(downgraded)
    assert downgraded.output.strip() == "Queue schema at base (no tables)."
    assert not table_names(flask_app) & QUEUE_TABLES
    assert cli(flask_app, "db", "current").exit_code == 1
    # In the same process too, the next command notices the tables are gone.
    assert_clean_error(cli(flask_app, "status"), "flask queue db upgrade")

    assert_ok(cli(flask_app, "db", "upgrade"))
    assert cli(flask_app, "status").output.strip() == "No jobs."


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["list"],
        ["show", "1"],
        ["retry", "1"],
        ["cancel", "1"],
        ["purge", "--status", "dead", "--older-than", "1d"],
        ["rescue"],
        ["enqueue", ADD, "--args", "[1, 2]"],
        ["work", "--burst"],
    ],
)
def test_commands_on_a_missing_schema_name_the_fix(make_app: Any, args: list[str]) -> None:
    flask_app = make_app(upgrade=False)
    assert_clean_error(cli(flask_app, *args), "flask queue db upgrade")
    assert not table_names(flask_app) & QUEUE_TABLES


@pytest.mark.parametrize("command", ["upgrade", "downgrade"])
def test_db_unknown_revision(flask_app: Flask, command: str) -> None:
    assert_clean_error(cli(flask_app, "db", command, "nonsense"), "nonsense")
    assert cli(flask_app, "db", "current").output.strip() == f"{schema.head()} (head)"

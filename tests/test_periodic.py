"""Periodic tasks: declaration checks, one job per slot, racing schedulers, backfill,
the worker's scheduler thread, ``flask queue periodic`` (``schedules``' deprecated name)
and ``status``, and (slow) two worker processes scheduling for three minutes on every
configured backend at once.

The scheduler is driven with explicit times (``Scheduler.tick(now)``) wherever it can
be, so no test waits for a minute to pass except the acceptance test.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import periodic
from flask_sqlqueue.core.cron import KEY_PREFIX
from flask_sqlqueue.core.cron import Schedule
from flask_sqlqueue.core.models import schedules
from flask_sqlqueue.core.periodic import ScheduleInfo
from flask_sqlqueue.core.periodic import Scheduler
from flask_sqlqueue.core.periodic import enqueue_slot
from tests import periodic_app
from tests.conftest import ROOT
from tests.conftest import SERVER_URL_VARS
from tests.conftest import fresh_database
from tests.conftest import install_schema
from tests.conftest import query
from tests.sample_app import queue as sample_queue
from tests.sample_app import queue_app
from tests.waiting import wait_for
from tests.workers import queue_work
from tests.workers import running


def at(hour: int, minute: int, second: int = 0, day: int = 3) -> datetime:
    return datetime(2024, 6, day, hour, minute, second, tzinfo=UTC)


def slot_key(task: str, slot: datetime) -> str:
    return f"{KEY_PREFIX}{task}:{slot.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def keys(database_uri: str, task: str) -> list[str]:
    rows = query(
        database_uri,
        "SELECT idempotency_key FROM sqlqueue_jobs WHERE task = :task ORDER BY idempotency_key",
        task=task,
    )
    return [row[0] for row in rows]


def make_periodic_app(database_uri: str) -> Flask:
    app = periodic_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    periodic_app.queue.upgrade_database(app=app)
    return app


@pytest.fixture
def papp(database_uri: str) -> Iterator[Flask]:
    """``tests.periodic_app`` on the test's database, schema in place."""
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = make_periodic_app(database_uri)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def scheduler(app: Flask, *names: str) -> Scheduler:
    """A scheduler of these tasks only, on ``app``'s store."""
    registry = periodic_app.queue.registry
    return Scheduler(app.extensions["sqlqueue"].store, {name: registry[name] for name in names})


def delete_jobs(app: Flask, task: str) -> None:
    """Delete every job of ``task``, as the admin's delete (or retention) does."""
    rows = query(
        app.config["SQLQUEUE_DATABASE_URI"],
        "SELECT id FROM sqlqueue_jobs WHERE task = :task",
        task=task,
    )
    store = app.extensions["sqlqueue"].store
    deleted = store.run_write(lambda conn: actions.delete(conn, [row[0] for row in rows]))
    assert deleted == len(rows) > 0


def deployed(app: Flask, when: datetime, *names: str) -> None:
    """The schedules of ``names`` are first seen at ``when`` (they start at their next slot)."""
    scheduler(app, *names).tick(when)


def describe_all(app: Flask) -> list[ScheduleInfo]:
    return periodic.describe(app.extensions["sqlqueue"].store, periodic_app.queue.registry)


# -- declaring --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "timezone", "message"),
    [
        ("* * *", "UTC", "'* * *' is not a valid cron expression"),
        ("61 * * * *", "UTC", "'61 * * * *' is not a valid cron expression"),
        ("*/0 * * * *", "UTC", "'*/0 * * * *' is not a valid cron expression"),
        ("0 0 31 2 *", "UTC", "'0 0 31 2 *' is not a valid cron expression"),
        ("", "UTC", "'' is not a cron expression"),
        ("* * * * *", "Mars/Olympus_Mons", "unknown timezone 'Mars/Olympus_Mons'"),
        ("* * * * *", "../etc/passwd", "unknown timezone '../etc/passwd'"),
    ],
)
def test_bad_schedules_are_refused_at_declaration(
    schedule: str, timezone: str, message: str
) -> None:
    queue = SQLQueue()
    with pytest.raises(ConfigurationError, match="'bad'") as info:
        queue.periodic(schedule, timezone=timezone, name="bad")(lambda: None)
    assert message in str(info.value)
    assert "bad" not in queue.registry  # nothing half-registered


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"args": [1, 2]}, ConfigurationError, "do not fit its signature"),
        ({"kwargs": {"nope": 1}}, ConfigurationError, "do not fit its signature"),
        ({"kwargs": {"day": object()}}, TypeError, "kwargs['day']"),
        ({"args": "abc"}, ConfigurationError, "must be a list"),
        ({"backfill": "yes"}, ConfigurationError, "backfill='yes'"),
        ({"backfill": True, "backfill_limit": 0}, ConfigurationError, "backfill_limit=0"),
        ({"backfill": True, "backfill_window": -5}, ConfigurationError, "backfill_window"),
        ({"queue": "no spaces"}, ValueError, "queue='no spaces'"),
    ],
)
def test_bad_periodic_options_are_refused(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    queue = SQLQueue()

    def report(day: int) -> None: ...

    with pytest.raises(error) as info:
        queue.periodic("0 6 * * *", name="report", **options)(report)
    assert message in str(info.value)
    assert "report" not in queue.registry


def test_periodic_declares_an_ordinary_task() -> None:
    queue = SQLQueue()

    @queue.periodic("*/5 * * * *", timezone="Europe/Paris", queue="cron", args=[2])
    def double(n: int) -> int:
        return n * 2

    assert queue.registry[double.name] is double
    assert double(4) == 8  # still runs inline
    assert double.options.queue == "cron"
    assert double.schedule is not None
    assert (double.schedule.expression, double.schedule.timezone) == ("*/5 * * * *", "Europe/Paris")
    with pytest.raises(TypeError, match=r"use it instead of @queue\.task"):
        queue.periodic("* * * * *")(queue.task(name="other")(lambda: None))


def test_periodic_takes_every_task_option() -> None:
    queue = SQLQueue()

    @queue.periodic(
        "* * * * *",
        timeout=5,
        isolate=True,
        concurrency=1,
        concurrency_key=lambda account: account,
        rate_limit=(3, 60),
        args=["acme"],
    )
    def sync(account: str) -> None: ...

    assert (sync.timeout, sync.isolate) == (5.0, True)
    assert sync.limits is not None
    assert sync.limits.concurrency == 1
    assert (sync.limits.rate, sync.limits.period) == (3, 60.0)
    with pytest.raises(ValueError, match="timeout"):
        queue.periodic("* * * * *", name="bad", timeout=0)(lambda: None)
    assert "bad" not in queue.registry


def test_slots_follow_the_time_zone_across_daylight_saving() -> None:
    """02:30 in Paris does not exist on 31 March 2024 and happens twice on 27 October:
    Debian cron's rules, as cronsim applies them: run at 03:00, and run once."""
    daily = Schedule.create("t", "30 2 * * *", timezone="Europe/Paris")
    start = datetime(2024, 3, 29, tzinfo=UTC)
    spring = [s.isoformat() for s in daily.slots(start, start + _days(3))]
    assert spring == [
        "2024-03-29T01:30:00+00:00",
        "2024-03-30T01:30:00+00:00",
        "2024-03-31T01:00:00+00:00",
    ]
    start = datetime(2024, 10, 26, tzinfo=UTC)
    autumn = [s.isoformat() for s in daily.slots(start, start + _days(3))]
    assert autumn == [
        "2024-10-26T00:30:00+00:00",
        "2024-10-27T00:30:00+00:00",
        "2024-10-28T01:30:00+00:00",
    ]


def _days(n: int) -> timedelta:
    return timedelta(days=n)


def test_a_very_long_task_name_still_makes_valid_keys() -> None:
    name = "t" * 255
    schedule = Schedule.create(name, "* * * * *")
    key = schedule.key(at(10, 0))
    assert len(key) <= 255 and key.startswith(KEY_PREFIX)
    assert schedule.slot_of(key) == at(10, 0)


# -- one job per slot ----------------------------------------------------------------------


def test_one_scheduler_enqueues_each_slot_once(papp: Flask, database_uri: str) -> None:
    sched = scheduler(papp, "every_minute", "quarter_paris")
    for now in [
        at(9, 59, 30),
        at(10, 0, 30),
        at(10, 0, 31),
        at(10, 0, 59),
        at(10, 1, 0),
        at(10, 1, 1),
    ]:
        sched.tick(now)
    # 10:02 is more than a minute late when the scheduler next looks: skipped.
    sched.tick(at(10, 3, 10))
    assert keys(database_uri, "every_minute") == [
        slot_key("every_minute", at(10, 0)),
        slot_key("every_minute", at(10, 1)),
        slot_key("every_minute", at(10, 3)),
    ]
    assert keys(database_uri, "quarter_paris") == [slot_key("quarter_paris", at(10, 0))]
    with papp.app_context():
        job = periodic_app.queue.get_job(
            query(database_uri, "SELECT id FROM sqlqueue_jobs WHERE task = 'quarter_paris'")[0][0]
        )
    assert job is not None
    assert (job.queue, job.args, job.kwargs, job.run_at) == ("cron", [3], {"label": "q"}, at(10, 0))


def test_tick_waits_for_the_next_slot_at_most_a_second(papp: Flask) -> None:
    sched = scheduler(papp, "every_minute")
    assert sched.tick(at(10, 1) - timedelta(microseconds=250_000)) == pytest.approx(0.25)
    assert sched.tick(at(10, 0, 30)) == 1.0


def test_racing_schedulers_make_one_job_per_slot(papp: Flask, database_uri: str) -> None:
    """Four schedulers, each on an engine of its own, tick the same instants together;
    half-way, every job is deleted (as retention would) and no slot comes back."""
    apps = [papp, *(make_periodic_app(database_uri) for _ in range(3))]
    schedulers = [scheduler(app, "every_minute") for app in apps]
    # All four see the schedule for the first time together, then race for every slot.
    instants = [at(9, 59, 59)] + [at(10, 0) + timedelta(minutes=n, seconds=1) for n in range(12)]
    passes = itertools.count()

    def between_passes() -> None:  # run by one thread while the others wait
        if next(passes) == 7:  # the jobs of 10:00 to 10:05 are written
            delete_jobs(papp, "every_minute")

    barrier = threading.Barrier(len(schedulers), action=between_passes)
    errors: list[BaseException] = []

    def run(sched: Scheduler) -> None:
        try:
            for now in instants:
                barrier.wait(timeout=30)
                sched.tick(now)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in schedulers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for app in apps[1:]:
        app.extensions["sqlqueue"].store.engine.dispose()
    assert not errors
    assert keys(database_uri, "every_minute") == [
        slot_key("every_minute", at(10, 0) + timedelta(minutes=n)) for n in range(6, 12)
    ]


def test_deleted_jobs_never_bring_their_slots_back(papp: Flask, database_uri: str) -> None:
    """A schedule's jobs are deleted (retention, `flask queue purge`, the admin); neither
    the scheduler still running nor a worker restarting within the grace enqueues the
    slot again, and the schedule carries on."""
    names = ("every_minute", "hourly_backfill")
    deployed(papp, at(9, 59, 50), *names)
    running = scheduler(papp, *names)
    running.tick(at(10, 0, 10))
    for name in names:
        assert slot_key(name, at(10, 0)) in keys(database_uri, name)
        delete_jobs(papp, name)

    restarted = make_periodic_app(database_uri)
    try:
        scheduler(restarted, *names).tick(at(10, 0, 30))
    finally:
        restarted.extensions["sqlqueue"].store.engine.dispose()
    running.tick(at(10, 0, 40))
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]

    running.tick(at(10, 1, 5))
    assert keys(database_uri, "every_minute") == [slot_key("every_minute", at(10, 1))]
    with papp.app_context():
        last = [(info.schedule.task, info.last_slot) for info in describe_all(papp)]
    assert ("hourly_backfill", at(10, 0)) in last and ("every_minute", at(10, 1)) in last


def test_a_new_schedule_enqueues_nothing_for_past_slots(papp: Flask, database_uri: str) -> None:
    queue = SQLQueue()

    @queue.periodic("*/20 * * * * *", name="every_20s")
    def every_20s() -> None: ...

    store = papp.extensions["sqlqueue"].store
    # 10:00:00, :20 and :40 came before any scheduler knew the schedule.
    Scheduler(store, queue.registry).tick(at(10, 0, 50))
    assert keys(database_uri, "every_20s") == []
    # A second worker starting later agrees: the schedule began at 10:00:50.
    Scheduler(store, queue.registry).tick(at(10, 1) + timedelta(milliseconds=500))
    assert keys(database_uri, "every_20s") == [slot_key("every_20s", at(10, 1))]


def test_a_pass_that_fails_half_way_keeps_neither_jobs_nor_ledger(
    papp: Flask, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three missed slots go in one transaction with the ledger; the connection dies at the
    third: the first two jobs are not kept either, and the next pass writes all three."""
    deployed(papp, at(9, 59, 50), "hourly_backfill")
    scheduler(papp, "hourly_backfill").tick(at(10, 0, 10))
    written: list[datetime] = []

    def dies_at_the_third(*args: Any) -> Any:
        written.append(args[3])
        if len(written) == 3:
            raise sa.exc.OperationalError("INSERT", None, Exception("connection lost"))
        return enqueue_slot(*args)

    # Every worker was down from 10:30 to 13:20.
    monkeypatch.setattr(periodic, "enqueue_slot", dies_at_the_third)
    sched = scheduler(papp, "hourly_backfill")
    sched.tick(at(13, 20))
    assert written == [at(11, 0), at(12, 0), at(13, 0)]
    assert keys(database_uri, "hourly_backfill") == [slot_key("hourly_backfill", at(10, 0))]
    monkeypatch.undo()
    sched.tick(at(13, 20, 1))
    assert keys(database_uri, "hourly_backfill") == [
        slot_key("hourly_backfill", at(hour, 0)) for hour in (10, 11, 12, 13)
    ]


def test_the_database_refuses_a_second_job_for_a_slot(papp: Flask, database_uri: str) -> None:
    """Past the scheduler's ledger: two enqueues of one slot leave one job."""
    task = periodic_app.queue.registry["every_minute"]
    assert task.schedule is not None
    store = papp.extensions["sqlqueue"].store
    first = enqueue_slot(store, task, task.schedule, at(10, 0))
    with store.write() as conn:
        again = enqueue_slot(store, task, task.schedule, at(10, 0), conn)
    assert again.id == first.id
    assert keys(database_uri, "every_minute") == [task.schedule.key(at(10, 0))]


# -- missed slots ------------------------------------------------------------------------------


def test_without_backfill_missed_slots_stay_missed(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(9, 59, 50), "every_minute")
    scheduler(papp, "every_minute").tick(at(10, 0, 10))
    # Every worker was down from 10:00:10 to 10:05:30; a new one starts.
    scheduler(papp, "every_minute").tick(at(10, 5, 30))
    assert keys(database_uri, "every_minute") == [
        slot_key("every_minute", at(10, 0)),
        slot_key("every_minute", at(10, 5)),  # 30 s late: within the grace
    ]


def test_backfill_enqueues_missed_slots_up_to_the_limit(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(9, 59, 50), "hourly_backfill")
    scheduler(papp, "hourly_backfill").tick(at(10, 0, 10))
    # Down until 16:20: 11:00 to 16:00 were missed; backfill_limit=3 keeps the newest 3.
    sched = scheduler(papp, "hourly_backfill")
    sched.tick(at(16, 20))
    expected = [at(10, 0), at(14, 0), at(15, 0), at(16, 0)]
    assert keys(database_uri, "hourly_backfill") == [
        slot_key("hourly_backfill", s) for s in expected
    ]
    # Running on, it enqueues the next slot and nothing twice.
    sched.tick(at(16, 40))
    sched.tick(at(17, 0, 1))
    assert keys(database_uri, "hourly_backfill")[-1] == slot_key("hourly_backfill", at(17, 0))
    assert len(keys(database_uri, "hourly_backfill")) == 5
    with papp.app_context():
        runs = [
            periodic_app.queue.get_job(row[0])
            for row in query(
                database_uri, "SELECT id FROM sqlqueue_jobs WHERE task = 'hourly_backfill'"
            )
        ]
    # Each runs as of its own slot, so the backlog runs oldest first.
    assert sorted(job.run_at for job in runs if job) == [*expected, at(17, 0)]


def test_backfill_goes_back_no_further_than_its_window(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(5, 59, 50, day=1), "daily_backfill")
    scheduler(papp, "daily_backfill").tick(at(6, 0, 5, day=1))
    # Down for five days: 06:00 of days 2-6 were missed; the window is two days.
    scheduler(papp, "daily_backfill").tick(at(7, 0, day=6))
    assert keys(database_uri, "daily_backfill") == [
        slot_key("daily_backfill", at(6, 0, day=day)) for day in (1, 5, 6)
    ]


def test_backfill_of_a_schedule_that_never_ran_starts_now(papp: Flask, database_uri: str) -> None:
    scheduler(papp, "hourly_backfill").tick(at(16, 20))
    assert keys(database_uri, "hourly_backfill") == []
    # Seen since 16:20: every worker down from 16:30 to 18:30 misses 17:00 and 18:00.
    scheduler(papp, "hourly_backfill").tick(at(18, 30))
    assert keys(database_uri, "hourly_backfill") == [
        slot_key("hourly_backfill", at(hour, 0)) for hour in (17, 18)
    ]


def test_a_slot_that_could_not_be_written_is_tried_again(papp: Flask, database_uri: str) -> None:
    """The database goes away (here: the jobs table is renamed) over a slot."""
    sched = scheduler(papp, "every_minute")
    sched.tick(at(9, 59, 50))
    sched.tick(at(10, 0, 10))
    query(database_uri, "ALTER TABLE sqlqueue_jobs RENAME TO sqlqueue_jobs_away")
    try:
        sched.tick(at(10, 1, 1))  # logs, raises nothing
    finally:
        query(database_uri, "ALTER TABLE sqlqueue_jobs_away RENAME TO sqlqueue_jobs")
    sched.tick(at(10, 1, 20))
    assert keys(database_uri, "every_minute") == [
        slot_key("every_minute", at(10, 0)),
        slot_key("every_minute", at(10, 1)),
    ]


def _no_key(account: str) -> str:
    raise KeyError(account)


def test_a_slot_job_gets_its_concurrency_key(database_uri: str) -> None:
    """A slot is enqueued as any enqueue is: the task's key function names its bucket,
    and one whose key function fails holds up no other schedule."""
    queue = SQLQueue()

    @queue.periodic(
        "* * * * *", name="sync", concurrency=1, concurrency_key=lambda account: account,
        args=["acme"],
    )  # fmt: skip
    def sync(account: str) -> None: ...

    @queue.periodic(
        "* * * * *", name="broken", concurrency=1, concurrency_key=_no_key, args=["x"]
    )  # fmt: skip
    def broken(account: str) -> None: ...

    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri})
    try:
        queue.upgrade_database(app=app)
        scheduler = Scheduler(app.extensions["sqlqueue"].store, queue.registry)
        scheduler.tick(at(9, 59, 50))  # first seen: each schedule starts at its next slot
        scheduler.tick(at(10, 0, 10))
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()
    assert query(database_uri, "SELECT idempotency_key, concurrency_key FROM sqlqueue_jobs") == [
        (slot_key("sync", at(10, 0)), "acme")
    ]


# -- in the worker -------------------------------------------------------------------------------

seconds_queue = SQLQueue()


@seconds_queue.periodic("* * * * * *", name="every_second")
def every_second() -> None:
    pass


def test_a_running_worker_enqueues_and_runs_its_schedules(papp: Flask, database_uri: str) -> None:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = database_uri
    seconds_queue.init_app(app)
    worker = seconds_queue.worker(WorkerOptions(poll_interval=0.05), app)

    def done() -> int:
        return int(
            query(
                database_uri,
                "SELECT count(*) FROM sqlqueue_jobs "
                "WHERE task = 'every_second' AND status = 'completed'",
            )[0][0]
        )

    try:
        with running(worker):
            wait_for(lambda: done() >= 3, "three slots enqueued and run")
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()
    found = keys(database_uri, "every_second")
    assert len(found) == len(set(found)) and all(k.startswith(KEY_PREFIX) for k in found)


def test_a_burst_worker_does_not_schedule(papp: Flask, database_uri: str) -> None:
    with papp.app_context():
        periodic_app.queue.worker(WorkerOptions(poll_interval=0.05)).run(burst=True)
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs")[0][0] == 0


# -- command line --------------------------------------------------------------------------------


def test_periodic_command_is_a_deprecated_name_of_schedules(papp: Flask) -> None:
    deployed(papp, at(9, 59, 50), "every_minute")
    scheduler(papp, "every_minute").tick(at(10, 0, 10))
    cli = papp.test_cli_runner()
    old = cli.invoke(args=["queue", "periodic"])
    new = cli.invoke(args=["queue", "schedules"])
    assert old.exit_code == 0 and new.exit_code == 0, (old.output, new.output)
    assert old.stdout == new.stdout  # the same rows, from the same code
    assert "deprecated" in old.stderr and "'flask queue schedules'" in old.stderr
    assert new.stderr == ""
    lines = {line.split()[0]: line for line in old.stdout.splitlines()[1:]}
    assert set(lines) == {"daily_backfill", "every_minute", "hourly_backfill", "quarter_paris"}
    assert "2024-06-03 10:00:00" in lines["every_minute"]  # last slot enqueued
    assert "*/15 * * * * (Europe/Paris)" in lines["quarter_paris"]
    # Next run shown in UTC and in the schedule's zone: Paris is 1 or 2 hours ahead of UTC.
    cells = lines["quarter_paris"].split()
    utc = datetime.fromisoformat(f"{cells[9]} {cells[10]}")
    local = datetime.fromisoformat(f"{cells[11]} {cells[12]}")
    assert local - utc in (timedelta(hours=1), timedelta(hours=2))
    assert lines["hourly_backfill"].split()[-1] == "yes"


def test_status_shows_schedules(papp: Flask) -> None:
    result = papp.test_cli_runner().invoke(args=["queue", "status"])
    assert result.exit_code == 0, result.output
    assert "No jobs." in result.output
    assert "periodic every_minute: '* * * * *' (UTC), next " in result.output
    assert "periodic quarter_paris: '*/15 * * * *' (Europe/Paris)" in result.output


def test_periodic_command_without_schedules(ctx: Flask) -> None:
    result = ctx.test_cli_runner().invoke(args=["queue", "periodic"])
    assert result.exit_code == 0
    assert "No periodic tasks" in result.output


def test_admin_dashboard_lists_schedules(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(9, 59, 50), "quarter_paris")
    scheduler(papp, "quarter_paris").tick(at(10, 0, 10))
    papp.secret_key = "test secret"
    papp.register_blueprint(
        periodic_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    page = papp.test_client().get("/queue/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    section = html[html.index('id="sqlqueue-periodic"') :]
    section = section[: section.index("</section>")]
    for name in ("every_minute", "quarter_paris", "hourly_backfill", "daily_backfill"):
        assert f">{name}</a>" in section
    assert '<code>*/15 * * * *</code> <span class="muted">Europe/Paris</span>' in section
    assert "2024-06-03 10:00:00 UTC" in section  # quarter_paris's last slot
    assert "none yet" in section  # every_minute's


def test_dashboard_without_schedules_has_no_section(ctx: Flask) -> None:
    ctx.secret_key = "test secret"
    ctx.register_blueprint(
        sample_queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    page = ctx.test_client().get("/queue/")
    assert page.status_code == 200
    assert "sqlqueue-periodic" not in page.get_data(as_text=True)


# -- acceptance: two worker processes, three minutes ----------------------------------------------


@pytest.mark.slow
def test_acceptance_two_worker_processes_for_three_minutes(tmp_path: Path) -> None:
    """ISSUE 6 ACCEPTANCE, ~3.5 minutes: two `flask queue work` processes per backend
    run the scheduler of a one-minute schedule for three minutes; every minute in that
    time has exactly one job, and every job ran.

    One test for all backends at once (SQLite, and PostgreSQL / MariaDB where their URLs
    are set), so the three minutes are spent once.
    """
    with contextlib.ExitStack() as stack:
        uris = {"sqlite": f"sqlite:///{tmp_path / 'queue.db'}"}
        for kind, var in SERVER_URL_VARS.items():
            if os.environ.get(var):
                uris[kind] = stack.enter_context(fresh_database(kind))
        for uri in uris.values():
            app = make_periodic_app(uri)
            app.extensions["sqlqueue"].store.engine.dispose()
        workers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        for kind, uri in uris.items():
            for n in range(2):
                log = tmp_path / f"{kind}-{n}.log"
                env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
                env.update(
                    FLASK_APP="tests.periodic_app:create_app",
                    PERIODIC_DATABASE_URI=uri,
                    PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                )
                work = queue_work(uri, "--poll-interval", "0.5", env=env, output=log)
                workers.append((kind, stack.enter_context(work), log))
        try:
            deadline = time.monotonic() + 180
            # Stop well away from a minute boundary, so the last slot's job has run.
            while time.monotonic() < deadline or not 10 <= datetime.now(UTC).second <= 50:
                dead = [(k, p.returncode, log) for k, p, log in workers if p.poll() is not None]
                assert not dead, f"a worker exited early: {dead}: {dead[0][2].read_text()}"
                time.sleep(1)
        finally:
            stopped = datetime.now(UTC)
            for _, proc, _ in workers:
                proc.send_signal(signal.SIGTERM)
            for _, proc, _ in workers:
                with contextlib.suppress(subprocess.TimeoutExpired):  # killed on the way out
                    proc.wait(timeout=60)
        for kind, proc, log in workers:
            assert proc.returncode == 0, f"{kind}: {log.read_text()[-3000:]}"
        for kind, uri in uris.items():
            rows = query(
                uri,
                "SELECT idempotency_key, status FROM sqlqueue_jobs WHERE task = 'every_minute'",
            )
            found = sorted(key for key, _ in rows)
            assert len(found) == len(set(found)), f"{kind}: a slot has two jobs: {found}"
            slots = [_slot(key) for key in found]
            # Every minute boundary from the first scheduler's first look (a new schedule
            # starts at its next slot) until the workers stopped, each exactly once.
            first = _first_seen(uri).replace(second=0, microsecond=0) + timedelta(minutes=1)
            expected = [
                first + timedelta(minutes=n)
                for n in range(5)
                if first + timedelta(minutes=n) < stopped
            ]
            assert len(slots) >= 3, f"{kind}: {found}"
            assert slots == expected, f"{kind}: {found}, not {expected}"
            assert {status for _, status in rows} == {"completed"}, f"{kind}: {rows}"


def _first_seen(uri: str) -> datetime:
    engine = sa.create_engine(uri)
    try:
        with engine.connect() as conn:
            seen: datetime = conn.execute(
                sa.select(schedules.c.created_at).where(schedules.c.task == "every_minute")
            ).scalar_one()
    finally:
        engine.dispose()
    return seen


def _slot(key: str) -> datetime:
    return datetime.strptime(
        key.removeprefix(f"{KEY_PREFIX}every_minute:"), "%Y-%m-%dT%H:%M:%SZ"
    ).replace(tzinfo=UTC)

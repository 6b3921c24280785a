"""Schedules steered at run time: disable, enable and "run now", kept in the database so
every worker's scheduler obeys them; through the scheduler, real workers, the Python
API, ``flask queue schedules``, the admin's Schedules page, and the migration.

The scheduler is driven with explicit times (``Scheduler.tick(now)``) where it can be;
the worker tests use one-second schedules and wait for conditions, never for durations.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import UnknownSchedule
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import schema
from flask_sqlqueue.cli.base import cli_actor
from flask_sqlqueue.core import periodic
from flask_sqlqueue.core.models import schedules
from flask_sqlqueue.testing import enqueue_periodic
from tests import periodic_app
from tests.conftest import install_schema
from tests.conftest import query
from tests.test_actions import audit_rows
from tests.test_admin import TOKEN
from tests.test_admin import read
from tests.test_periodic import at
from tests.test_periodic import deployed
from tests.test_periodic import keys
from tests.test_periodic import make_periodic_app
from tests.test_periodic import scheduler
from tests.test_periodic import slot_key
from tests.waiting import wait_for
from tests.workers import running


@pytest.fixture
def papp(database_uri: str) -> Iterator[Flask]:
    """``tests.periodic_app`` on the test's database, schema in place."""
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = make_periodic_app(database_uri)
    yield app
    app.extensions["sqlqueue"].store.engine.dispose()


def toggle(app: Flask, name: str, enabled: bool, when: datetime) -> bool:
    """Enable or disable ``name`` as of ``when`` (the scheduler's explicit clock)."""
    store = app.extensions["sqlqueue"].store
    changed: bool = store.run_write(lambda conn: periodic.set_enabled(conn, name, enabled, when))
    return changed


def row(database_uri: str, name: str) -> Any:
    """The ledger row of ``name`` read through the model's types, or ``None``."""
    engine = sa.create_engine(database_uri, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(schedules).where(schedules.c.task == name)).first()
    finally:
        engine.dispose()


def ledger(database_uri: str, name: str) -> list[tuple[Any, ...]]:
    found = row(database_uri, name)
    return [] if found is None else [(found.enabled, found.last_slot)]


def job_id(database_uri: str, task: str, *, newest: bool) -> int:
    """The id of ``task``'s newest (or oldest) job."""
    order = "DESC" if newest else "ASC"
    sql = f"SELECT id FROM sqlqueue_jobs WHERE task = :t ORDER BY id {order} LIMIT 1"
    [(found,)] = query(database_uri, sql, t=task)
    return int(found)


def job_count(database_uri: str, task: str) -> int:
    rows = query(database_uri, "SELECT count(*) FROM sqlqueue_jobs WHERE task = :t", t=task)
    return int(rows[0][0])


# -- the scheduler obeys the flag ------------------------------------------------------------


def test_a_disabled_schedule_enqueues_nothing_and_comes_back_without_a_burst(
    papp: Flask, database_uri: str
) -> None:
    names = ("every_minute", "hourly_backfill")
    deployed(papp, at(9, 59, 50), *names)
    sched = scheduler(papp, *names)
    sched.tick(at(10, 0, 10))
    assert toggle(papp, "every_minute", False, at(10, 0, 30))
    assert toggle(papp, "hourly_backfill", False, at(10, 0, 30))
    assert not toggle(papp, "every_minute", False, at(10, 0, 31))  # disabled already

    for now in (at(10, 1, 5), at(10, 2, 5), at(11, 0, 5), at(12, 0, 5)):
        sched.tick(now)
    for name in names:
        assert keys(database_uri, name) == [slot_key(name, at(10, 0))]
    with papp.app_context():
        infos = {info.name: info for info in periodic_app.queue.schedules()}
    assert not infos["every_minute"].enabled and infos["every_minute"].next_run is None
    assert infos["every_minute"].last_slot == at(10, 0)  # its last run, not moved
    assert infos["quarter_paris"].enabled and infos["quarter_paris"].next_run is not None

    # Enabled again at 12:00:30: neither the 12:00 slot (within the minute's grace) nor
    # the hours missed by the backfilling schedule are enqueued, by this scheduler or by
    # a worker starting afresh.
    assert toggle(papp, "every_minute", True, at(12, 0, 30))
    assert toggle(papp, "hourly_backfill", True, at(12, 0, 30))
    sched.tick(at(12, 0, 40))
    restarted = make_periodic_app(database_uri)
    try:
        scheduler(restarted, *names).tick(at(12, 0, 45))
    finally:
        restarted.extensions["sqlqueue"].store.engine.dispose()
    for name in names:
        assert keys(database_uri, name) == [slot_key(name, at(10, 0))]

    # Then each carries on from its next slot.
    sched.tick(at(12, 1, 5))
    sched.tick(at(13, 0, 5))
    assert keys(database_uri, "every_minute") == [
        slot_key("every_minute", slot) for slot in (at(10, 0), at(12, 1), at(13, 0))
    ]
    assert keys(database_uri, "hourly_backfill") == [
        slot_key("hourly_backfill", slot) for slot in (at(10, 0), at(13, 0))
    ]


def test_a_schedule_disabled_before_any_worker_saw_it_never_runs_until_enabled(
    papp: Flask, database_uri: str
) -> None:
    assert toggle(papp, "every_minute", False, at(9, 59, 50))
    assert ledger(database_uri, "every_minute") == [(False, None)]
    sched = scheduler(papp, "every_minute")
    sched.tick(at(10, 0, 5))
    sched.tick(at(10, 1, 5))
    assert keys(database_uri, "every_minute") == []
    assert toggle(papp, "every_minute", True, at(10, 1, 30))
    sched.tick(at(10, 2, 5))
    assert keys(database_uri, "every_minute") == [slot_key("every_minute", at(10, 2))]


def test_the_test_helpers_enqueue_no_slot_of_a_disabled_schedule(papp: Flask) -> None:
    with papp.app_context():
        periodic_app.queue.disable_schedule("every_minute")
        made = enqueue_periodic(since=at(10, 0), until=at(11, 0))
        assert {job.task for job in made} == {"hourly_backfill", "quarter_paris"}
        periodic_app.queue.enable_schedule("every_minute")
        again = enqueue_periodic(since=at(10, 0), until=at(10, 2))
        assert [job.task for job in again] == ["every_minute"] * 2


# -- real workers ------------------------------------------------------------------------------

live = SQLQueue()


@live.periodic("* * * * * *", name="steered", args=["slot"])
def steered(label: str) -> str:
    return label


@live.periodic("* * * * * *", name="witness")
def witness() -> None:
    """Never disabled: its jobs show that the schedulers keep ticking."""


def live_app(database_uri: str) -> Flask:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = database_uri
    live.init_app(app)
    return app


def completed(database_uri: str, task: str) -> int:
    rows = query(
        database_uri,
        "SELECT count(*) FROM sqlqueue_jobs WHERE task = :t AND status = 'completed'",
        t=task,
    )
    return int(rows[0][0])


def slots(database_uri: str, task: str) -> list[datetime]:
    """The slots of ``task``'s periodic jobs (not those run by hand)."""
    schedule = live.registry[task].schedule
    assert schedule is not None
    found = [schedule.slot_of(key) for key in keys(database_uri, task) if key is not None]
    return [slot for slot in found if slot is not None]


def toggled_at(database_uri: str, name: str) -> datetime:
    value: datetime = row(database_uri, name).toggled_at
    return value


def test_two_workers_obey_disable_run_now_and_enable(papp: Flask, database_uri: str) -> None:
    """Two workers, each with its own scheduler and engine, on one database: a disabled
    schedule makes no job while the other schedule keeps making them; "run now" makes
    exactly one; enabled again, its runs resume from the slots after the enable."""
    apps = [live_app(database_uri) for _ in range(2)]
    workers = [live.worker(WorkerOptions(poll_interval=0.05), app) for app in apps]
    try:
        with running(workers[0]), running(workers[1]):
            wait_for(lambda: completed(database_uri, "steered") >= 2, "steered runs")
            with apps[0].app_context():
                assert live.disable_schedule("steered") is True
            disabled_at = toggled_at(database_uri, "steered")
            before = job_count(database_uri, "steered")
            seen = job_count(database_uri, "witness")
            wait_for(lambda: job_count(database_uri, "witness") >= seen + 3, "3 more witness slots")
            assert job_count(database_uri, "steered") == before

            with apps[1].app_context():
                job = live.run_schedule("steered")
            assert job.idempotency_key is None and job.args == ["slot"]
            with apps[1].app_context():
                assert job.wait(timeout=60).result == "slot"
            seen = job_count(database_uri, "witness")
            wait_for(lambda: job_count(database_uri, "witness") >= seen + 2, "2 more witness slots")
            assert job_count(database_uri, "steered") == before + 1

            with apps[1].app_context():
                assert live.enable_schedule("steered") is True
                assert live.enable_schedule("steered") is False
            enabled_at = toggled_at(database_uri, "steered")
            wait_for(
                lambda: completed(database_uri, "steered") >= before + 3, "steered runs resume"
            )
    finally:
        for app in apps:
            app.extensions["sqlqueue"].store.engine.dispose()
    made = slots(database_uri, "steered")
    assert len(made) == len(set(made))
    assert not [slot for slot in made if disabled_at < slot <= enabled_at]
    assert [slot for slot in made if slot > enabled_at]


# -- the Python API -----------------------------------------------------------------------------


def test_unknown_schedules_are_refused_and_change_nothing(papp: Flask, database_uri: str) -> None:
    with papp.app_context():
        for call in (
            periodic_app.queue.disable_schedule,
            periodic_app.queue.enable_schedule,
            periodic_app.queue.run_schedule,
        ):
            with pytest.raises(UnknownSchedule, match="known schedules: daily_backfill") as info:
                call("every_minte")
            assert isinstance(info.value, LookupError)
    # A registered task without a schedule is no schedule either.
    queue = SQLQueue()

    @queue.task(name="plain")
    def plain() -> None: ...

    with pytest.raises(UnknownSchedule, match="'plain'"):
        periodic.find_schedule(queue.registry, "plain")
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_schedules") == [(0,)]
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]


def test_run_now_leaves_the_cadence_alone(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(9, 59, 50), "quarter_paris")
    scheduler(papp, "quarter_paris").tick(at(10, 0, 10))
    with papp.app_context():
        job = periodic_app.queue.run_schedule("quarter_paris")
    assert (job.task, job.queue, job.args, job.kwargs) == (
        "quarter_paris",
        "cron",
        [3],
        {"label": "q"},
    )
    assert job.idempotency_key is None
    assert ledger(database_uri, "quarter_paris") == [(True, at(10, 0))]
    scheduler(papp, "quarter_paris").tick(at(10, 15, 5))
    found = keys(database_uri, "quarter_paris")
    assert found.count(None) == 1  # the run by hand; the slots' jobs went on as before
    assert sorted(key for key in found if key) == [
        slot_key("quarter_paris", at(10, 0)),
        slot_key("quarter_paris", at(10, 15)),
    ]


# -- flask queue schedules ---------------------------------------------------------------------


def test_schedules_command_lists_disables_enables_and_runs(papp: Flask, database_uri: str) -> None:
    deployed(papp, at(9, 59, 50), "every_minute")
    scheduler(papp, "every_minute").tick(at(10, 0, 10))
    cli = papp.test_cli_runner()

    def run(*args: str) -> str:
        result = cli.invoke(args=["queue", "schedules", *args])
        assert result.exit_code == 0, result.output
        return str(result.output)

    listing = run()
    assert listing.split("\n")[0].split() == [
        "name", "schedule", "enabled", "last", "run", "(UTC)", "next", "run", "(UTC)",
        "next", "run", "(its", "zone)", "queue", "backfill",
    ]  # fmt: skip
    rows = {line.split()[0]: line for line in listing.splitlines()[1:]}
    assert set(rows) == {"daily_backfill", "every_minute", "hourly_backfill", "quarter_paris"}
    assert "*/15 * * * * (Europe/Paris)  yes" in rows["quarter_paris"]
    assert "2024-06-03 10:00:00" in rows["every_minute"]  # its last run

    assert run("disable", "every_minute") == "Schedule 'every_minute' disabled.\n"
    assert run("disable", "every_minute") == "Schedule 'every_minute' was disabled already.\n"
    assert ledger(database_uri, "every_minute") == [(False, at(10, 0))]
    line = next(line for line in run().splitlines() if line.startswith("every_minute"))
    assert line.split()[7:] == [
        "no",
        "2024-06-03",
        "10:00:00",
        "-",
        "(disabled)",
        "-",
        "default",
        "no",
    ]
    status = cli.invoke(args=["queue", "status"]).output
    assert "periodic every_minute: '* * * * *' (UTC), disabled" in status

    assert re.fullmatch(r"Job \d+ pending on queue 'default'\.\n", run("run", "every_minute"))
    assert job_count(database_uri, "every_minute") == 2  # the slot's, and this one
    assert run("enable", "every_minute") == "Schedule 'every_minute' enabled.\n"
    assert run("enable", "every_minute") == "Schedule 'every_minute' was enabled already.\n"
    assert ledger(database_uri, "every_minute") == [(True, at(10, 0))]
    # Each change audited once, with the command line's user; a no-op is not a change.
    entries = audit_rows(database_uri)
    assert {actor for actor, _, _, _ in entries} == {cli_actor()}
    assert [(action, detail) for _, action, _, detail in entries] == [
        ("disable_schedule", {"schedule": "every_minute"}),
        ("run_schedule", {"schedule": "every_minute"}),
        ("enable_schedule", {"schedule": "every_minute"}),
    ]
    assert entries[1][2] == job_id(database_uri, "every_minute", newest=True)


@pytest.mark.parametrize("action", ["disable", "enable", "run"])
def test_schedules_command_refuses_an_unknown_name(
    papp: Flask, database_uri: str, action: str
) -> None:
    result = papp.test_cli_runner().invoke(args=["queue", "schedules", action, "every_minte"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1
    assert result.output.startswith("Error: No schedule 'every_minte'")
    assert "known schedules: daily_backfill, every_minute" in result.output
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_schedules") == [(0,)]
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]


# -- the admin -------------------------------------------------------------------------------


@pytest.fixture
def admin(papp: Flask) -> Any:
    papp.secret_key = "test secret"
    papp.register_blueprint(
        periodic_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    return papp.test_client()


def token(client: Any) -> str:
    found = TOKEN.search(read(client.get("/queue/schedules")).get_data(as_text=True))
    assert found, "no CSRF token on the schedules page"
    return found.group(1)


def test_the_schedules_page_lists_each_schedule_with_its_actions(admin: Any, papp: Flask) -> None:
    deployed(papp, at(9, 59, 50), "quarter_paris")
    scheduler(papp, "quarter_paris").tick(at(10, 0, 10))
    page = read(admin.get("/queue/schedules"))
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'href="/queue/schedules" aria-current="page">Schedules</a>' in html
    assert 'href="/queue/schedules"' in read(admin.get("/queue/")).get_data(as_text=True)
    for name in ("every_minute", "quarter_paris", "hourly_backfill", "daily_backfill"):
        assert f">{name}</a>" in html
        for action in ("disable", "run"):
            assert f'action="/queue/schedules/{name}/{action}"' in html
    assert '<code>*/15 * * * *</code> <span class="muted">Europe/Paris</span>' in html
    assert "2024-06-03 10:00:00 UTC" in html  # quarter_paris's last run
    assert "/enable" not in html  # every schedule is enabled


def test_admin_actions_disable_run_and_enable(admin: Any, database_uri: str) -> None:
    csrf = token(admin)
    answer = read(admin.post("/queue/schedules/every_minute/disable", data={"csrf_token": csrf}))
    assert answer.status_code == 303 and answer.location.endswith("/queue/schedules")
    assert ledger(database_uri, "every_minute") == [(False, None)]
    html = read(admin.get("/queue/schedules")).get_data(as_text=True)
    assert "Schedule every_minute is disabled" in html
    assert 'action="/queue/schedules/every_minute/enable"' in html
    assert "none while disabled" in html

    answer = read(admin.post("/queue/schedules/every_minute/run", data={"csrf_token": csrf}))
    assert answer.status_code == 303
    assert job_count(database_uri, "every_minute") == 1
    html = read(admin.get("/queue/schedules")).get_data(as_text=True)
    assert re.search(r"Schedule every_minute: one run enqueued now, as job \d+\.", html)

    answer = read(admin.post("/queue/schedules/every_minute/enable", data={"csrf_token": csrf}))
    assert answer.status_code == 303
    assert ledger(database_uri, "every_minute") == [(True, None)]
    # Each action audited, as every admin action is (the default actor: the address).
    assert [(a, action, job, d) for a, action, job, d in audit_rows(database_uri)] == [
        ("127.0.0.1", "disable_schedule", None, {"schedule": "every_minute"}),
        (
            "127.0.0.1",
            "run_schedule",
            job_id(database_uri, "every_minute", newest=True),
            {"schedule": "every_minute"},
        ),
        ("127.0.0.1", "enable_schedule", None, {"schedule": "every_minute"}),
    ]


def test_the_python_doors_are_audited_with_their_actor(papp: Flask, database_uri: str) -> None:
    queue = periodic_app.queue
    with papp.app_context():
        assert queue.disable_schedule("every_minute", actor="ops-bot")
        made = queue.run_schedule("every_minute")
        assert queue.enable_schedule("every_minute", actor="ops-bot")
        assert queue.pause("default", actor="ops-bot")
        assert queue.resume("default")
    assert [(a, action, job) for a, action, job, _ in audit_rows(database_uri)] == [
        ("ops-bot", "disable_schedule", None),
        ("app", "run_schedule", made.id),
        ("ops-bot", "enable_schedule", None),
        ("ops-bot", "pause", None),
        ("app", "resume", None),
    ]


def test_admin_schedule_actions_need_the_token_a_post_and_a_known_name(
    admin: Any, database_uri: str
) -> None:
    csrf = token(admin)
    for action in ("disable", "enable", "run"):
        path = f"/queue/schedules/every_minute/{action}"
        for bad in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}):
            refused = read(admin.post(path, data=bad))
            assert refused.status_code == 400, (action, bad)
            assert "security token" in refused.get_data(as_text=True)
        assert read(admin.get(path)).status_code == 405
        unknown = read(
            admin.post(f"/queue/schedules/every_minte/{action}", data={"csrf_token": csrf})
        )
        assert unknown.status_code == 404
        assert "No schedule &#39;every_minte&#39;" in unknown.get_data(as_text=True)
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_schedules") == [(0,)]
    assert query(database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(0,)]


# -- the migration -------------------------------------------------------------------------------


def test_the_migration_keeps_every_schedule_enabled_and_downgrades(database_uri: str) -> None:
    engine = sa.create_engine(database_uri, poolclass=sa.pool.NullPool)
    try:
        schema.upgrade(engine, "0010")
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO sqlqueue_schedules (task, last_slot, created_at, updated_at) "
                    "VALUES ('kept', NULL, :now, :now)"
                ),
                {"now": datetime(2024, 6, 3, 10, 0)},
            )
        schema.upgrade(engine)
        assert query(database_uri, "SELECT task, enabled, toggled_at FROM sqlqueue_schedules") == [
            ("kept", True, None)
        ]
        schema.downgrade(engine, "0010")
        columns = {c["name"] for c in sa.inspect(engine).get_columns("sqlqueue_schedules")}
        assert columns == {"task", "last_slot", "created_at", "updated_at"}
        schema.upgrade(engine)
    finally:
        engine.dispose()

"""Acting on live jobs (issue 16): run now, edit and replay, duplicate, the audit log and
the admin's read-only mode, through the admin and the CLI, on every backend."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import pytest
from click.testing import Result
from flask import Flask
from flask import redirect

from flask_sqlqueue import schema
from flask_sqlqueue.admin import pages
from flask_sqlqueue.cli.base import queue_cli
from flask_sqlqueue.core.models import utcnow
from tests import sample_app
from tests.conftest import query
from tests.conftest import table_names
from tests.test_admin import Admin
from tests.test_admin import dead_job
from tests.test_admin import pending_job
from tests.workers import run_burst

ACTOR = "alice@example.com"
ALWAYS_FAILS = "tests.sample_app.always_fails"


@pytest.fixture
def build(make_app: Callable[..., Flask], database_uri: str) -> Callable[..., Admin]:
    def make(
        *,
        authorize_write: Callable[[], Any] | None = None,
        actor: Callable[[], Any] | None = lambda: ACTOR,
    ) -> Admin:
        app = make_app()
        app.secret_key = "test secret"
        app.register_blueprint(
            sample_app.queue.admin_blueprint(
                authorize=lambda: True, authorize_write=authorize_write, actor=actor
            ),
            url_prefix="/queue",
        )
        return Admin(app, app.test_client(), "/queue", database_uri)

    return make


@pytest.fixture
def admin(build: Callable[..., Admin]) -> Admin:
    return build()


def row(admin: Admin, job_id: int) -> dict[str, Any]:
    """The job's row as stored, read around the queue's code."""
    rows = query(
        admin.database_uri,
        "SELECT status, queue, priority, attempts, payload, run_at, task, max_attempts "
        "FROM sqlqueue_jobs WHERE id = :i",
        i=job_id,
    )
    assert rows, f"no job {job_id}"
    status, queue, priority, attempts, payload, run_at, task, max_attempts = rows[0]
    return {
        "status": status,
        "queue": queue,
        "priority": priority,
        "attempts": attempts,
        "payload": json.loads(payload),
        "run_at": run_at,
        "task": task,
        "max_attempts": max_attempts,
    }


def audit_rows(database_uri: str) -> list[tuple[Any, ...]]:
    """``(actor, action, job_id, detail)`` of every audit entry, oldest first."""
    rows = query(
        database_uri, "SELECT actor, action, job_id, detail FROM sqlqueue_audit_log ORDER BY id"
    )
    return [(a, b, c, json.loads(d) if d else None) for a, b, c, d in rows]


def aware(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite's text dates
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def flashed(response: Any) -> str:
    return str(response.get_data(as_text=True))


# -- run now -----------------------------------------------------------------------------------


def test_run_now_makes_a_delayed_job_due_and_a_worker_runs_it(admin: Admin) -> None:
    job_id = pending_job(admin, delay=timedelta(hours=1))
    admin.work()
    assert admin.status(job_id) == "pending"  # not due: the worker left it
    page = admin.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert f"/jobs/{job_id}/run-now" in page

    response = admin.post(f"/jobs/{job_id}/run-now")
    assert response.status_code == 303
    assert aware(row(admin, job_id)["run_at"]) <= utcnow() + timedelta(seconds=5)
    admin.work()
    assert admin.status(job_id) == "completed"
    [(actor, action, audited, detail)] = audit_rows(admin.database_uri)
    assert (actor, action, audited) == (ACTOR, "run_now", job_id)
    assert "run_at_was" in detail


def test_run_now_refuses_a_job_that_is_not_pending(admin: Admin) -> None:
    job_id = dead_job(admin)
    before = row(admin, job_id)
    response = admin.post(f"/jobs/{job_id}/run-now")
    assert response.status_code == 409
    assert "Only pending jobs can be run now" in response.get_data(as_text=True)
    assert row(admin, job_id) == before
    assert audit_rows(admin.database_uri) == []


# -- edit and replay ---------------------------------------------------------------------------


def test_edit_and_replay_a_dead_job(admin: Admin) -> None:
    job_id = dead_job(admin, "first")
    page = admin.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert f"/jobs/{job_id}/edit" in page

    response = admin.post(
        f"/jobs/{job_id}/edit",
        {"args": '["second"]', "kwargs": "{}", "queue": "elsewhere", "priority": "7"},
    )
    assert response.status_code == 303
    after = row(admin, job_id)
    assert after["status"] == "pending"
    assert after["attempts"] == 0
    assert after["payload"] == {"args": ["second"], "kwargs": {}}
    assert (after["queue"], after["priority"]) == ("elsewhere", 7)
    [(actor, action, audited, detail)] = audit_rows(admin.database_uri)
    assert (actor, action, audited) == (ACTOR, "edit_replay", job_id)
    assert detail == {
        "before": {"args": ["first"], "queue": "default", "priority": 0},
        "after": {"args": ["second"], "queue": "elsewhere", "priority": 7},
    }


def test_edit_keeps_what_is_not_changed(admin: Admin) -> None:
    job_id = dead_job(admin, "kept")
    admin.post(f"/jobs/{job_id}/edit", {"args": '["kept"]', "kwargs": "{}", "priority": "3"})
    after = row(admin, job_id)
    assert after["payload"] == {"args": ["kept"], "kwargs": {}}
    assert (after["status"], after["queue"], after["priority"]) == ("pending", "default", 3)


@pytest.mark.parametrize(
    ("form", "fragment"),
    [
        ({"args": "[not json"}, "args is not valid JSON"),
        ({"args": '{"message": "x"}'}, "args must be a JSON array"),
        ({"args": '["a", "b"]'}, "does not take these arguments"),
        ({"kwargs": '{"nope": 1}'}, "does not take these arguments"),
        ({"args": "[NaN]"}, "NaN"),
        ({"queue": "no spaces allowed"}, "not a valid queue name"),
        ({"priority": "high"}, "priority must be a whole number"),
        ({"priority": str(2**40)}, "32-bit"),
    ],
)
def test_edit_with_bad_input_changes_nothing(
    admin: Admin, form: dict[str, str], fragment: str
) -> None:
    job_id = dead_job(admin, "original")
    before = row(admin, job_id)
    response = admin.post(f"/jobs/{job_id}/edit", {"args": '["original"]', **form})
    assert response.status_code == 400, response.get_data(as_text=True)
    assert fragment in response.get_data(as_text=True)
    assert row(admin, job_id) == before
    assert audit_rows(admin.database_uri) == []


def test_edit_refuses_a_job_that_is_not_dead(admin: Admin) -> None:
    job_id = pending_job(admin)
    before = row(admin, job_id)
    response = admin.post(f"/jobs/{job_id}/edit", {"args": "[5, 6]", "kwargs": "{}"})
    assert response.status_code == 409
    assert row(admin, job_id) == before
    assert audit_rows(admin.database_uri) == []


# -- duplicate ---------------------------------------------------------------------------------


def test_duplicate_enqueues_a_copy_with_fresh_attempts(admin: Admin) -> None:
    with admin.ctx():
        source = sample_app.report.using(priority=9).enqueue(11)
    admin.work()  # the worker serves every queue
    assert admin.status(source.id) == "completed"

    response = admin.post(f"/jobs/{source.id}/duplicate")
    assert response.status_code == 303
    copy_id = int(response.headers["Location"].rsplit("/", 1)[1])
    assert copy_id != source.id
    original, copy = row(admin, source.id), row(admin, copy_id)
    assert copy["status"] == "pending"
    assert copy["attempts"] == 0
    for field in ("task", "payload", "queue", "priority", "max_attempts"):
        assert copy[field] == original[field], field
    assert original["status"] == "completed"  # the source is left as it was
    admin.work()
    assert admin.status(copy_id) == "completed"
    [(actor, action, audited, detail)] = audit_rows(admin.database_uri)
    assert (actor, action, audited, detail) == (ACTOR, "duplicate", source.id, {"new_job": copy_id})


def test_duplicate_of_a_unique_job_whose_key_is_held_says_so_and_changes_nothing(
    admin: Admin,
) -> None:
    with admin.ctx():
        source = sample_app.single.enqueue(7)  # pending: it holds its own key
    response = admin.post(f"/jobs/{source.id}/duplicate")
    assert response.status_code == 409
    page = response.get_data(as_text=True)
    assert f"Job {source.id} was not duplicated" in page
    assert f"job {source.id} (pending) holds the copy&#39;s key" in page
    assert query(admin.database_uri, "SELECT count(*) FROM sqlqueue_jobs") == [(1,)]
    assert audit_rows(admin.database_uri) == []
    # Once the key is free (the job ran), the copy is made and audited.
    admin.work()
    response = admin.post(f"/jobs/{source.id}/duplicate")
    assert response.status_code == 303
    copy_id = int(response.headers["Location"].rsplit("/", 1)[1])
    assert copy_id != source.id
    [(_actor, action, audited, detail)] = audit_rows(admin.database_uri)
    assert (action, audited, detail) == ("duplicate", source.id, {"new_job": copy_id})


# -- the audit log -----------------------------------------------------------------------------


def test_every_admin_action_is_audited_with_its_actor(admin: Admin) -> None:
    retried, deleted = dead_job(admin), dead_job(admin)
    replayed = dead_job(admin, "bulk")
    cancelled = pending_job(admin)
    admin.post(f"/jobs/{retried}/retry")
    admin.post(f"/jobs/{cancelled}/cancel")
    admin.post(f"/jobs/{deleted}/delete")
    admin.post("/jobs/retry-dead", {"task": ALWAYS_FAILS})
    admin.post("/queues/default/pause")
    admin.post("/queues/default/resume")
    entries = audit_rows(admin.database_uri)
    assert {entry[0] for entry in entries} == {ACTOR}
    assert [(action, job) for _, action, job, _ in entries] == [
        ("retry", retried),
        ("cancel", cancelled),
        ("delete", deleted),
        ("retry_dead", None),
        ("pause", None),
        ("resume", None),
    ]
    assert entries[2][3] == {"task": ALWAYS_FAILS, "status": "dead"}
    assert entries[3][3] == {"task": ALWAYS_FAILS, "replayed": 1}
    assert admin.status(replayed) == "pending"
    assert entries[4][3] == {"queue": "default"}


def test_bulk_actions_write_one_entry_per_job(admin: Admin) -> None:
    ids = [pending_job(admin) for _ in range(3)]
    admin.post("/jobs/bulk", {"action": "cancel", "ids": [str(i) for i in ids]})
    assert [(action, job) for _, action, job, _ in audit_rows(admin.database_uri)] == [
        ("cancel", i) for i in ids
    ]


def test_the_default_actor_is_the_remote_address(build: Callable[..., Admin]) -> None:
    admin = build(actor=None)
    job_id = dead_job(admin)
    admin.post(f"/jobs/{job_id}/retry")
    [(actor, action, _, _)] = audit_rows(admin.database_uri)
    assert (actor, action) == ("127.0.0.1", "retry")


def test_audit_page_lists_entries_newest_first_a_page_at_a_time(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "AUDIT_PAGE", 2)
    ids = [pending_job(admin) for _ in range(3)]
    for job_id in ids:
        admin.post(f"/jobs/{job_id}/cancel")
    page = admin.get("/audit").get_data(as_text=True)
    shown = [int(i) for i in re.findall(r'/queue/jobs/(\d+)"', page)]
    assert shown == [ids[2], ids[1]]
    assert ACTOR in page
    older = re.search(r'href="([^"]+)">Older', page)
    assert older
    rest = admin.client.get(older.group(1).replace("&amp;", "&")).get_data(as_text=True)
    assert [int(i) for i in re.findall(r'/queue/jobs/(\d+)"', rest)] == [ids[0]]
    # A job's page shows its own entries.
    job_page = admin.get(f"/jobs/{ids[0]}").get_data(as_text=True)
    assert "sqlqueue-job-audit" in job_page
    assert ACTOR in job_page


def test_the_actor_is_escaped(build: Callable[..., Admin]) -> None:
    admin = build(actor=lambda: "<script>x</script>")
    job_id = pending_job(admin)
    admin.post(f"/jobs/{job_id}/cancel")
    page = admin.get("/audit").get_data(as_text=True)
    assert "<script>x</script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page


# -- read-only mode ----------------------------------------------------------------------------


def post_routes(admin: Admin, job_id: int) -> list[str]:
    """Every POST route of the admin, with real values in its placeholders."""
    paths = []
    for rule in admin.app.url_map.iter_rules():
        if rule.endpoint.startswith("sqlqueue.") and "POST" in (rule.methods or ()):
            paths.append(
                rule.rule.replace("<int:job_id>", str(job_id)).replace("<name>", "default")
            )
    return sorted(paths)


@pytest.mark.parametrize("answer", [False, None, "yes"])
def test_a_read_only_user_sees_no_buttons_and_every_post_is_403(
    build: Callable[..., Admin], answer: Any
) -> None:
    admin = build(authorize_write=lambda: answer)
    dead, delayed = dead_job(admin), pending_job(admin, delay=3600)
    with admin.ctx():
        sample_app.queue.pause("reports")
    for path in ("/", "/jobs", "/jobs?status=dead", f"/jobs/{dead}", f"/jobs/{delayed}"):
        page = admin.get(path).get_data(as_text=True)
        assert 'method="post"' not in page, path
        assert "Read-only" in page, path
    confirm = admin.get("/jobs/retry-dead").get_data(as_text=True)
    assert 'method="post"' not in confirm

    routes = post_routes(admin, dead)
    assert {"/queue/jobs/{}/run-now", "/queue/jobs/{}/edit", "/queue/jobs/{}/duplicate"} <= {
        r.replace(str(dead), "{}") for r in routes
    }
    for path in routes:
        response = admin.client.post(path, data={"ids": [str(dead)]})
        assert response.status_code == 403, path
        assert "not change anything" in response.get_data(as_text=True), path
    assert admin.status(dead) == "dead"
    assert admin.status(delayed) == "pending"
    # The set-up's own pause, from Python, and nothing the refused requests asked for.
    assert audit_rows(admin.database_uri) == [("app", "pause", None, {"queue": "reports"})]


def test_authorize_write_may_answer_with_a_response(build: Callable[..., Admin]) -> None:
    admin = build(authorize_write=lambda: redirect("/login"))
    job_id = dead_job(admin)
    response = admin.client.post(f"/queue/jobs/{job_id}/retry", data={})
    assert response.status_code == 302
    assert response.headers["Location"] == "/login"
    assert admin.status(job_id) == "dead"


def test_a_writer_sees_the_buttons_and_acts(build: Callable[..., Admin]) -> None:
    admin = build(authorize_write=lambda: True)
    job_id = dead_job(admin)
    assert 'method="post"' in admin.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert admin.post(f"/jobs/{job_id}/retry").status_code == 303
    assert admin.status(job_id) == "pending"


# -- the command line --------------------------------------------------------------------------


@pytest.fixture
def flask_app(sq_app: Flask) -> Flask:
    return sq_app


def cli(flask_app: Flask, *args: str) -> Result:
    return flask_app.test_cli_runner().invoke(args=["queue", *args])


def job_row(flask_app: Flask, job_id: int) -> dict[str, Any]:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    return row(Admin(flask_app, flask_app.test_client(), "", uri), job_id)


def dead_cli_job(flask_app: Flask, message: str = "boom") -> int:
    with flask_app.app_context():
        job = sample_app.always_fails.using(max_attempts=1).enqueue(message)
    sample_app.queue.worker(app=flask_app).run(burst=True)
    return job.id


def assert_error(result: Result, fragment: str) -> None:
    assert result.exit_code != 0, result.output
    assert fragment in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_run_now(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    with flask_app.app_context():
        job = sample_app.add.using(delay=3600).enqueue(1, 2)
    result = cli(flask_app, "run-now", str(job.id))
    assert result.exit_code == 0, result.output
    assert "1 job(s) due now" in result.output
    sample_app.queue.worker(app=flask_app).run(burst=True)
    assert job_row(flask_app, job.id)["status"] == "completed"
    [(actor, action, audited, _)] = audit_rows(uri)
    assert actor.startswith("cli:")
    assert (action, audited) == ("run_now", job.id)


def test_cli_run_now_refuses_what_is_not_pending(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    with flask_app.app_context():
        delayed = sample_app.add.using(delay=3600).enqueue(1, 2)
    dead = dead_cli_job(flask_app)
    before = job_row(flask_app, delayed.id)
    assert_error(cli(flask_app, "run-now", str(delayed.id), str(dead)), f"{dead} is dead")
    assert job_row(flask_app, delayed.id) == before  # all or none
    assert_error(cli(flask_app, "run-now", "999999"), "999999 does not exist")
    assert audit_rows(uri) == []


def test_cli_retry_with_edits(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    job_id = dead_cli_job(flask_app, "old")
    result = cli(
        flask_app,
        "retry",
        str(job_id),
        "--kwargs",
        '{"message": "new"}',
        "--args",
        "[]",
        "--to-queue",
        "later",
        "--priority",
        "-2",
    )
    assert result.exit_code == 0, result.output
    after = job_row(flask_app, job_id)
    assert after["payload"] == {"args": [], "kwargs": {"message": "new"}}
    assert (after["status"], after["queue"], after["priority"]) == ("pending", "later", -2)
    [(actor, action, audited, detail)] = audit_rows(uri)
    assert actor.startswith("cli:")
    assert (action, audited) == ("edit_replay", job_id)
    assert detail["after"]["kwargs"] == {"message": "new"}


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--args", '["a", "b"]'], "does not take these arguments"),
        (["--args", '["a", "b"]'], "Nothing was replayed."),
        (["--kwargs", "[]"], "--kwargs must be a JSON object"),
        (["--args", "{"], "--args is not valid JSON"),
        (["--to-queue", "bad queue"], "not a valid queue name"),
    ],
)
def test_cli_retry_with_bad_edits_changes_nothing(
    flask_app: Flask, args: list[str], fragment: str
) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    job_id = dead_cli_job(flask_app)
    before = job_row(flask_app, job_id)
    assert_error(cli(flask_app, "retry", str(job_id), *args), fragment)
    assert job_row(flask_app, job_id) == before
    assert audit_rows(uri) == []


def test_cli_edits_go_with_one_id(flask_app: Flask) -> None:
    first, second = dead_cli_job(flask_app), dead_cli_job(flask_app)
    result = cli(flask_app, "retry", str(first), str(second), "--priority", "1")
    assert_error(result, "go with one job id")
    assert job_row(flask_app, first)["status"] == "dead"


def test_cli_duplicate_and_audit(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    source = dead_cli_job(flask_app, "again")
    result = cli(flask_app, "duplicate", str(source))
    assert result.exit_code == 0, result.output
    copy_id = int(re.search(r"Job (\d+) is a copy", result.output).group(1))  # type: ignore[union-attr]
    copy = job_row(flask_app, copy_id)
    assert (copy["status"], copy["attempts"], copy["payload"]) == (
        "pending",
        0,
        job_row(flask_app, source)["payload"],
    )
    listing = cli(flask_app, "audit", "--job", str(source))
    assert listing.exit_code == 0, listing.output
    assert "duplicate" in listing.output and f"new_job={copy_id}" in listing.output
    assert len(audit_rows(uri)) == 1
    assert_error(cli(flask_app, "duplicate", "999999"), "No job with id 999999")


def test_cli_duplicate_of_a_unique_job_whose_key_is_held_is_refused(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    with flask_app.app_context():
        source = sample_app.single.enqueue(8)
    result = cli(flask_app, "duplicate", str(source.id))
    assert_error(result, f"job {source.id} (pending) holds the copy's key; nothing enqueued")
    assert "is a copy" not in result.output
    assert query(uri, "SELECT count(*) FROM sqlqueue_jobs") == [(1,)]
    assert audit_rows(uri) == []


def test_cli_purge_audit_deletes_only_old_entries(flask_app: Flask) -> None:
    uri = flask_app.config["SQLQUEUE_DATABASE_URI"]
    job_id = dead_cli_job(flask_app)
    assert cli(flask_app, "retry", str(job_id)).exit_code == 0
    query(
        uri,
        "INSERT INTO sqlqueue_audit_log (at, actor, action, job_id, detail) "
        "VALUES (:at, 'old', 'retry', NULL, NULL)",
        at=datetime(2001, 1, 1),
    )
    result = cli(flask_app, "purge-audit", "--older-than", "30d")
    assert result.exit_code == 0, result.output
    assert "Purged 1 audit entry." in result.output
    # The recent retry stays, and the purge is itself written down, after it deleted.
    left = audit_rows(uri)
    assert [action for _, action, _, _ in left] == ["retry", "purge_audit"]
    assert left[1][3]["purged"] == 1
    assert_error(cli(flask_app, "purge-audit", "--older-than", "soon"), "not an age")


def test_the_audit_migration_downgrades_and_upgrades(admin: Admin) -> None:
    job_id = pending_job(admin)
    admin.post(f"/jobs/{job_id}/cancel")
    engine = admin.app.extensions["sqlqueue"].store.engine
    schema.downgrade(engine, "0011")
    assert "sqlqueue_audit_log" not in table_names(admin.database_uri)
    assert admin.status(job_id) == "cancelled"  # the jobs are left alone
    schema.upgrade(engine)
    assert "sqlqueue_audit_log" in table_names(admin.database_uri)
    assert audit_rows(admin.database_uri) == []


# -- every door writes the log -----------------------------------------------------------------

#: Admin POST routes whose every action is audited in tests/test_schedules.py (the
#: schedules of an app with periodic tasks; this one has none).
SCHEDULE_ROUTES = {
    "/queue/schedules/<path:name>/enable",
    "/queue/schedules/<path:name>/disable",
    "/queue/schedules/<path:name>/run",
}


def _admin_route_cases(admin: Admin) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Each job and queue POST route of the admin: (path, form, the audit action)."""
    dead, pending = dead_job(admin), pending_job(admin, delay=timedelta(hours=1))
    edited, deleted = dead_job(admin), dead_job(admin)
    bulk = pending_job(admin, delay=timedelta(hours=1))
    form = {"args": '["again"]', "kwargs": "{}", "queue": "default", "priority": "0"}
    return {
        "/queue/jobs/<int:job_id>/run-now": (f"/jobs/{pending}/run-now", {}, "run_now"),
        "/queue/jobs/<int:job_id>/duplicate": (f"/jobs/{dead}/duplicate", {}, "duplicate"),
        "/queue/jobs/<int:job_id>/edit": (f"/jobs/{edited}/edit", form, "edit_replay"),
        "/queue/jobs/<int:job_id>/retry": (f"/jobs/{dead}/retry", {}, "retry"),
        "/queue/jobs/<int:job_id>/cancel": (f"/jobs/{pending}/cancel", {}, "cancel"),
        "/queue/jobs/bulk": ("/jobs/bulk", {"action": "cancel", "ids": [bulk]}, "cancel"),
        "/queue/jobs/<int:job_id>/delete": (f"/jobs/{deleted}/delete", {}, "delete"),
        "/queue/jobs/retry-dead": ("/jobs/retry-dead", {}, "retry_dead"),
        "/queue/queues/<name>/pause": ("/queues/default/pause", {}, "pause"),
        "/queue/queues/<name>/resume": ("/queues/default/resume", {}, "resume"),
    }


def test_every_admin_post_route_writes_the_audit_log(admin: Admin) -> None:
    """A walk of the admin's POST routes: each acts and writes an entry naming its
    action and the actor; a route added without an entry here fails the walk."""
    cases = _admin_route_cases(admin)
    routes = {
        rule.rule
        for rule in admin.app.url_map.iter_rules()
        if rule.endpoint.startswith("sqlqueue.") and "POST" in (rule.methods or ())
    }
    assert routes == set(cases) | SCHEDULE_ROUTES
    dead_left = [dead_job(admin)]  # retry-dead needs one still dead when its turn comes
    assert dead_left
    for route, (path, form, action) in cases.items():
        before = len(audit_rows(admin.database_uri))
        response = admin.post(path, form)
        assert response.status_code in (200, 303), (route, response.get_data(as_text=True))
        added = audit_rows(admin.database_uri)[before:]
        assert added and {(a, act) for a, act, _, _ in added} == {(ACTOR, action)}, (route, added)


#: The ``flask queue`` commands that only read, and ``enqueue``, which adds a job as the
#: app's own enqueues do (not an operator's action on the queue: never audited).
UNAUDITED_COMMANDS = {"status", "list", "audit", "show", "periodic", "doctor", "work", "db"}
UNAUDITED_COMMANDS |= {"enqueue"}
#: Audited in tests/test_schedules.py (schedules) and tests/test_crash_budget.py (rescue).
AUDITED_ELSEWHERE = {"schedules", "rescue"}


def test_every_acting_command_writes_the_audit_log(
    flask_app: Flask, database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk of ``flask queue``: each command that changes jobs, queues or the log
    writes an entry naming its action and the command line's user."""
    monkeypatch.setenv("LOGNAME", "carol")  # getpass reads it first
    commands = set(queue_cli.commands)
    with flask_app.app_context():
        dead = sample_app.always_fails.using(max_attempts=1).enqueue("x").id
        done = sample_app.add.enqueue(1, 2).id
        pending = sample_app.add.using(delay=3600).enqueue(1, 2).id
        run_burst(sample_app.queue.worker())
    query(
        database_uri,
        "UPDATE sqlqueue_jobs SET updated_at = :t WHERE id = :i",
        t=datetime(2001, 1, 1),
        i=done,
    )
    cases: dict[str, tuple[list[str], str]] = {
        "run-now": (["run-now", str(pending)], "run_now"),
        "duplicate": (["duplicate", str(dead)], "duplicate"),
        "retry": (["retry", str(dead)], "retry"),
        "cancel": (["cancel", str(pending)], "cancel"),
        "pause": (["pause", "default"], "pause"),
        "resume": (["resume", "default"], "resume"),
        "purge": (["purge", "--status", "completed", "--older-than", "1d"], "purge"),
        "purge-audit": (["purge-audit", "--older-than", "1d"], "purge_audit"),
    }
    assert commands == set(cases) | UNAUDITED_COMMANDS | AUDITED_ELSEWHERE
    for name, (args, action) in cases.items():
        if name == "purge-audit":  # the entries so far, made old enough to purge
            query(database_uri, "UPDATE sqlqueue_audit_log SET at = :t", t=datetime(2001, 1, 1))
        before = len(audit_rows(database_uri))
        result = cli(flask_app, *args)
        assert result.exit_code == 0, (name, result.output)
        added = audit_rows(database_uri)[before:] if name != "purge-audit" else None
        if added is None:  # the old entries are gone; the one left says so
            added = audit_rows(database_uri)
            assert added[0][3]["purged"] >= len(cases) - 1, added
        assert added and {(a, act) for a, act, _, _ in added} == {("cli:carol", action)}, (
            name,
            added,
        )

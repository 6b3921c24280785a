"""Versioned tasks and upcasters (docs/versions.md): a job written for an earlier
signature of its task still runs after the signature changed, on every backend.

Two apps share the test's database, as two deploys would: ``old`` has version 1 of each
task, ``new`` the later versions with their upcasters (tests/versions_app.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.processes import AppLoader
from tests import versions_app as apps
from tests.conftest import query
from tests.stores import burst
from tests.workers import run_burst


@pytest.fixture
def deploys(make_app: Any, database_uri: str) -> Iterator[tuple[Flask, Flask]]:
    make_app()  # the schema
    config = {"SQLQUEUE_DATABASE_URI": database_uri}
    old, new = apps.create_old(config), apps.create_new(config)
    yield old, new
    for app in (old, new):
        app.extensions["sqlqueue"].store.engine.dispose()


def payload(database_uri: str, job_id: int) -> Any:
    ((text,),) = query(database_uri, "SELECT payload FROM sqlqueue_jobs WHERE id = :id", id=job_id)
    return json.loads(text)


def job_count(database_uri: str) -> int:
    ((count,),) = query(database_uri, "SELECT COUNT(*) FROM sqlqueue_jobs")
    return int(count)


def test_a_job_of_version_1_runs_through_each_upcaster_in_turn(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with old.app_context():
        positional = apps.ship_v1.enqueue(7, True)
        keyword = apps.ship_v1.enqueue(8, express=False)
    assert payload(database_uri, positional.id) == {"args": [7, True], "kwargs": {}}
    burst(new, timeout=180)
    for job, order, speed in ((positional, 7, "fast"), (keyword, 8, "normal")):
        job.refresh()
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1), job.last_error
        # The upcast "when" was decoded by the task's annotation, like any stored date.
        assert job.result["order"] == {"id": order}
        assert (job.result["speed"], job.result["when"]) == (speed, "datetime.date(2030, 1, 2)")
        assert job.version == 1
    # The row is never rewritten: a replay upcasts again, from what was stored.
    assert payload(database_uri, positional.id) == {"args": [7, True], "kwargs": {}}


def test_new_jobs_store_their_version_and_unversioned_payloads_are_unchanged(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with new.app_context():
        job = apps.ship.enqueue({"id": 1}, "fast")
        assert job.version == 3
        assert apps.new.get_job(job.id).version == 3
    assert payload(database_uri, job.id) == {
        "args": [{"id": 1}, "fast"],
        "kwargs": {},
        "v": 3,
    }
    with old.app_context():
        plain = apps.ship_v1.enqueue(1)
    assert "v" not in payload(database_uri, plain.id)


def test_a_job_newer_than_the_worker_waits_for_a_worker_that_has_its_version(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with new.app_context():
        job = apps.ship.enqueue({"id": 5}, "normal")
    before = job.run_at
    burst(old, timeout=180)  # it claims the job, and hands it back unrun
    job.refresh()
    # No attempt spent, no failure recorded: it waits, snoozed, for a newer worker.
    assert (job.status, job.attempts, job.snoozes) == (JobStatus.PENDING, 0, 1)
    assert job.last_error is None
    assert (job.run_at - before).total_seconds() >= 29
    query(database_uri, "UPDATE sqlqueue_jobs SET run_at = created_at WHERE id = :id", id=job.id)
    burst(new, timeout=180)
    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1), job.last_error
    assert job.result["order"] == {"id": 5}


def test_an_upcaster_that_fails_kills_the_job_with_its_error_and_shows_it_before_a_replay(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with old.app_context():
        job = apps.bill_v1.enqueue(3)
    burst(new, timeout=180)
    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.DEAD, 1)
    assert job.last_error == (
        "UpcastError: task 'orders.bill': upcast[1] raised KeyError: 'customer'"
    )

    shown = new.test_cli_runner().invoke(args=["queue", "show", str(job.id)])
    assert shown.exit_code == 0, shown.output
    assert re.search(r"^version +1 \(the task here is version 2\)$", shown.output, re.M)
    assert "cannot run as version 2: task 'orders.bill': upcast[1] raised KeyError" in shown.output


def test_show_and_the_admin_say_what_a_replay_will_run(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with old.app_context():
        job = apps.ship_v1.enqueue(9, True)
    shown = new.test_cli_runner().invoke(args=["queue", "show", str(job.id)])
    assert shown.exit_code == 0, shown.output
    assert "runs as version 3, upcast from version 1, with" in shown.output
    after = shown.output.split("upcast from version 1, with", 1)[1]
    assert '"id": 9' in after
    assert '"speed": "fast"' in after
    assert '"when": "2030-01-02"' in after

    new.register_blueprint(apps.new.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    page = new.test_client().get(f"/q/jobs/{job.id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert 'id="sqlqueue-version"' in html
    assert "Runs as version 3, upcast from version 1, with" in html
    assert (
        html.count("&#34;speed&#34;: &#34;fast&#34;")
        + html.count("&quot;speed&quot;: &quot;fast&quot;")
        == 1
    )

    # A job of the task's own version shows no upcast.
    with new.app_context():
        current = apps.ship.enqueue({"id": 1}, "fast")
    shown = new.test_cli_runner().invoke(args=["queue", "show", str(current.id)])
    assert "upcast from" not in shown.output
    assert re.search(r"^version +3 \(the task here is version 3\)$", shown.output, re.M)


def test_an_isolated_attempt_gets_the_upcast_arguments_in_its_child(
    deploys: tuple[Flask, Flask], database_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAMPLE_DATABASE_URI", database_uri)  # for the children's app
    old, new = deploys
    with old.app_context():
        job = apps.refund_v1.enqueue(4, express=True)
    worker = apps.new.worker(
        WorkerOptions(grace=1.0), new, loader=AppLoader("tests.versions_app:create_new")
    )
    run_burst(worker, timeout=180)
    job.refresh()
    assert job.status is JobStatus.COMPLETED, job.last_error
    assert (job.result["order_id"], job.result["speed"]) == (4, "fast")
    assert job.result["pid"] != os.getpid()


def test_an_edited_version_is_a_malformed_payload(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    _old, new = deploys
    with new.app_context():
        job = apps.ship.enqueue({"id": 1}, "fast")
    query(
        database_uri,
        "UPDATE sqlqueue_jobs SET payload = :p WHERE id = :id",
        p=json.dumps({"args": [{"id": 1}], "kwargs": {"speed": "fast"}, "v": "three"}),
        id=job.id,
    )
    burst(new, timeout=180)
    job.refresh()
    assert (job.status, job.attempts) == (JobStatus.DEAD, 1)
    assert job.last_error == "MalformedPayload: payload version 'three' is not a positive integer"


def test_by_name_a_producer_says_the_version_it_writes(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    old, new = deploys
    with new.app_context():
        with pytest.raises(ValueError, match="is version 3 here, and the call says version 1"):
            apps.new.enqueue("orders.ship", args=[{"id": 1}, "fast"], version=1)
        with pytest.raises(ValueError, match="version must be a positive int"):
            apps.new.enqueue("elsewhere.task", unregistered=True, version=0)
        assert job_count(database_uri) == 0
        same = apps.new.enqueue("orders.ship", args=[{"id": 1}, "fast"], version=3)
        other = apps.new.enqueue("elsewhere.task", args=[1], unregistered=True, version=2)
    assert payload(database_uri, same.id)["v"] == 3
    assert payload(database_uri, other.id) == {"args": [1], "kwargs": {}, "v": 2}
    # An unregistered producer of version 1 arguments (the old app's, by name) upcasts.
    with old.app_context():
        by_name = apps.old.enqueue("orders.ship", args=[2, True])
    burst(new, timeout=180)
    by_name.refresh()
    assert by_name.status is JobStatus.COMPLETED, by_name.last_error
    assert by_name.result["speed"] == "fast"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"version": 0}, "version must be a positive int"),
        ({"version": True}, "version must be a positive int"),
        ({"version": 2, "upcast": [lambda a, k: (a, k)]}, "upcast must be a dict"),
        ({"version": 2, "upcast": {2: apps.v1_to_v2}}, "upcast keys are the versions before it"),
        ({"version": 2, "upcast": {0: apps.v1_to_v2}}, "upcast keys are the versions before it"),
        ({"version": 2, "upcast": {1: "v1_to_v2"}}, r"upcast\[1\] must be a function"),
        ({"upcast": {1: apps.v1_to_v2}}, "upcast keys are the versions before it"),
    ],
)
def test_a_bad_declaration_is_refused_with_the_fix(options: dict[str, Any], message: str) -> None:
    queue = SQLQueue()
    with pytest.raises(ConfigurationError, match=message):

        @queue.task(name="t", **options)
        def t() -> None: ...

    assert "t" not in queue.registry


def test_an_upcaster_must_return_plain_json_args_and_kwargs() -> None:
    queue = SQLQueue()

    @queue.task(name="t", version=3, upcast={1: lambda a, k: (a, k, 1), 2: lambda a, k: ((), k)})
    def t() -> None: ...

    from flask_sqlqueue.core.features.versions import UpcastError

    with pytest.raises(UpcastError, match=r"upcast\[1\] must return \(args: list, kwargs: dict\)"):
        t.upcast(1, [], {})
    with pytest.raises(UpcastError, match=r"upcast\[2\] must return"):
        t.upcast(2, [], {})

    @queue.task(name="u", version=2, upcast={1: lambda a, k: ([float("nan")], k)})
    def u() -> None: ...

    with pytest.raises(UpcastError, match=r"upcast\[1\] returned args\[0\] = nan"):
        u.upcast(1, [], {})
    with pytest.raises(UpcastError, match="no upcaster turns version 1"):
        SQLQueue().task(name="v", version=2)(lambda: None).upcast(1, [], {})


def test_a_copy_or_an_edit_of_an_old_job_is_written_as_the_tasks_version(
    deploys: tuple[Flask, Flask], database_uri: str
) -> None:
    from flask_sqlqueue.core import operations

    old, new = deploys
    store = new.extensions["sqlqueue"].store
    with old.app_context():
        job = apps.ship_v1.enqueue(7, True)
    operations.cancel(store, [job.id])
    # A copy: the upcast arguments, checked against version 3's signature and stored as it.
    copy = operations.duplicate(store, apps.new.registry, job.id)
    assert payload(database_uri, copy.id) == {
        "args": [{"id": 7}],
        "kwargs": {"speed": "fast", "when": "2030-01-02"},
        "v": 3,
    }
    # An edit keeps what it does not change as the task's version takes it.
    edited = operations.replay_edited(store, apps.new.registry, job.id, kwargs={"speed": "slow"})
    assert edited.status is JobStatus.PENDING
    assert payload(database_uri, job.id) == {
        "args": [{"id": 7}],
        "kwargs": {"speed": "slow"},
        "v": 3,
    }
    # The admin's edit form starts from the upcast arguments, not the stored ones.
    with old.app_context():
        other = apps.ship_v1.enqueue(8, False)
    operations.cancel(store, [other.id])
    new.config["SECRET_KEY"] = "test secret"
    new.register_blueprint(apps.new.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    html = new.test_client().get(f"/q/jobs/{other.id}").get_data(as_text=True)
    form = html.split('id="sqlqueue-edit"', 1)[1]
    assert "upcast to the task's version 3" in form
    assert "&#34;speed&#34;: &#34;normal&#34;" in form
    burst(new, timeout=180)
    for done in (copy, job):
        done.refresh()
        assert done.status is JobStatus.COMPLETED, done.last_error

"""Big payloads kept outside the row (docs/payloads.md), on every backend, with real
workers: a payload over ``SQLQUEUE_INLINE_PAYLOAD_LIMIT`` is kept in
``sqlqueue_payloads``, its row holds the marker, every reader gets the real arguments,
and the side row goes with its job."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import date
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import Call
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Unique
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import operations
from flask_sqlqueue.core.features import retention
from flask_sqlqueue.core.payload import OUTSIDE
from flask_sqlqueue.core.payload import decode_call
from flask_sqlqueue.core.store import Store
from flask_sqlqueue.exceptions import PayloadTooLarge
from tests.conftest import install_schema
from tests.conftest import query
from tests.sample_app import queue_app
from tests.stores import burst
from tests.stores import store_of
from tests.workers import run_burst
from tests.workflow_app import run_doc_example

queue = SQLQueue()

#: The test app's limit: small, so a payload of a few hundred bytes is big.
LIMIT = 200
#: Arguments well over the limit, with characters of 2, 3 and 4 bytes in UTF-8.
BIG = "é€😀" * 100 + "x" * 100
SMALL = "small"


@queue.task(name="big.echo")
def echo(text: str, *, n: int = 0) -> dict[str, Any]:
    return {"len": len(text), "head": text[:5], "n": n}


@queue.task(name="big.typed")
def typed(when: date, amount: Decimal, text: str) -> str:
    return f"{when!r} {amount!r} {len(text)}"


@queue.task(name="big.fails", max_attempts=1)
def fails(text: str) -> None:
    raise RuntimeError(f"ran with {len(text)} characters")


@pytest.fixture
def app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    made = queue_app(
        __name__,
        queue,
        {"SQLQUEUE_DATABASE_URI": database_uri, "SQLQUEUE_INLINE_PAYLOAD_LIMIT": LIMIT},
    )
    made.instance_path = str(tmp_path / "instance")
    made.config["SECRET_KEY"] = "test secret"
    if database_uri.startswith("sqlite"):
        queue.upgrade_database(app=made)
    made.register_blueprint(queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue")
    yield made
    store_of(made).engine.dispose()


def row_payload(database_uri: str, job_id: int) -> str:
    """What the job's row holds, read with raw SQL."""
    ((payload,),) = query(database_uri, "SELECT payload FROM sqlqueue_jobs WHERE id = :i", i=job_id)
    return str(payload)


def side_rows(database_uri: str) -> dict[int, str]:
    """``sqlqueue_payloads``, read with raw SQL."""
    found = query(database_uri, "SELECT job_id, payload FROM sqlqueue_payloads")
    return {int(job_id): str(payload) for job_id, payload in found}


def cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["queue", *args])


def test_a_big_payload_is_kept_outside_its_row_and_runs(app: Flask, database_uri: str) -> None:
    with app.app_context():
        big = echo.enqueue(BIG, n=1)
        small = echo.enqueue(SMALL, n=2)
        assert big.args == [BIG] and big.kwargs == {"n": 1}
    assert row_payload(database_uri, big.id) == OUTSIDE
    assert decode_call(row_payload(database_uri, small.id))[0] == [SMALL]
    side = side_rows(database_uri)
    # Below the limit nothing changes: no side row.
    assert set(side) == {big.id}
    assert decode_call(side[big.id]) == ([BIG], {"n": 1}, 1)
    with app.app_context():
        read = queue.get_job(big.id)
        assert read is not None and read.args == [BIG] and read.payload_error is None
    burst(app)
    with app.app_context():
        done = queue.get_job(big.id)
        assert done is not None and done.status == "completed", done
        assert done.result == {"len": len(BIG), "head": BIG[:5], "n": 1}
        assert queue.get_job(small.id).result == {"len": 5, "head": SMALL, "n": 2}  # type: ignore[union-attr]
        assert big.refresh().args == [BIG]


def test_the_limit_is_in_bytes(app: Flask, database_uri: str) -> None:
    """A payload of fewer characters than the limit but more bytes is big."""
    with app.app_context():
        text = "€" * 60  # 60 characters, 180 bytes: with the JSON around it, over 200
        job = echo.enqueue(text)
        fits = echo.enqueue("x" * 60)
    assert row_payload(database_uri, job.id) == OUTSIDE
    assert set(side_rows(database_uri)) == {job.id}
    assert row_payload(database_uri, fits.id) != OUTSIDE


def test_typed_arguments_of_a_big_payload(app: Flask, database_uri: str) -> None:
    with app.app_context():
        job = typed.enqueue(date(2026, 12, 2), Decimal("10.50"), BIG)
    assert row_payload(database_uri, job.id) == OUTSIDE
    burst(app)
    with app.app_context():
        done = queue.get_job(job.id)
        assert done is not None
        assert done.result == f"{date(2026, 12, 2)!r} {Decimal('10.50')!r} {len(BIG)}"
        assert done.args == ["2026-12-02", "10.50", BIG]


def test_enqueue_many_keeps_each_big_payload_outside(app: Flask, database_uri: str) -> None:
    with app.app_context():
        held = echo.using(idempotency_key="held").enqueue(BIG)
        calls = [Call([BIG + str(i)]) if i % 2 else Call([f"s{i}"]) for i in range(6)]
        calls.append(Call([BIG], idempotency_key="held"))
        made = echo.enqueue_many(calls)
        named = queue.enqueue_many("big.echo", [([BIG], {"n": i}) for i in range(2)])
    assert made[-1].id == held.id and made[-1].args == [BIG]
    big_ids = {made[i].id for i in (1, 3, 5)} | {held.id} | {job.id for job in named}
    side = side_rows(database_uri)
    assert set(side) == big_ids
    for i, job in enumerate(made[:-1]):
        assert job.args == calls[i].args
        assert (row_payload(database_uri, job.id) == OUTSIDE) == (job.id in big_ids)
    burst(app)
    with app.app_context():
        for i, job in enumerate(made[:-1]):
            done = queue.get_job(job.id)
            assert done is not None and done.result["len"] == len(calls[i].args[0]), done
        assert [queue.get_job(j.id).result["n"] for j in named] == [0, 1]  # type: ignore[union-attr]


def test_show_and_the_job_page_give_the_real_arguments(app: Flask) -> None:
    with app.app_context():
        job = echo.enqueue(BIG, n=3)
    shown = cli(app, "show", str(job.id))
    assert shown.exit_code == 0, shown.output
    assert json.dumps(BIG, ensure_ascii=False) in shown.output
    assert "malformed" not in shown.output and "sqlqueue_payloads" not in shown.output
    page = app.test_client().get(f"/queue/jobs/{job.id}").get_data(as_text=True)
    args = page.split('id="sqlqueue-args">')[1].split("</pre>")[0]
    assert BIG in args
    assert "malformed" not in page


def test_replay_edit_and_duplicate_of_a_big_job(app: Flask, database_uri: str) -> None:
    store = store_of(app)
    with app.app_context():
        job = fails.enqueue(BIG)
    burst(app)
    with app.app_context():
        dead = queue.get_job(job.id)
        assert dead is not None and dead.status == "dead"
        assert f"ran with {len(BIG)} characters" in (dead.last_error or "")
        copy = operations.duplicate(store, queue.registry, job.id)
        assert copy.args == [BIG] and copy.id != job.id
    assert set(side_rows(database_uri)) == {job.id, copy.id}
    # Replayed as it is: its payload stays outside.
    replayed = operations.replay_edited(store, queue.registry, job.id)
    assert replayed.args == [BIG] and row_payload(database_uri, job.id) == OUTSIDE
    burst(app)
    with app.app_context():
        for job_id in (job.id, copy.id):
            again = queue.get_job(job_id)
            assert again is not None and again.status == "dead"
            assert f"ran with {len(BIG)} characters" in (again.last_error or ""), again
    # Edited to small arguments: back in its row, its side row gone.
    edited = operations.replay_edited(store, queue.registry, job.id, args=["tiny"])
    assert edited.args == ["tiny"] and row_payload(database_uri, job.id) != OUTSIDE
    assert set(side_rows(database_uri)) == {copy.id}
    burst(app)
    # Edited to big ones again: outside again.
    bigger = BIG * 2
    edited = operations.replay_edited(store, queue.registry, job.id, args=[bigger])
    assert edited.args == [bigger] and row_payload(database_uri, job.id) == OUTSIDE
    assert decode_call(side_rows(database_uri)[job.id])[0] == [bigger]
    burst(app)
    with app.app_context():
        last = queue.get_job(job.id)
        assert last is not None and f"ran with {len(bigger)} characters" in (last.last_error or "")


def test_replace_moves_the_payload_between_row_and_side_table(
    app: Flask, database_uri: str
) -> None:
    by_key = Unique(key="doc", on_conflict="replace")
    with app.app_context():
        first = echo.using(unique=by_key, delay=3600).enqueue(SMALL)
        assert side_rows(database_uri) == {}
        bigger = echo.using(unique=by_key, delay=3600).enqueue(BIG, n=1)
        assert bigger.id == first.id and bigger.args == [BIG]
        assert row_payload(database_uri, first.id) == OUTSIDE
        assert set(side_rows(database_uri)) == {first.id}
        other = echo.using(unique=by_key, delay=3600).enqueue(BIG + "!", n=2)
        assert other.id == first.id and other.kwargs == {"n": 2}
        assert decode_call(side_rows(database_uri)[first.id])[0] == [BIG + "!"]
        # The holder read by a skip holds the real payload too.
        skipped = echo.using(unique=Unique(key="doc"), delay=3600).enqueue(SMALL)
        assert skipped.id == first.id and skipped.args == [BIG + "!"]
        back = echo.using(unique=by_key).enqueue(SMALL, n=3)
        assert back.args == [SMALL] and row_payload(database_uri, first.id) != OUTSIDE
    assert side_rows(database_uri) == {}
    burst(app)
    with app.app_context():
        done = queue.get_job(first.id)
        assert done is not None and done.result == {"len": 5, "head": SMALL, "n": 3}


def test_purge_delete_and_retention_delete_the_side_rows(app: Flask, database_uri: str) -> None:
    store: Store = store_of(app)
    with app.app_context():
        purged = echo.enqueue(BIG)
        pruned = fails.enqueue(BIG)
        deleted = echo.using(delay=3600).enqueue(BIG)
        kept = echo.using(delay=3600).enqueue(BIG)
    assert set(side_rows(database_uri)) == {purged.id, pruned.id, deleted.id, kept.id}
    burst(app)  # purged completes, pruned goes dead
    later = store.now() + timedelta(days=1)
    with store.write() as conn:
        assert retention.prune_jobs_batch(conn, "dead", later, 10) == 1
    assert set(side_rows(database_uri)) == {purged.id, deleted.id, kept.id}
    with store.write() as conn:
        assert actions.purge(conn, "completed", later) == 1
    assert set(side_rows(database_uri)) == {deleted.id, kept.id}
    assert operations.delete(store, [deleted.id]) == 1
    assert set(side_rows(database_uri)) == {kept.id}
    with app.app_context():
        assert [queue.get_job(i) for i in (purged.id, pruned.id, deleted.id)] == [None] * 3
        assert queue.get_job(kept.id).args == [BIG]  # type: ignore[union-attr]


def test_a_marker_without_its_side_row_is_reported_not_run_empty(
    app: Flask, database_uri: str
) -> None:
    """A side row deleted by hand: the job is malformed, never run without arguments."""
    with app.app_context():
        job = echo.enqueue(BIG)
    query(database_uri, "DELETE FROM sqlqueue_payloads")
    with app.app_context():
        read = queue.get_job(job.id)
        assert read is not None and read.args == []
        assert read.payload_error is not None and "sqlqueue_payloads" in read.payload_error
    burst(app)
    with app.app_context():
        dead = queue.get_job(job.id)
        assert dead is not None and dead.status == "dead" and dead.result is None
        assert re.search("MalformedPayload: .*sqlqueue_payloads", dead.last_error or ""), dead


def test_the_payload_size_limit_still_applies(app: Flask, database_uri: str) -> None:
    """The limit on what the database stores applies to the payload itself."""
    state = app.extensions["sqlqueue"]
    state.ensure_schema()  # the server's own limit is read once; lower it after that
    state.store.value_limit = 1000
    with app.app_context(), pytest.raises(PayloadTooLarge, match="over the 1,000 bytes"):
        echo.enqueue("y" * 2000)
    assert query(database_uri, "SELECT COUNT(*) FROM sqlqueue_jobs") == [(0,)]
    assert side_rows(database_uri) == {}


def test_the_example_of_the_docs_runs(tmp_path: Path) -> None:
    assert run_doc_example(tmp_path, "payloads_demo.py", "payloads.md") == [
        "True",
        "100",
        "100 1",
    ]


def test_a_periodic_task_with_big_arguments(database_uri: str, tmp_path: Path) -> None:
    """A periodic task's run is an enqueue like any other: its big arguments go outside."""
    own = SQLQueue()

    @own.periodic("0 0 1 1 *", name="big.yearly", args=[BIG])
    def yearly(text: str) -> int:
        return len(text)

    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    made = queue_app(
        __name__,
        own,
        {"SQLQUEUE_DATABASE_URI": database_uri, "SQLQUEUE_INLINE_PAYLOAD_LIMIT": LIMIT},
    )
    made.instance_path = str(tmp_path / "instance")
    if database_uri.startswith("sqlite"):
        own.upgrade_database(app=made)
    try:
        with made.app_context():
            job = own.run_schedule("big.yearly")
            assert job.args == [BIG]
        assert row_payload(database_uri, job.id) == OUTSIDE
        assert set(side_rows(database_uri)) == {job.id}
        run_burst(own.worker(WorkerOptions(grace=1.0), made))
        with made.app_context():
            assert job.refresh().result == len(BIG)
    finally:
        store_of(made).engine.dispose()

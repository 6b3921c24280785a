"""Scoped uniqueness and debounce (``unique=Unique(...)``), on every backend.

Jobs are run by the real claim (``drain``, or ``claim_job`` to hold one running), and
races by real threads on connections of their own: the unique index must refuse the
second row whatever the timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import Job
from flask_sqlqueue import JobStatus
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Unique
from flask_sqlqueue.core.claim import claim_job
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.store import Store
from flask_sqlqueue.testing import drain
from tests.conftest import install_schema
from tests.sample_app import queue_app
from tests.waiting import WAIT

queue = SQLQueue()


@queue.task(name="unique.index")
def index(doc_id: int, lang: str = "en") -> int:
    return doc_id


@queue.task(name="unique.digest", unique=Unique(key="daily", scope="active"))
def digest(day: str) -> str:
    return day


@pytest.fixture
def app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    made = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri})
    made.instance_path = str(tmp_path / "instance")
    if database_uri.startswith("sqlite"):
        queue.upgrade_database(app=made)
    with made.app_context():
        yield made
    store(made).engine.dispose()


def store(app: Flask) -> Store:
    found: Store = app.extensions["sqlqueue"].store
    return found


def rows(app: Flask) -> list[Any]:
    with store(app).read() as conn:
        return list(conn.execute(sa.select(jobs).order_by(jobs.c.id)))


def hold_running(app: Flask, job: Job) -> None:
    """Claim ``job`` as a worker does, and leave it running."""
    st = store(app)
    now = st.now()
    claimed = st.run_write(
        lambda conn: claim_job(conn, st.ops, job.id, worker_id="test", token="t" * 32, now=now)
    )
    assert claimed is not None


SKIP = Unique()
REPLACE = Unique(on_conflict="replace")


# -- skip and replace ------------------------------------------------------------------------


def test_skip_returns_the_pending_job_and_writes_nothing(app: Flask) -> None:
    first = index.using(unique=SKIP).enqueue(1)
    again = index.using(unique=SKIP).enqueue(doc_id=1)  # the same call, spelled otherwise
    assert again.id == first.id and again.args == [1] and again.kwargs == {}
    other = index.using(unique=SKIP).enqueue(2)
    assert other.id != first.id
    assert len(rows(app)) == 2
    assert first.unique_key is not None and first.unique_key.startswith("unique.index:args:")
    # By name, as producers that do not import the task enqueue.
    assert queue.enqueue("unique.index", [1], unique=SKIP).id == first.id
    # Without unique=, nothing is unique: a third job for doc 1.
    assert index.enqueue(1).id not in (first.id, other.id)


def test_replace_gives_a_pending_job_the_new_arguments(app: Flask) -> None:
    by_key = Unique(key="doc-7", on_conflict="replace")
    first = index.using(unique=by_key).enqueue(7, lang="en")
    second = index.using(unique=by_key).enqueue(7, lang="fr")
    assert second.id == first.id
    assert second.kwargs == {"lang": "fr"}
    assert first.refresh().kwargs == {"lang": "fr"}
    assert len(rows(app)) == 1
    [done] = drain()
    assert done.id == first.id and done.result == 7


def test_debounce_burst_makes_one_job_due_after_the_last_call(app: Flask) -> None:
    made = [index.using(unique=REPLACE, delay=30).enqueue(42) for _ in range(10)]
    assert len({job.id for job in made}) == 1
    last_call = store(app).now()
    job = made[0].refresh()
    # Due 30 s after the last call, not the first: each call pushed it.
    assert job.run_at >= made[-1].updated_at + timedelta(seconds=29)
    assert job.run_at > last_call + timedelta(seconds=25)
    assert len(rows(app)) == 1
    assert drain() == []  # not due yet


def test_a_task_default_applies_and_using_overrides_it(app: Flask) -> None:
    first = digest.enqueue("mon")
    assert digest.enqueue("tue").id == first.id  # keyed: whatever the arguments
    assert digest.using(unique=Unique(key="weekly")).enqueue("tue").id != first.id
    assert queue.enqueue("unique.digest", ["wed"]).id == first.id


# -- scopes ------------------------------------------------------------------------------------


def test_after_completion_a_new_job_is_enqueued(app: Flask) -> None:
    first = index.using(unique=SKIP).enqueue(3)
    [done] = drain()
    assert done.id == first.id and done.status == JobStatus.COMPLETED
    second = index.using(unique=SKIP).enqueue(3)
    assert second.id != first.id and second.status == JobStatus.PENDING
    # The finished job gave its key up to the new one.
    assert first.refresh().unique_key is None
    assert second.unique_key is not None
    assert index.using(unique=SKIP).enqueue(3).id == second.id


def test_active_scope_counts_a_running_job_and_pending_scope_does_not(app: Flask) -> None:
    active = Unique(scope="active")
    first = index.using(unique=active).enqueue(4)
    hold_running(app, first)
    assert index.using(unique=active).enqueue(4).id == first.id
    # Under "pending" scope the running job no longer counts: a new job takes the key.
    second = index.using(unique=SKIP).enqueue(4)
    assert second.id != first.id
    assert first.refresh().status == JobStatus.RUNNING and first.unique_key is None
    assert len(rows(app)) == 2


def test_replace_never_changes_a_running_job(app: Flask) -> None:
    by_key = Unique(key="doc-5", scope="active", on_conflict="replace")
    first = index.using(unique=by_key).enqueue(5, lang="en")
    hold_running(app, first)
    # Active scope: the running job holds the key, and is returned unchanged.
    same = index.using(unique=by_key).enqueue(5, lang="fr")
    assert same.id == first.id and same.kwargs == {"lang": "en"}
    assert same.status == JobStatus.RUNNING
    assert len(rows(app)) == 1
    # Pending scope: it does not hold it; a new job runs with the new arguments.
    pending = Unique(key="doc-5", on_conflict="replace")
    new = index.using(unique=pending).enqueue(5, lang="de")
    assert new.id != first.id and new.kwargs == {"lang": "de"}
    assert first.refresh().kwargs == {"lang": "en"}


def test_period_refuses_within_it_and_accepts_after(app: Flask) -> None:
    hourly = Unique(key="report", scope="any", period=3600)
    first = index.using(unique=hourly).enqueue(6)
    [done] = drain()
    assert done.id == first.id
    # Finished, but within the hour: still the one job.
    assert index.using(unique=hourly).enqueue(6).id == first.id
    # Move the job's enqueue time two hours back (no clock to wait for).
    st = store(app)
    with st.write() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == first.id)
            .values(created_at=st.now() - timedelta(hours=2))
        )
    second = index.using(unique=hourly).enqueue(6)
    assert second.id != first.id
    assert index.using(unique=hourly).enqueue(6).id == second.id
    assert len(rows(app)) == 2


def test_a_pending_job_past_its_period_gives_the_key_up(app: Flask) -> None:
    short = Unique(period=timedelta(minutes=5))
    first = index.using(unique=short).enqueue(8)
    assert index.using(unique=short).enqueue(8).id == first.id
    st = store(app)
    with st.write() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == first.id)
            .values(created_at=st.now() - timedelta(minutes=6))
        )
    assert index.using(unique=short).enqueue(8).id != first.id
    assert [row.status for row in rows(app)] == ["pending", "pending"]


def test_a_waiting_job_holds_its_key_and_keeps_its_dependencies(app: Flask) -> None:
    parent = index.enqueue(1)
    first = index.using(unique=SKIP, depends_on=[parent]).enqueue(15)
    assert first.status == JobStatus.WAITING
    again = index.using(unique=REPLACE, depends_on=[parent]).enqueue(15)
    assert again.id == first.id and again.status == JobStatus.WAITING
    assert len(rows(app)) == 2
    ran = drain()
    assert [job.id for job in ran] == [parent.id, first.id]


# -- races ---------------------------------------------------------------------------------------


def _race(app: Flask, unique: Unique, producers: int = 8, *, session: bool = False) -> list[int]:
    """``producers`` threads enqueue the same unique job at once, each in the queue's own
    transaction or, with ``session``, in one of its own; their job ids."""
    barrier = threading.Barrier(producers)
    ids: list[int] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with app.app_context():
                barrier.wait(WAIT)
                if not session:
                    ids.append(index.using(unique=unique).enqueue(9, lang=f"l{n}").id)
                    return
                # store.write(): BEGIN IMMEDIATE on SQLite, as a caller's writing
                # transaction there must be (a deferred one cannot wait to write).
                with store(app).write() as conn:
                    bound = index.using(unique=unique, session=conn)
                    ids.append(bound.enqueue(9, lang=f"l{n}").id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not errors, errors
    return ids


@pytest.mark.parametrize("session", [False, True], ids=["own", "session"])
@pytest.mark.parametrize("on_conflict", ["skip", "replace"])
def test_racing_producers_make_one_job(app: Flask, on_conflict: str, session: bool) -> None:
    unique = Unique(key="race", on_conflict=on_conflict)  # type: ignore[arg-type]
    ids = _race(app, unique, session=session)
    assert len(ids) == 8 and len(set(ids)) == 1
    assert len(rows(app)) == 1


@pytest.mark.parametrize("session", [False, True], ids=["own", "session"])
@pytest.mark.parametrize("on_conflict", ["skip", "replace"])
def test_racing_producers_after_the_holder_finished_make_one_new_job(
    app: Flask, on_conflict: str, session: bool
) -> None:
    unique = Unique(key="race", on_conflict=on_conflict)  # type: ignore[arg-type]
    first = index.using(unique=unique).enqueue(9)
    drain()
    ids = _race(app, unique, session=session)
    assert len(ids) == 8 and len(set(ids)) == 1 and ids[0] != first.id
    assert len(rows(app)) == 2
    assert [row.unique_key is not None for row in rows(app)] == [False, True]


# -- transactions, idempotency keys, bad input -----------------------------------------------------


def test_transactional_enqueue(app: Flask) -> None:
    st = store(app)
    with st.engine.connect() as conn:
        with conn.begin() as tx:
            first = index.using(unique=SKIP, session=conn).enqueue(10)
            assert index.using(unique=SKIP, session=conn).enqueue(10).id == first.id
            tx.rollback()
        assert rows(app) == []
        with conn.begin():
            kept = index.using(unique=REPLACE, session=conn).enqueue(10)
            again = index.using(unique=REPLACE, session=conn, delay=60).enqueue(10)
            assert again.id == kept.id
    assert [row.id for row in rows(app)] == [kept.id]
    assert index.using(unique=SKIP).enqueue(10).id == kept.id


def test_an_idempotency_key_keeps_its_promise(app: Flask) -> None:
    first = index.using(unique=SKIP, idempotency_key="hook-1").enqueue(11)
    drain()
    # The idempotency key holds for as long as the row exists, scope or not.
    again = index.using(unique=SKIP, idempotency_key="hook-1").enqueue(11)
    assert again.id == first.id and again.status == JobStatus.COMPLETED
    # A new idempotency key with a unique key still held meets the unique holder.
    pending = index.using(unique=SKIP, idempotency_key="hook-2").enqueue(12)
    assert index.using(unique=SKIP, idempotency_key="hook-3").enqueue(12).id == pending.id
    assert len(rows(app)) == 2


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Unique(scope="forever"), ValueError, "scope='forever'"),  # type: ignore[arg-type]
        (lambda: Unique(on_conflict="merge"), ValueError, "'skip' or 'replace'"),  # type: ignore[arg-type]
        (lambda: Unique(key=""), ValueError, "1-255 characters"),
        (lambda: Unique(period=0), ValueError, "positive number of seconds"),
        (lambda: Unique(period="1h"), ValueError, "positive number of seconds"),  # type: ignore[arg-type]
        (lambda: index.using(unique=True), TypeError, "takes a Unique"),  # type: ignore[arg-type]
        (lambda: index.using(unique=SKIP).enqueue_many([([1], {})]), ValueError, "enqueue_many"),
        (lambda: queue.batch([index.using(unique=SKIP).step(1)]), ValueError, "cannot be unique"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    app: Flask, make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace("'", "'")):
        make()
    assert rows(app) == []


# -- where it shows ------------------------------------------------------------------------------


def test_show_and_the_admin_job_page_name_the_unique_key(app: Flask) -> None:
    job = index.using(unique=Unique(key="doc-<13>")).enqueue(13)
    shown = app.test_cli_runner().invoke(args=["queue", "show", str(job.id)])
    assert shown.exit_code == 0, shown.output
    assert "unique key       unique.index:key:doc-<13>" in shown.output
    plain = index.enqueue(14)
    shown = app.test_cli_runner().invoke(args=["queue", "show", str(plain.id)])
    assert "unique key       -" in shown.output

    app.config["SECRET_KEY"] = "test"
    app.register_blueprint(queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue")
    page = app.test_client().get(f"/queue/jobs/{job.id}")
    assert page.status_code == 200
    assert "<code>unique.index:key:doc-&lt;13&gt;</code>" in page.text  # escaped
    assert "sqlqueue-unique-key" not in app.test_client().get(f"/queue/jobs/{plain.id}").text


def test_a_tasks_unique_default_keeps_its_other_defaults() -> None:
    """A task declared with unique= and other defaults keeps every one of them."""
    from flask_sqlqueue import Unique as _Unique

    declared = SQLQueue()

    @declared.task(name="u.all", unique=_Unique(), tags=["t"], expires=60, priority=3)
    def all_defaults() -> None: ...

    options = all_defaults.options
    assert options.unique == _Unique()
    assert (options.tags, options.expires, options.priority) == (("t",), 60, 3)


# -- replay keeps the key: never two live holders ---------------------------------------------


@queue.task(name="unique.flaky", unique=Unique(), max_attempts=1)
def flaky(n: int) -> None:
    raise RuntimeError(f"down {n}")


def dead_then_replaced(app: Flask) -> tuple[Job, Job]:
    """A job that died holding its key, and the later job the key went to."""
    dead = flaky.enqueue(1)
    drain(app)
    assert dead.refresh().status is JobStatus.DEAD
    holder = flaky.enqueue(1)  # the dead one is out of scope: its key is taken
    assert holder.id != dead.id and holder.status is JobStatus.PENDING
    return dead, holder


def replay_doors(app: Flask) -> dict[str, Any]:
    from flask_sqlqueue.core import operations

    st = store(app)
    return {
        "retry": lambda ids: operations.retry(st, ids),
        "retry every dead job": lambda ids: operations.retry_dead(st),
        "retry dead by task": lambda ids: operations.retry_dead(st, task="unique.flaky"),
        "retry dead by text": lambda ids: operations.retry_dead(st, text="down 1"),
    }


@pytest.mark.parametrize(
    "door", ["retry", "retry every dead job", "retry dead by task", "retry dead by text"]
)
def test_a_replay_whose_key_another_live_job_holds_is_refused_naming_it(
    app: Flask, door: str
) -> None:
    from flask_sqlqueue.exceptions import InvalidTransition

    dead, holder = dead_then_replaced(app)
    with pytest.raises(InvalidTransition) as refused:
        replay_doors(app)[door]([dead.id])
    assert f"job {holder.id} (pending) holds its unique key" in str(refused.value)
    assert "nothing replayed" in str(refused.value)
    assert dead.refresh().status is JobStatus.DEAD
    assert holder.refresh().status is JobStatus.PENDING
    live = [r for r in rows(app) if r.status in ("pending", "running", "waiting")]
    assert [r.id for r in live] == [holder.id]


def test_a_replay_takes_its_key_back_from_a_holder_that_finished(app: Flask) -> None:
    from flask_sqlqueue.core import operations
    from flask_sqlqueue.exceptions import InvalidTransition

    dead, holder = dead_then_replaced(app)
    drain(app)  # the holder dies too, still holding the key
    assert holder.refresh().status is JobStatus.DEAD
    assert operations.retry(store(app), [dead.id]) == 1
    by_id = {r.id: r for r in rows(app)}
    assert by_id[dead.id].status == "pending"
    assert by_id[dead.id].unique_key == by_id[holder.id].unique_key_freed is not None
    assert by_id[holder.id].unique_key is None
    # Now the replayed job is the live holder: the other's replay is refused, and an
    # enqueue of the same call returns the replayed job.
    with pytest.raises(InvalidTransition, match=f"job {dead.id} \\(pending\\) holds"):
        operations.retry(store(app), [holder.id])
    assert flaky.enqueue(1).id == dead.id
    # "Retry every dead job" meets the same holder: refused whole.
    with pytest.raises(InvalidTransition, match=f"job {dead.id} \\(pending\\) holds"):
        operations.retry_dead(store(app))
    assert holder.refresh().status is JobStatus.DEAD


def test_the_cli_and_the_admin_refuse_the_same_replay(app: Flask, database_uri: str) -> None:
    dead, holder = dead_then_replaced(app)
    runner = app.test_cli_runner()
    result = runner.invoke(args=["queue", "retry", str(dead.id)])
    assert result.exit_code != 0
    assert f"job {holder.id} (pending) holds its unique key" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(args=["queue", "retry", "--dead"])
    assert result.exit_code != 0 and f"job {holder.id} (pending)" in result.output
    assert dead.refresh().status is JobStatus.DEAD

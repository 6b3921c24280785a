"""Concurrency and rate limits, on every backend: declaration and enqueue checks, the
claim itself, four worker processes sharing one limit, and what status and the admin show.

Tasks are in ``tests/limits_app.py``; each returns the ``time.time()`` of the start and
end of its body, so overlaps are checked from recorded times, never from timings.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core import transitions
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim as claim_jobs
from flask_sqlqueue.core.features.limits import window_start
from flask_sqlqueue.core.models import jobs
from flask_sqlqueue.core.models import workers
from tests import limits_app
from tests.conftest import flask_env
from tests.conftest import query
from tests.waiting import wait_for
from tests.workers import queue_work
from tests.workers import running

Q = limits_app.queue


def job_rows(app: Flask) -> list[Any]:
    with app.extensions["sqlqueue"].store.read() as conn:
        return list(conn.execute(sa.select(jobs).order_by(jobs.c.id)).all())


def claim(app: Flask, limit: int, *, worker: str = "w") -> list[int]:
    """One claim, as a worker serving every task of the limits app makes it."""
    store = app.extensions["sqlqueue"].store
    with store.write() as conn:
        rows = claim_jobs(
            conn,
            store.ops,
            ClaimRequest(
                worker_id=worker,
                token=uuid.uuid4().hex,
                now=store.now(),
                limit=limit,
                tasks=sorted(Q.registry),
            ),
            {name: task.limits for name, task in Q.registry.items() if task.limits},
        )
    return [row.id for row in rows]


def complete(app: Flask, job_id: int) -> None:
    store = app.extensions["sqlqueue"].store
    (token,) = query(
        str(store.engine.url.render_as_string(hide_password=False)),
        "SELECT claim_token FROM sqlqueue_jobs WHERE id = :i",
        i=job_id,
    )[0]
    assert store.run_write(
        lambda conn: transitions.complete(conn, job_id, token, None, store.now())
    )


# -- declaring -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"concurrency": 0}, "concurrency=0"),
        ({"concurrency": True}, "concurrency=True"),
        ({"concurrency": 1.5}, "concurrency=1.5"),
        ({"concurrency": "2"}, "concurrency='2'"),
        ({"rate_limit": (0, 60)}, "starts=0"),
        ({"rate_limit": (10, 0)}, "period=0"),
        ({"rate_limit": (10, -1.0)}, "period=-1.0"),
        ({"rate_limit": (10, math.inf)}, "period=inf"),
        ({"rate_limit": (10, "1m")}, "period='1m'"),
        ({"rate_limit": "10/m"}, "rate_limit must be (starts, period)"),
        ({"rate_limit": (10,)}, "rate_limit must be (starts, period)"),
        ({"concurrency": 1, "concurrency_key": "account_id"}, "must be a function"),
        ({"concurrency_key": lambda a: a}, "concurrency_key limits nothing on its own"),
    ],
)
def test_bad_limits_are_refused_at_declaration(options: dict[str, Any], fragment: str) -> None:
    queue = SQLQueue()
    with pytest.raises(ConfigurationError) as raised:

        @queue.task(**options)
        def limited(a: int) -> None: ...

    assert fragment in str(raised.value)
    assert len(queue.registry) == 0


def test_good_limits_are_kept_on_the_task() -> None:
    queue = SQLQueue()

    @queue.task(concurrency=2, concurrency_key=lambda a: a, rate_limit=(5, timedelta(minutes=1)))
    def limited(a: int) -> None: ...

    @queue.task
    def plain() -> None: ...

    assert limited.limits is not None
    assert (limited.limits.concurrency, limited.limits.rate, limited.limits.period) == (2, 5, 60.0)
    assert limited.limits.describe() == "concurrency 2, rate 5 per 1 min per key"
    assert plain.limits is None


# -- computing the key at enqueue ------------------------------------------------------------


def keys(database_uri: str) -> list[tuple[str, str | None]]:
    return query(database_uri, "SELECT task, concurrency_key FROM sqlqueue_jobs ORDER BY id")  # type: ignore[return-value]


def test_the_key_is_computed_at_enqueue(lapp: Flask, database_uri: str) -> None:
    long = "k" * 300
    with lapp.app_context():
        limits_app.per_account.enqueue("acme", 0.5)
        limits_app.two_per_account.using(priority=3).enqueue(42)  # an int key
        limits_app.per_account.enqueue(account=long)
        Q.enqueue(limits_app.per_account.name, args=["by-name"])
        limits_app.serial.enqueue(0)  # a limit on the whole task: no key
    result = lapp.test_cli_runner().invoke(
        args=["queue", "enqueue", limits_app.per_account.name, "--args", '["from-cli"]']
    )
    assert result.exit_code == 0, result.output
    stored = [key for _, key in keys(database_uri)]
    assert stored[:2] == ["acme", "42"]
    assert stored[2] is not None
    assert stored[2].startswith("sha256:") and len(stored[2]) == 71  # a long key is hashed
    assert stored[3:] == ["by-name", None, "from-cli"]


def failing_key(account: str) -> str:
    raise KeyError("no account")


@pytest.mark.parametrize(
    ("key", "error", "fragment"),
    [
        (failing_key, ValueError, "failed for args=('a',)"),
        (lambda account: None, TypeError, "returned None"),
        (lambda account: True, TypeError, "returned True"),
        (lambda account: 1.5, TypeError, "returned 1.5"),
        (lambda account: [account], TypeError, "returned ['a']"),
    ],
)
def test_a_bad_key_is_a_clear_error_and_nothing_is_written(
    lapp: Flask,
    database_uri: str,
    key: Callable[..., object],
    error: type[Exception],
    fragment: str,
) -> None:
    queue = SQLQueue()

    @queue.task(name="keyed", concurrency=1, concurrency_key=key)
    def keyed(account: str) -> None: ...

    # The task is declared on another queue object; write through the app's store.
    Q.registry.add(keyed)
    try:
        with lapp.app_context():
            with pytest.raises(error) as raised:
                Q.enqueue("keyed", args=["a"])
    finally:
        Q.registry._tasks.pop("keyed")
    assert fragment in str(raised.value)
    assert "nothing was enqueued" in str(raised.value).lower()
    assert keys(database_uri) == []


# -- the claim ------------------------------------------------------------------------------------


def test_a_concurrency_limit_of_one_holds_across_claims(lapp: Flask) -> None:
    with lapp.app_context():
        first, second, _ = (limits_app.serial.enqueue(0).id for _ in range(3))
    assert claim(lapp, 5, worker="a") == [first]
    assert claim(lapp, 5, worker="b") == []  # the slot is taken
    complete(lapp, first)
    assert claim(lapp, 5, worker="b") == [second]


def test_per_key_limits_let_different_keys_run_together(lapp: Flask) -> None:
    with lapp.app_context():
        a1, a2 = (limits_app.per_account.enqueue("a").id for _ in range(2))
        b1, _ = (limits_app.per_account.enqueue("b").id for _ in range(2))
        c1, c2, c3 = (limits_app.two_per_account.enqueue(7).id for _ in range(3))
    assert sorted(claim(lapp, 10)) == sorted([a1, b1, c1, c2])
    assert claim(lapp, 10) == []
    complete(lapp, a1)
    complete(lapp, c1)
    assert sorted(claim(lapp, 10)) == sorted([a2, c3])


def test_a_full_bucket_does_not_starve_the_jobs_behind_it(lapp: Flask) -> None:
    with lapp.app_context():
        running = limits_app.serial.using(priority=5).enqueue(0).id
        assert claim(lapp, 1) == [running]
        # A long backlog of the limited task, ahead of everything else in the line.
        for _ in range(60):
            limits_app.serial.using(priority=5).enqueue(0)
        key_backlog = [limits_app.per_account.using(priority=4).enqueue("x").id for _ in range(30)]
        others = [limits_app.free.enqueue().id for _ in range(3)]
    assert claim(lapp, 2) == [key_backlog[0], others[0]]
    assert claim(lapp, 10) == others[1:]


def test_a_rate_limit_holds_its_window(lapp: Flask, database_uri: str) -> None:
    with lapp.app_context():
        a1, _ = (limits_app.hourly.enqueue("a").id for _ in range(2))
        b1 = limits_app.hourly.enqueue("b").id
    assert sorted(claim(lapp, 10)) == [a1, b1]
    complete(lapp, a1)
    complete(lapp, b1)
    assert claim(lapp, 10) == []  # one start per key per hour
    windows = query(database_uri, "SELECT starts FROM sqlqueue_limits ORDER BY name")
    assert windows == [(1,), (1,)]


def test_a_paused_queue_is_not_claimed_by_a_limited_claim(lapp: Flask) -> None:
    with lapp.app_context():
        report = limits_app.report.enqueue(1).id
        serial = limits_app.serial.enqueue(0).id
        Q.pause("default")
    assert claim(lapp, 5) == [report]
    with lapp.app_context():
        Q.resume("default")
    assert claim(lapp, 5) == [serial]


# -- four worker processes ---------------------------------------------------------------------


def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["start"] < b["end"] and b["start"] < a["end"])


def assert_never_overlap(runs: list[dict[str, Any]], what: str) -> None:
    runs = sorted(runs, key=lambda r: r["start"])
    for before, after in itertools.pairwise(runs):
        assert after["start"] >= before["end"], f"{what}: {before} overlaps {after}"


@pytest.mark.slow
def test_four_worker_processes_never_exceed_the_limits(
    lapp: Flask,
    database_uri: str,
    tmp_path: Path,
) -> None:
    env = {**flask_env(database_uri), "FLASK_APP": "tests.limits_app:create_app"}
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (see below)
    args = ("--poll-interval", "0.05", "--concurrency", "2")
    with ExitStack() as stack:
        procs = []
        for n in range(4):
            output = tmp_path / f"worker{n}.out"
            procs.append(
                stack.enter_context(queue_work(database_uri, *args, env=env, output=output))
            )

        def live_workers() -> int:
            with lapp.extensions["sqlqueue"].store.read() as conn:
                return len(conn.execute(sa.select(workers.c.id)).all())

        wait_for(lambda: live_workers() == 4, "four workers to start")
        store = lapp.extensions["sqlqueue"].store
        with lapp.app_context(), store.write() as conn:  # everything at once
            for _ in range(6):
                limits_app.serial.using(session=conn).enqueue(0.1)
            # Each key's jobs wait for the other key's to start (``meet``): they overlap
            # unless a limit keeps one key's job from running while the other's does.
            meet = str(tmp_path / "meet")
            for _ in range(3):
                for account in ("a", "b"):
                    limits_app.per_account.using(session=conn).enqueue(account, 0.1, meet)
            for _ in range(3 * limits_app.RATE):
                limits_app.rated.using(session=conn).enqueue()
            for _ in range(8):
                limits_app.free.using(session=conn).enqueue(0.05)

        def finished() -> bool:
            for proc in procs:
                assert proc.poll() is None, "a worker exited early"
            return {row.status for row in job_rows(lapp)} == {"completed"}

        wait_for(finished, "every job to complete")
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        codes = [_wait_or_dump(proc, 30) for proc in procs]
    outputs = [(tmp_path / f"worker{n}.out").read_text() for n in range(4)]
    assert codes == [0] * 4, outputs

    rows = job_rows(lapp)
    runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        result = dict(json.loads(row.result), started_at=row.started_at)
        runs[row.task.rsplit(".", 1)[-1] + ":" + str(result.get("account", ""))].append(result)
    assert {len(v) for k, v in runs.items() if k.startswith("per_account")} == {3}

    assert_never_overlap(runs["serial:"], "concurrency=1")
    assert_never_overlap(runs["per_account:a"], "concurrency=1 for key a")
    assert_never_overlap(runs["per_account:b"], "concurrency=1 for key b")
    # Different keys are different limits: their jobs ran side by side.
    a_runs, b_runs = runs["per_account:a"], runs["per_account:b"]
    assert any(overlaps(a, b) for a in a_runs for b in b_runs), (a_runs, b_runs)

    # At most RATE starts in each fixed window, read from the recorded claim times.
    windows = collections.Counter(
        window_start(r["started_at"], limits_app.PERIOD) for r in runs["rated:"]
    )
    assert max(windows.values()) <= limits_app.RATE, windows
    assert len(windows) >= 3  # the limit held jobs back: 3 windows' worth of jobs
    assert len({r["pid"] for rs in runs.values() for r in rs}) >= 2  # the work was shared


def _wait_or_dump(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The exit code; a worker still running after ``timeout`` is aborted, so that its
    threads' stacks land in its output for the failure message."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(timeout=10)
        return None


# -- a worker keeps serving other tasks ---------------------------------------------------------


@pytest.fixture
def released() -> Iterator[threading.Event]:
    limits_app.release.clear()
    yield limits_app.release
    limits_app.release.set()


def test_a_worker_keeps_running_other_tasks_while_a_bucket_is_full(
    lapp: Flask,
    database_uri: str,
    released: threading.Event,
) -> None:
    with lapp.app_context():
        blocked = [limits_app.blocking.using(priority=5).enqueue().id for _ in range(20)]
        others = [limits_app.free.enqueue().id for _ in range(5)]
    worker = Q.worker(WorkerOptions(poll_interval=0.05, concurrency=3, grace=5), lapp)
    with running(worker):
        status = lambda: dict(query(database_uri, "SELECT id, status FROM sqlqueue_jobs"))  # noqa: E731
        wait_for(lambda: all(status()[i] == "completed" for i in others), "the free jobs")
        now = status()
        assert collections.Counter(now[i] for i in blocked) == {"running": 1, "pending": 19}

        # `flask queue status` shows the full bucket while it is full.
        shown = lapp.test_cli_runner().invoke(args=["queue", "status"])
        assert f"limit {limits_app.blocking.name}: running 1/1" in shown.output

        released.set()
        wait_for(lambda: all(status()[i] == "completed" for i in blocked), "the held jobs")


def test_status_and_admin_show_limits_per_key(lapp: Flask) -> None:
    with lapp.app_context():
        for account in ("acme", "acme", "globex"):
            limits_app.per_account.enqueue(account)
        limits_app.hourly.enqueue("initech")
    claim(lapp, 10)
    shown = lapp.test_cli_runner().invoke(args=["queue", "status"]).output
    name = limits_app.per_account.name
    assert f"limit {name} [acme]: running 1/1" in shown
    assert f"limit {name} [globex]: running 1/1" in shown
    hourly = limits_app.hourly.name
    assert f"limit {hourly} [initech]: running 1, started 1/1 in this 1 h window" in shown
    idle = f"limit {limits_app.two_per_account.name} (per key): concurrency 2 per key; no key"
    assert idle in shown

    lapp.secret_key = "test secret"
    lapp.register_blueprint(Q.admin_blueprint(authorize=lambda: True), url_prefix="/queue")
    page = lapp.test_client().get("/queue/").get_data(as_text=True)
    assert 'id="sqlqueue-limits"' in page
    assert "running 1/1" in page and "globex" in page

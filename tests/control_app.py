"""A queue of its own for the cancellation, progress, retention and signal tests.

Its tasks coordinate with the test through ``threading.Event`` objects kept here (the
worker runs in the test's process), so nothing waits on a fixed sleep.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import Retry
from flask_sqlqueue import Snooze
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Worker
from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import current_job
from flask_sqlqueue.core.models import jobs
from tests.conftest import install_schema
from tests.sample_app import queue_app
from tests.stores import burst as burst
from tests.stores import store_of as store_of
from tests.waiting import WAIT
from tests.workers import running

queue = SQLQueue()
app_log = logging.getLogger("tests.control_app.tasks")

#: Set by a task once it runs; the test sets ``go`` to let it carry on.
started = threading.Event()
go = threading.Event()


def reset_events() -> None:
    started.clear()
    go.clear()


@queue.task(name="control.until_cancelled")
def until_cancelled() -> str:
    """Polls the cancel request until it is seen, then raises JobCancelled."""
    started.set()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        current_job.raise_if_cancelled()
        time.sleep(0.01)
    return "never cancelled"


@queue.task(name="control.returns_when_cancelled")
def returns_when_cancelled() -> str:
    started.set()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if current_job.cancel_requested:
            return "stopped early"
        time.sleep(0.01)
    return "never cancelled"


@queue.task(name="control.waits")
def waits(result: str = "done") -> str:
    """Ignores cancel requests: runs until the test sets ``go``."""
    started.set()
    go.wait(WAIT)
    return result


@queue.task(name="control.waits_then_fails", max_attempts=5)
def waits_then_fails() -> None:
    started.set()
    go.wait(WAIT)
    raise RuntimeError("failed after the cancel request")


@queue.task(name="control.progress")
def progress(steps: list[list[Any]], wait: bool = False) -> str:
    """Reports each ``[fraction, message]`` of ``steps`` as fast as it can."""
    for fraction, message in steps:
        current_job.set_progress(fraction, message)
    started.set()
    if wait:
        go.wait(WAIT)
    return "ok"


@queue.task(name="control.progress_then", max_attempts=3)
def progress_then(end: str) -> None:
    """Reports 100%, then does not complete: ``end`` is "retry", "snooze" or "dead"."""
    current_job.set_progress(1.0, "all rows read")
    if end == "retry":
        raise Retry(3600, "the upload failed")
    if end == "snooze":
        raise Snooze(3600)
    raise PermanentFailure("the file is corrupt")


@queue.task(name="control.bad_progress")
def bad_progress(fraction: Any, message: Any = None) -> str:
    try:
        current_job.set_progress(fraction, message)
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "accepted"


@queue.task(name="control.add")
def add(a: int, b: int) -> int:
    return a + b


@queue.task(name="control.fails", max_attempts=2)
def fails(message: str = "boom") -> None:
    raise RuntimeError(message)


@queue.task(name="control.logs")
def logs(message: str) -> str:
    app_log.warning("inside: %s", message)
    return message


def make_app(database_uri: str, tmp_path: Path, **config: Any) -> Flask:
    """An app for ``queue`` on ``database_uri`` (empty at first), schema at head."""
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)  # faster than the migrations, on an empty server
    app = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri, **config})
    app.instance_path = str(tmp_path / "instance")
    if database_uri.startswith("sqlite"):
        queue.upgrade_database(app=app)
    return app


@pytest.fixture
def control_app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    reset_events()
    app = make_app(database_uri, tmp_path)
    yield app
    go.set()  # never leave a task waiting
    store_of(app).engine.dispose()


def row(app: Flask, job_id: int) -> Any:
    with store_of(app).read() as conn:
        return conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).one()


def update(app: Flask, job_id: int, **values: Any) -> None:
    with store_of(app).write() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(**values))


def csrf_token(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


@contextmanager
def running_worker(app: Flask, **options: Any) -> Iterator[Worker]:
    """``Worker.run()`` on a thread; a task waiting on ``go`` is let go before it stops."""
    options.setdefault("poll_interval", 0.05)
    options.setdefault("grace", 5.0)
    with running(queue.worker(WorkerOptions(**options), app)) as worker:
        try:
            yield worker
        finally:
            go.set()


@contextmanager
def statements(app: Flask) -> Iterator[list[str]]:
    """Every SQL statement the queue's engine runs inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = store_of(app).engine
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)

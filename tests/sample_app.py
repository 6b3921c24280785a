"""A small app used by the tests, in-process and as ``flask --app tests.sample_app`` workers.

Tasks that must be observed across processes write to files named in their arguments.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from flask import Flask

from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import Retry
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Unique
from flask_sqlqueue import current_job

queue = SQLQueue()


@queue.task
def add(a: int, b: int) -> int:
    return a + b


@queue.task(name="echo")
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@queue.task(queue="reports", priority=3, max_attempts=7)
def report(report_id: int) -> str:
    return f"report {report_id}"


@queue.task(max_attempts=3)
def always_fails(message: str = "boom") -> None:
    raise RuntimeError(message)


@queue.task(max_attempts=5)
def fails_until(path: str, succeed_on: int) -> int:
    """Fails until its attempt number reaches ``succeed_on``; logs attempts to ``path``."""
    with open(path, "a") as fh:
        fh.write(f"{current_job.id} {current_job.attempts}\n")
    if current_job.attempts < succeed_on:
        raise ValueError(f"attempt {current_job.attempts} fails")
    return current_job.attempts


@queue.task
def asks_retry(delay: float) -> None:
    raise Retry(delay, "not ready yet")


@queue.task
def gives_up() -> None:
    raise PermanentFailure("invalid account")


@queue.task(max_attempts=1)
def fails_with_odd_text() -> None:
    """Raises with text no database stores as is: a NUL (PostgreSQL) and a lone surrogate."""
    raise ValueError("nul \x00 and lone \ud800 end")


@queue.task
def bad_result() -> object:
    return object()


@queue.task(unique=Unique())
def single(n: int) -> int:
    """At most one pending job per argument (docs/uniqueness.md)."""
    return n


@queue.task
def reserve(key: str | None = None) -> list[bool]:
    return [current_job.reserve_effect(key), current_job.reserve_effect(key)]


@queue.task
def record(path: str, tag: str, seconds: float = 0.0) -> str:
    """Appends ``start``/``done`` lines with the job id, attempt and pid to ``path``."""
    with open(path, "a") as fh:
        fh.write(f"start {tag} {current_job.id} {current_job.attempts} {os.getpid()}\n")
    if seconds:
        time.sleep(seconds)
    with open(path, "a") as fh:
        fh.write(f"done {tag} {current_job.id} {current_job.attempts} {os.getpid()}\n")
    return tag


#: What :func:`hold` keeps: a leak, for as long as the process lives.
_held: list[bytes] = []


@queue.task
def hold(path: str, tag: str, mib: int = 0, until: str | None = None) -> None:
    """Keeps ``mib`` MiB for good (a leak), waits for the file ``until`` if given, then
    appends ``done tag id attempts pid`` to ``path``."""
    _held.append(b"\x01" * (mib * 1024 * 1024))  # written, so resident
    deadline = time.monotonic() + 600
    while until is not None and not os.path.exists(until) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(path, "a") as fh:
        fh.write(f"done {tag} {current_job.id} {current_job.attempts} {os.getpid()}\n")


@queue.task
def linger(path: str) -> None:
    """Writes its process's id to ``path``, then waits (to be killed)."""
    Path(path).write_text(str(os.getpid()))
    time.sleep(600)


@queue.task
def touch(path: str) -> None:
    Path(path).touch()


def queue_app(import_name: str, queue: SQLQueue, config: dict[str, Any] | None) -> Flask:
    """An app of the tests' kind for ``queue``: ``SAMPLE_DATABASE_URI``, no backoff."""
    app = Flask(import_name)
    app.config.update(
        SQLQUEUE_DATABASE_URI=os.environ.get("SAMPLE_DATABASE_URI"),
        SQLQUEUE_BACKOFF_BASE=0,
        SQLQUEUE_BACKOFF_JITTER=0,
    )
    app.config.update(config or {})
    queue.init_app(app)
    return app


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, instance_path=os.environ.get("SAMPLE_INSTANCE_PATH") or None)
    app.config.update(
        SQLQUEUE_DATABASE_URI=os.environ.get("SAMPLE_DATABASE_URI"),
        SQLQUEUE_BACKOFF_BASE=float(os.environ.get("SAMPLE_BACKOFF_BASE", "0")),
        SQLQUEUE_BACKOFF_JITTER=0,
    )
    app.config.update(config or {})
    queue.init_app(app)
    return app

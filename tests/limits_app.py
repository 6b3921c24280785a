"""An app whose tasks have concurrency and rate limits, for test_limits.py and
test_pause.py, in-process and as ``flask --app tests.limits_app`` worker processes.

Every task returns when it ran: ``time.time()`` at the start and at the end of its
body, and the pid of its worker, so tests can check intervals from the results.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from tests.sample_app import queue_app

queue = SQLQueue()

#: Set by in-process tests to hold ``blocking`` jobs until they release them.
release = threading.Event()


def _ran(started: float, **extra: Any) -> dict[str, Any]:
    return {"start": started, "end": time.time(), "pid": os.getpid(), **extra}


@queue.task(concurrency=1)
def serial(seconds: float) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    return _ran(started)


@queue.task(concurrency=1, concurrency_key=lambda account, *_, **__: account)
def per_account(account: str, seconds: float = 0.0, meet: str = "") -> dict[str, Any]:
    """With ``meet`` (a path prefix), first waits, up to a minute, for a job of the other
    account ("a" or "b") to have started: their runs then overlap wherever the limits let
    them, however slowly a loaded machine dispatches the second one."""
    started = time.time()
    if meet:
        Path(f"{meet}-{account}").touch()
        other = Path(f"{meet}-{'b' if account == 'a' else 'a'}")
        deadline = time.monotonic() + 60
        while not other.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(seconds)
    return _ran(started, account=account)


@queue.task(concurrency=2, concurrency_key=lambda account, **_: account)
def two_per_account(account: int, seconds: float = 0.0) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    return _ran(started, account=account)


RATE = 3
PERIOD = 0.5


@queue.task(rate_limit=(RATE, PERIOD))
def rated() -> dict[str, Any]:
    return _ran(time.time())


@queue.task(rate_limit=(1, 3600.0), concurrency_key=lambda account: account)
def hourly(account: str) -> dict[str, Any]:
    return _ran(time.time(), account=account)


@queue.task
def free(seconds: float = 0.0) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    return _ran(started)


@queue.task(concurrency=1)
def blocking(path: str = "") -> dict[str, Any]:
    """Holds its slot until the test sets ``release`` (or, across processes, until
    ``path`` exists)."""
    started = time.time()
    deadline = time.monotonic() + 30
    while not release.is_set() and not (path and Path(path).exists()):
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.01)
    return _ran(started)


@queue.task(queue="mail")
def mail(n: int) -> int:
    return n


@queue.task(queue="reports")
def report(n: int, path: str = "") -> int:
    """With ``path``: waits for that file, so a test can pause its queue mid-run."""
    deadline = time.monotonic() + 30
    while path and not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.01)
    return n


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

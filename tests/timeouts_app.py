"""The app of tests/test_timeouts.py, run as ``flask --app tests.timeouts_app`` workers.

Tasks report what they did by appending ``start``/``done`` lines (tag, job id, attempt,
pid) to the file named in their first argument.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.sample_app import queue_app

queue = SQLQueue()


def _line(path: str, kind: str, tag: str) -> None:
    with open(path, "a") as fh:
        fh.write(f"{kind} {tag} {current_job.id} {current_job.attempts} {os.getpid()}\n")


@queue.task(timeout=1, max_attempts=2, isolate=True)
def stuck(path: str, tag: str) -> None:
    """Never returns by itself: only a hard timeout ends it."""
    _line(path, "start", tag)
    time.sleep(3600)


@queue.task(timeout=1, max_attempts=2)
def stuck_anywhere(path: str, tag: str) -> None:
    """Like ``stuck`` without isolate=True: enforced only under ``--processes``."""
    _line(path, "start", tag)
    time.sleep(3600)


@queue.task
def quick(path: str, tag: str) -> str:
    _line(path, "start", tag)
    _line(path, "done", tag)
    return tag


@queue.task(isolate=True, max_attempts=1)
def exits(path: str, tag: str) -> None:
    _line(path, "start", tag)
    os._exit(1)


@queue.task(isolate=True)
def waits(path: str, tag: str) -> None:
    """Runs an hour and never checks current_job.cancel_requested."""
    _line(path, "start", tag)
    time.sleep(3600)


@queue.task(isolate=True)
def naps(path: str, tag: str, seconds: float) -> str:
    _line(path, "start", tag)
    time.sleep(seconds)
    _line(path, "done", tag)
    return tag


@queue.task(timeout=0.5)
def overruns(path: str, tag: str, seconds: float) -> str:
    """Passes its timeout on a thread worker, which can only report it."""
    _line(path, "start", tag)
    time.sleep(seconds)
    _line(path, "done", tag)
    return tag


@queue.task(isolate=True, max_attempts=1)
def inside(path: str, key: str) -> dict[str, Any]:
    """What current_job is inside a child process."""
    _line(path, "start", key)
    return {
        "id": current_job.id,
        "attempts": current_job.attempts,
        "max_attempts": current_job.max_attempts,
        "task": current_job.task,
        "effects": [current_job.reserve_effect(key), current_job.reserve_effect(key)],
        "pid": os.getpid(),
        # The app's own log records name the job (flask_sqlqueue.core.logcontext).
        "logged_job": logging.getLogger("app")
        .makeRecord("app", logging.INFO, __file__, 1, "x", (), None)
        .sqlqueue_job_id,
    }


@queue.task(isolate=True, max_attempts=3)
def raises(kind: str) -> None:
    from flask_sqlqueue import PermanentFailure
    from flask_sqlqueue import Retry

    if kind == "permanent":
        raise PermanentFailure("no such account")
    if kind == "retry":
        raise Retry(3600, "not ready")
    raise KeyError(kind)


def create_app(config: dict[str, Any] | None = None) -> Flask:
    if os.environ.get("TIMEOUTS_BREAK_CHILD") and multiprocessing.parent_process() is not None:
        raise RuntimeError("this app refuses to load in a child process")
    return queue_app(__name__, queue, config)

"""The app of tests/test_expiry.py: tasks that snooze, and tasks whose runs leave a mark.

Run in-process and as the children of an in-process worker (``processes=1``), so each
task says what it did in a file named in its arguments.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask

from flask_sqlqueue import Retry
from flask_sqlqueue import Snooze
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.sample_app import queue_app

queue = SQLQueue()


def _next_step(path: str, steps: list[str]) -> str:
    """The step of this run: one line per run so far in ``path``, then this one's."""
    file = Path(path)
    runs = len(file.read_text().splitlines()) if file.exists() else 0
    step = steps[min(runs, len(steps) - 1)]
    with file.open("a") as fh:
        fh.write(f"{step} attempts={current_job.attempts} snoozes={current_job.snoozes}\n")
    return step


def _act(step: str) -> dict[str, int]:
    if step == "snooze":
        raise Snooze(0, "come back later")
    if step == "snooze-hour":
        raise Snooze(timedelta(hours=1))
    if step == "retry":
        raise Retry(0, "not ready")
    if step == "fail":
        raise ValueError("it broke")
    return {"attempts": current_job.attempts, "snoozes": current_job.snoozes}


# A backoff that shows which attempt it was given: attempt k waits k thousand seconds.
@queue.task(max_attempts=3, backoff=lambda attempt: 1000.0 * attempt)
def scripted(path: str, steps: list[str]) -> dict[str, int]:
    """Does, on its n-th run, ``steps[n]`` (the last one again once they run out)."""
    return _act(_next_step(path, steps))


@queue.task(max_attempts=1)
async def async_scripted(path: str, steps: list[str]) -> dict[str, int]:
    await asyncio.sleep(0)
    return _act(_next_step(path, steps))


@queue.task(max_attempts=1)
def leave_mark(path: str) -> str:
    """The side effect an expired job must never have."""
    Path(path).write_text("ran")
    return "ran"


@queue.task(queue="nobody", max_attempts=1)
def unserved_mark(path: str) -> str:
    Path(path).write_text("ran")
    return "ran"


@queue.task(max_attempts=1)
def outlive_expiry(path: str) -> str:
    """Starts, then runs on until the queue's clock is past its own expiry: an expiry
    that passes while a job runs must not stop it."""
    Path(path).write_text("started")
    job = queue.get_job(current_job.id)
    assert job is not None and job.expires_at is not None
    store = queue.state().store
    deadline = time.monotonic() + 120
    while store.now() <= job.expires_at and time.monotonic() < deadline:
        time.sleep(0.05)
    return "finished after its expiry" if store.now() > job.expires_at else "gave up"


@queue.task(expires=3600)
def expires_in_an_hour() -> None:
    pass


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

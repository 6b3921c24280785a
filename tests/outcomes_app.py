"""The app of tests/test_outcomes.py: ``async def`` tasks, and tasks whose outcomes are
larger than a database stores. Run in-process, as the children of an in-process worker,
and as ``flask --app tests.outcomes_app`` workers.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from flask import Flask
from flask import current_app

from flask_sqlqueue import JobCancelled
from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import Retry
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.sample_app import queue_app

queue = SQLQueue()


async def _job_seen_by_a_subtask() -> int:
    await asyncio.sleep(0)
    return current_job.id


@queue.task(max_attempts=1)
async def async_add(a: int, b: int) -> dict[str, Any]:
    """What an async task sees while it runs: its job, its app, its loop and thread."""
    await asyncio.sleep(0.01)
    return {
        "sum": a + b,
        "job": current_job.id,
        "attempts": current_job.attempts,
        "subtask_job": await asyncio.create_task(_job_seen_by_a_subtask()),
        "effects": [current_job.reserve_effect(f"fx-{a}"), current_job.reserve_effect(f"fx-{a}")],
        "app": current_app.name,
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
    }


@queue.task(max_attempts=3)
async def async_fails(kind: str) -> None:
    await asyncio.sleep(0)
    if kind == "retry":
        raise Retry(3600, "not ready")
    if kind == "permanent":
        raise PermanentFailure("no such account")
    if kind == "cancel":
        raise JobCancelled(current_job.id)
    raise KeyError(kind)


@queue.task(timeout=1, max_attempts=1)
async def async_stuck(path: str) -> None:
    """Awaits for an hour; only a hard timeout (``--processes``) ends it."""
    try:
        with open(path, "a") as fh:
            fh.write(f"start {current_job.id} {os.getpid()}\n")
        await asyncio.sleep(3600)
    finally:  # the worker's stop signal unwinds the coroutine, so this runs
        with open(path, "a") as fh:
            fh.write(f"unwound {current_job.id}\n")


@queue.task(max_attempts=3)
def big_result(size: int) -> str:
    return "x" * size


@queue.task(max_attempts=3)
async def async_big_result(size: int) -> str:
    await asyncio.sleep(0)
    return "x" * size


@queue.task
def small_result(path: str) -> str:
    Path(path).touch()
    return "small"


@queue.task(max_attempts=2)
def fails_loudly(size: int, depth: int = 0) -> None:
    """Raises with a message of ``size`` characters, ``depth`` frames down."""
    if depth:
        fails_loudly(size, depth - 1)
    raise ValueError("e" * size)


@queue.task(max_attempts=25)
def always_fails(size: int) -> None:
    raise RuntimeError(f"attempt {current_job.attempts} " + "f" * size)


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

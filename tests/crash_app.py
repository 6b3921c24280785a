"""An app for the crash budget and effect outcome tests, in-process and as worker
processes (``python -c`` with ``SAMPLE_DATABASE_URI`` set, see tests/test_crash_budget.py).

Tasks that must be observed across processes write to files named in their arguments.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.sample_app import queue_app as queue_app

queue = SQLQueue()


@queue.task
def hang(path: str, key: str) -> None:
    """Reserves ``key`` with ``current_job.effect``, writes ``job attempt pid first`` to
    ``path``, then waits inside the block to be killed: a job that kills its worker."""
    with current_job.effect(key) as first:
        with open(path, "a") as fh:
            fh.write(f"{current_job.id} {current_job.attempts} {os.getpid()} {first}\n")
        time.sleep(3600)


@queue.task(max_attempts=5)
def naps(path: str, seconds: float) -> int:
    """Writes ``job attempt pid`` to ``path``, sleeps ``seconds`` and returns its attempt."""
    with open(path, "a") as fh:
        fh.write(f"{current_job.id} {current_job.attempts} {os.getpid()}\n")
    time.sleep(seconds)
    return current_job.attempts


@queue.task(max_attempts=2)
def fails() -> None:
    raise RuntimeError("an ordinary failure")


@queue.task(max_attempts=1)
def effects_then_fail(done: list[str], unsettled: list[str]) -> None:
    """Marks each of ``done`` done, reserves each of ``unsettled`` only, then fails."""
    for key in done:
        with current_job.effect(key):
            pass
    for key in unsettled:
        current_job.reserve_effect(key)
    raise RuntimeError("after its effects")


@queue.task(max_attempts=1)
def fails_inside(key: str) -> None:
    with current_job.effect(key):
        raise RuntimeError("the effect's call failed")


@queue.task
def effect_once(key: str | None = None) -> bool:
    """Whether this job was the first to reserve ``key``; the block marks it done."""
    with current_job.effect(key) as first:
        return first


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

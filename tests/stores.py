"""An app's queue, reached the public way, for tests: its store, and one burst run.

Tests read rows, the clock and engines through the app's :class:`Store`, and run every
due job with a worker that returns once the queue is empty. Both go through
:func:`queue_state`, as the package's own code does, not ``app.extensions``.
"""

from __future__ import annotations

from typing import Any

from flask import Flask

from flask_sqlqueue import WorkerOptions
from flask_sqlqueue.core.store import Store
from flask_sqlqueue.extension import queue_state
from tests.waiting import WAIT
from tests.workers import run_burst


def store_of(app: Flask) -> Store:
    """The queue's store on ``app``."""
    return queue_state(app).store


def burst(app: Flask, *, timeout: float = WAIT, **options: Any) -> None:
    """Run every due job of ``app``'s queue on a worker with ``options`` (a grace of 1 s
    unless given), returning once the queue is empty; fail after ``timeout`` seconds."""
    options.setdefault("grace", 1.0)
    run_burst(queue_state(app).queue.worker(WorkerOptions(**options), app), timeout=timeout)

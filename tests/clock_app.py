"""A queue whose host wall clock a test can step: ``flask --app tests.clock_app ...``.

The queue reads the wall clock in one place, ``flask_sqlqueue.core.clock.utcnow`` (the
seam ``test_a_skewed_host_uses_the_database_clock`` patches too). With ``CLOCK_STEP_FILE``
set, this app adds to every reading the seconds written in that file, read afresh each
time: writing ``-3600`` there while the process runs is what setting its host's clock an
hour back does. ``CLOCK_BOOT_ID`` gives the process a boot id of its own, as if it ran on
another machine. Tasks wait on files, so no test waits on a fixed sleep.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from datetime import timedelta
from pathlib import Path
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from flask_sqlqueue.core import clock as clock_module
from tests.sample_app import queue_app

WAIT = 300.0  # the longest a task waits for its release file
queue = SQLQueue()


@queue.task(name="clock.hold")
def hold(log: str, release: str) -> int:
    """Appends ``start <job id> <attempt> <pid>`` to ``log``, then runs until ``release``
    exists."""
    with open(log, "a") as fh:
        fh.write(f"start {current_job.id} {current_job.attempts} {os.getpid()}\n")
    deadline = time.monotonic() + WAIT
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.05)
    return current_job.attempts


@queue.task(name="clock.wall")
def wall() -> float:
    """The wall clock of the process that runs it, as the queue reads it."""
    return clock_module.utcnow().timestamp()


def stepped_clock(path: str) -> Any:
    """``utcnow`` plus the seconds in the file at ``path`` (0 while it is empty)."""
    real = clock_module.utcnow

    def utcnow() -> datetime:
        text = Path(path).read_text().strip()
        return real() + timedelta(seconds=float(text or 0))

    return utcnow


def create_app(config: dict[str, Any] | None = None) -> Flask:
    stale_after = float(os.environ.get("CLOCK_STALE_AFTER", "5"))
    app = queue_app(__name__, queue, {"SQLQUEUE_STALE_AFTER": stale_after, **(config or {})})
    step_file = os.environ.get("CLOCK_STEP_FILE")
    if step_file:
        clock_module.utcnow = stepped_clock(step_file)  # type: ignore[assignment]
    boot_id = os.environ.get("CLOCK_BOOT_ID")
    if boot_id:
        from flask_sqlqueue.core.liveness import BootClock

        app.extensions["sqlqueue"].store.boot = BootClock(boot_id)
    return app

"""Waiting in tests: always for a condition, with a deadline that stretches with load.

A wait returns as soon as its condition holds, so its deadline costs a passing test
nothing; it only says how long a failing one takes to say so. The deadlines are sized
for a busy two-core machine (the suite beside a CPU hog), and stretch further where the
machine is busier than that: ``SQLQUEUE_TEST_SLOWDOWN`` sets the factor, else it is the
load average per core (at least 1).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any


def slowdown() -> float:
    """How much longer than on a quiet machine anything may take now."""
    given = os.environ.get("SQLQUEUE_TEST_SLOWDOWN")
    if given:
        return max(1.0, float(given))
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this system
        return 1.0
    return max(1.0, load)


#: The deadline of a wait for something that takes well under a second when all is well,
#: stretched by the load when the session started.
WAIT = 60.0 * slowdown()


def scaled(seconds: float) -> float:
    """A bound of ``seconds`` on a quiet machine, stretched by the load right now."""
    return seconds * slowdown()


def wait_for(predicate: Callable[[], Any], what: str = "", timeout: float | None = None) -> None:
    """Return once ``predicate()`` is true; fail the test after ``timeout`` seconds
    (default :data:`WAIT`), naming ``what`` was waited for."""
    limit = WAIT if timeout is None else timeout
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit:.0f}s waiting for {what or predicate}")
        time.sleep(0.02)

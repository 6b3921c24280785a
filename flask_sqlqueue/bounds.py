"""The times the queue can store, the same on every backend.

Standard library only, like ``exceptions``: the core uses it to check ``delay`` and
``run_at`` at enqueue, and :class:`~flask_sqlqueue.Retry` to check its delay where the
task raises it; and the spans of time given as a positive number of seconds (a task's
timeout, a wait's poll interval).
"""

from __future__ import annotations

import math
from datetime import UTC
from datetime import datetime
from datetime import timedelta

#: The earliest and the latest ``run_at`` a job may have. MariaDB's DATETIME holds
#: 1000-01-01 to 9999-12-31, and Python's datetime ends there too; a day less at each
#: end keeps the time a valid datetime in every time zone it may be shown in.
EARLIEST_RUN_AT = datetime(1000, 1, 2, tzinfo=UTC)
LATEST_RUN_AT = datetime(9999, 12, 30, tzinfo=UTC)

#: How the range reads in error messages.
RUN_AT_RANGE = f"{EARLIEST_RUN_AT:%Y-%m-%d} to {LATEST_RUN_AT:%Y-%m-%d} (UTC)"


def longest_delay(now: datetime) -> float:
    """The most seconds after ``now`` that still give a storable time."""
    return (LATEST_RUN_AT - now).total_seconds()


def time_after(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds``, or :data:`LATEST_RUN_AT` if that is later: unlike
    ``now + timedelta(seconds=...)``, it never raises ``OverflowError``."""
    if not seconds < longest_delay(now):
        return LATEST_RUN_AT
    return now + timedelta(seconds=seconds)


def positive_seconds(value: object, name: str, example: str) -> float:
    """``value`` as a positive, finite number of seconds; else ``ValueError`` naming
    ``name`` and showing ``name=example``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"{name} must be a positive number of seconds, like {name}={example}; got {value!r}."
        )
    return float(value)

"""The database's clock: one time for every host of a queue.

Workers and producers on hosts whose clocks disagree stamp and compare times with the
database's, read from a server now and then and carried forward on a steady clock in
between, so that a step of a host's wall clock moves nothing. SQLite shares the host's
clock, and is read from it directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from .dialects import DialectOps
from .liveness import steady
from .models import utcnow

#: Seconds between two readings of a server's clock (see :meth:`DatabaseClock.now`).
CLOCK_SYNC_INTERVAL = 60.0
#: The same, while no reading has succeeded yet.
CLOCK_RETRY_INTERVAL = 5.0


class DatabaseClock:
    """The time of one database, as the store and everything built on it reads it."""

    def __init__(self, ops: DialectOps, read: Callable[[], Any]) -> None:
        """:param read: opens a short read-only transaction (``Store.read``)."""
        self._ops = ops
        self._read = read
        self._offset = timedelta(0)
        #: The database's time at the last reading and the steady clock then; ``None``
        #: until a reading succeeds. One tuple, so a reader never sees half of an update.
        self._anchor: tuple[datetime, float] | None = None
        self._synced_at = -math.inf

    def now(self) -> datetime:
        """The database's current time, so workers on hosts with skewed clocks agree.

        Servers are asked once a minute; in between, the time elapsed since on a steady
        clock (:func:`~.liveness.steady`) is added to their answer, so a step of this
        host's wall clock never moves it. SQLite shares the host's clock.
        """
        if self._ops.clock_query is None:
            return utcnow()
        anchor = self._anchor
        due = CLOCK_SYNC_INTERVAL if anchor is not None else CLOCK_RETRY_INTERVAL
        if steady() - self._synced_at > due:
            self.sync()
            anchor = self._anchor
        if anchor is None:  # the server has not answered yet: the host's clock
            return utcnow() + self._offset
        value, at = anchor
        return value + timedelta(seconds=steady() - at)

    def sync(self) -> timedelta:
        """Read the database's clock; returns its offset from this host's wall clock."""
        assert self._ops.clock_query is not None
        self._synced_at = steady()
        try:
            with self._read() as conn:
                before, wall_before = steady(), utcnow()
                value = conn.exec_driver_sql(self._ops.clock_query).scalar_one()
                after, wall_after = steady(), utcnow()
        except sa.exc.DBAPIError:
            return self._offset  # keep the last reading; try again later
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        # Half the round trip on each side of the server's answer.
        self._anchor = (value, (before + after) / 2)
        self._offset = value - (wall_before + (wall_after - wall_before) / 2)
        return self._offset

"""A periodic task's schedule: its cron slots, and the idempotency key of each slot.

Values only, no database: a task holds its :class:`Schedule` (``core/tasks.py``), and
the scheduler of ``core/periodic.py`` enqueues the slots that are due (its docstring
says which).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from datetime import tzinfo
from typing import Any
from zoneinfo import ZoneInfo
from zoneinfo import ZoneInfoNotFoundError

from cronsim import CronSim
from cronsim import CronSimError

from ..exceptions import ArgumentTypeError
from ..exceptions import ConfigurationError
from .features.arguments import codec_for
from .options import misfit
from .options import signature_of
from .payload import encode_payload

#: How late a slot may be enqueued without ``backfill`` (a worker restarting across a
#: slot still runs it, late); older slots are skipped.
MISFIRE_GRACE = timedelta(seconds=60)
#: With ``backfill=True``: at most this many missed slots are enqueued...
DEFAULT_BACKFILL_LIMIT = 10
#: ...and none older than this.
DEFAULT_BACKFILL_WINDOW = timedelta(days=1)
#: Every periodic job's idempotency key starts with this.
KEY_PREFIX = "sqlqueue:periodic:"

#: How a slot is written in its job's key and in log lines.
SLOT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
_SLOT_TEXT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
_MAX_KEY = 255


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic task runs and with which arguments. Build it with :meth:`create`."""

    task: str
    expression: str
    timezone: str
    zone: tzinfo = field(repr=False)
    payload: str = field(repr=False)
    backfill: bool = False
    backfill_limit: int = DEFAULT_BACKFILL_LIMIT
    backfill_window: timedelta = DEFAULT_BACKFILL_WINDOW

    @classmethod
    def create(
        cls,
        task: str,
        expression: str,
        *,
        timezone: str = "UTC",
        fn: Callable[..., Any] | None = None,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        backfill: bool = False,
        backfill_limit: int = DEFAULT_BACKFILL_LIMIT,
        backfill_window: timedelta | float = DEFAULT_BACKFILL_WINDOW,
    ) -> Schedule:
        """Check everything now, so a bad schedule fails at import, not at 3 a.m.

        :param expression: a cron expression: 5 fields (minute hour day month weekday),
            or 6 with seconds first; ``L``, ``W`` and ``#`` as in cronsim.
        :param timezone: an IANA zone name (``"Europe/Paris"``); slots are local times there.
        :param fn: the task's function; ``args`` and ``kwargs`` must fit its signature.
        :raises ConfigurationError: the expression, zone, arguments or bounds are invalid.
        """
        if not isinstance(expression, str) or not expression.strip():
            raise ConfigurationError(
                f"Periodic task {task!r}: schedule {expression!r} is not a cron expression; "
                "use 5 fields like '*/5 * * * *'."
            )
        if not isinstance(timezone, str) or not timezone:
            raise ConfigurationError(
                f"Periodic task {task!r}: timezone={timezone!r} must be an IANA zone name "
                "such as 'UTC' or 'Europe/Paris'."
            )
        try:
            zone: tzinfo = UTC if timezone == "UTC" else ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigurationError(
                f"Periodic task {task!r} (schedule {expression!r}): unknown timezone "
                f"{timezone!r}; use an IANA zone name such as 'UTC' or 'Europe/Paris' "
                "(install the tzdata package where the system has no zone database)."
            ) from exc
        try:
            first = next(CronSim(expression, datetime.now(UTC).astimezone(zone)), None)
        except CronSimError as exc:
            raise ConfigurationError(
                f"Periodic task {task!r}: {expression!r} is not a valid cron expression "
                f"({exc}); use 5 fields: minute hour day-of-month month day-of-week, "
                "like '*/5 * * * *'."
            ) from exc
        if first is None:
            raise ConfigurationError(
                f"Periodic task {task!r}: cron expression {expression!r} never fires."
            )
        if type(backfill) is not bool:
            raise ConfigurationError(f"backfill={backfill!r} must be True or False.")
        if type(backfill_limit) is not int or backfill_limit < 1:
            raise ConfigurationError(
                f"backfill_limit={backfill_limit!r} must be a whole number >= 1."
            )
        if isinstance(backfill_window, int | float) and not isinstance(backfill_window, bool):
            backfill_window = timedelta(seconds=backfill_window)
        if not isinstance(backfill_window, timedelta) or backfill_window <= timedelta(0):
            raise ConfigurationError(
                f"backfill_window={backfill_window!r} must be a positive timedelta or seconds."
            )
        if isinstance(args, str | bytes):
            raise ConfigurationError(f"args={args!r} must be a list of arguments.")
        args = tuple(args)
        kwargs = dict(kwargs or {})
        stored: tuple[Sequence[Any], Mapping[str, Any]] = (args, kwargs)
        if fn is not None:
            # The checks every enqueue of the task makes, at declaration.
            signature = signature_of(fn)
            reason = misfit(signature, args, kwargs)
            if reason is not None:
                raise ConfigurationError(
                    f"Periodic task {task!r}: args={list(args)!r} kwargs={kwargs!r} do not fit "
                    f"its signature: {reason}."
                )
            codec = codec_for(fn, signature)
            if codec is not None:
                try:
                    stored = codec.encode(args, kwargs)
                except ArgumentTypeError as exc:
                    raise ConfigurationError(f"Periodic task {task!r}: {exc}") from None
        return cls(
            task=task,
            expression=expression,
            timezone=timezone,
            zone=zone,
            payload=encode_payload(*stored),
            backfill=backfill,
            backfill_limit=backfill_limit,
            backfill_window=backfill_window,
        )

    # -- slots ---------------------------------------------------------------------------

    def slots(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Slots (aware UTC datetimes) with ``after < slot <= until``, oldest first."""
        for local in CronSim(self.expression, after.astimezone(self.zone)):
            slot = local.astimezone(UTC)
            if slot <= after:  # cronsim drops microseconds from its start
                continue
            if slot > until:
                return
            yield slot

    def due(self, cursor: datetime, now: datetime) -> tuple[list[datetime], int]:
        """The slots to enqueue at ``now`` when every slot up to ``cursor`` is done, and
        how many more ``backfill_limit`` leaves out (see the module docs)."""
        grace = self.backfill_window if self.backfill else MISFIRE_GRACE
        due = list(self.slots(max(cursor, now - grace), now))
        skipped = max(0, len(due) - self.backfill_limit) if self.backfill else 0
        return due[skipped:], skipped

    def next_slot(self, after: datetime) -> datetime | None:
        """The first slot after ``after``, in UTC (``None`` if there is none for 50 years)."""
        for local in CronSim(self.expression, after.astimezone(self.zone)):
            slot = local.astimezone(UTC)
            if slot > after:
                return slot
        return None

    # -- keys -------------------------------------------------------------------------------

    @property
    def key_prefix(self) -> str:
        prefix = f"{KEY_PREFIX}{self.task}:"
        if len(prefix) + 20 > _MAX_KEY:  # a very long task name: hash it to fit the column
            prefix = f"{KEY_PREFIX}sha1:{hashlib.sha1(self.task.encode()).hexdigest()}:"
        return prefix

    def key(self, slot: datetime) -> str:
        """The idempotency key of the job for ``slot``: unique per task and slot."""
        return self.key_prefix + slot.astimezone(UTC).strftime(SLOT_FORMAT)

    def slot_of(self, key: str) -> datetime | None:
        """The slot a key of this schedule stands for, or ``None``."""
        rest = key.removeprefix(self.key_prefix)
        if rest == key or not _SLOT_TEXT.fullmatch(rest):
            return None
        return datetime.strptime(rest, SLOT_FORMAT).replace(tzinfo=UTC)

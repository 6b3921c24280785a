"""Periodic tasks: cron schedules turned into jobs, each time slot exactly once.

Every worker runs a small scheduler (a thread that wakes about once a second, or at the
next slot if that comes sooner). There is no leader that could die: any number of
schedulers may see the same slot, and the database lets one job through. Each schedule
has a ledger row in ``sqlqueue_schedules`` holding the newest slot enqueued; a scheduler
locks that row, enqueues the due slots after it and moves it forward, all in one
transaction, so a crash never loses or doubles a slot, and a second scheduler waiting
for the lock finds the slots done. Job rows play no part in it: jobs pruned by
retention or purged never make their slots due again. (The job of a slot also carries
the unique idempotency key ``sqlqueue:periodic:<task>:<slot in UTC>``, a second guard.)

Slots are computed in the schedule's time zone (so ``0 9 * * *`` in ``Europe/Paris``
stays at 09:00 local time across daylight-saving changes, with Debian cron's rules for
the skipped and repeated hour) from the database's clock, so hosts with skewed clocks
agree on which slot is due.

Which slots a scheduler enqueues:

- A schedule no scheduler has seen before (no ledger row) starts at its next slot:
  the slots before that are not its to run.
- ``backfill=False`` (the default): a slot after the ledger's whose time came at most
  :data:`MISFIRE_GRACE` ago. A slot that no scheduler saw within that grace (every
  worker was down) is skipped; the next one runs as usual.
- ``backfill=True``: also the slots missed since the newest slot enqueued (or since the
  schedule was first seen), at most ``backfill_limit`` of them (the newest ones) and
  none older than ``backfill_window``.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from datetime import tzinfo
from typing import TYPE_CHECKING
from typing import Any
from zoneinfo import ZoneInfo
from zoneinfo import ZoneInfoNotFoundError

import sqlalchemy as sa
from cronsim import CronSim
from cronsim import CronSimError
from sqlalchemy.engine import Connection

from ..exceptions import ConfigurationError
from ..exceptions import SQLQueueError
from .enqueue import Call
from .enqueue import EnqueueOptions
from .enqueue import enqueue
from .enqueue import misfit
from .enqueue import signature_of
from .models import schedules
from .payload import decode_payload
from .payload import encode_payload

if TYPE_CHECKING:
    from .jobs import Job
    from .store import Store
    from .tasks import Task

log = logging.getLogger("flask_sqlqueue.periodic")

#: How late a slot may be enqueued without ``backfill`` (a worker restarting across a
#: slot still runs it, late); older slots are skipped.
MISFIRE_GRACE = timedelta(seconds=60)
#: With ``backfill=True``: at most this many missed slots are enqueued...
DEFAULT_BACKFILL_LIMIT = 10
#: ...and none older than this.
DEFAULT_BACKFILL_WINDOW = timedelta(days=1)
#: The scheduler looks at the clock at least this often (seconds).
TICK = 1.0
#: Every periodic job's idempotency key starts with this.
KEY_PREFIX = "sqlqueue:periodic:"

_SLOT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
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
        if fn is not None:
            # The check every enqueue of the task makes, at declaration.
            reason = misfit(signature_of(fn), args, kwargs)
            if reason is not None:
                raise ConfigurationError(
                    f"Periodic task {task!r}: args={list(args)!r} kwargs={kwargs!r} do not fit "
                    f"its signature: {reason}."
                )
        return cls(
            task=task,
            expression=expression,
            timezone=timezone,
            zone=zone,
            payload=encode_payload(args, kwargs),
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
        return self.key_prefix + slot.astimezone(UTC).strftime(_SLOT_FORMAT)

    def slot_of(self, key: str) -> datetime | None:
        """The slot a key of this schedule stands for, or ``None``."""
        rest = key.removeprefix(self.key_prefix)
        if rest == key or not _SLOT_TEXT.fullmatch(rest):
            return None
        return datetime.strptime(rest, _SLOT_FORMAT).replace(tzinfo=UTC)


def last_slots(conn: Connection, names: Iterable[str]) -> dict[str, datetime | None]:
    """The newest slot enqueued for each of the tasks ``names`` (``None``: none yet)."""
    rows = conn.execute(
        sa.select(schedules.c.task, schedules.c.last_slot).where(schedules.c.task.in_(names))
    )
    return {task: last for task, last in rows}


def _cursor(row: Any) -> datetime:
    """Every slot up to this time is done: the newest one enqueued, or if none yet, the
    moment the schedule was first seen."""
    cursor: datetime = row.last_slot if row.last_slot is not None else row.created_at
    return cursor


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as ``flask queue periodic`` and the admin show it."""

    schedule: Schedule
    queue: str
    next_run: datetime | None
    last_slot: datetime | None

    @property
    def next_run_local(self) -> datetime | None:
        return None if self.next_run is None else self.next_run.astimezone(self.schedule.zone)


def describe(
    store: Store, registry: Mapping[str, Task[Any, Any]], now: datetime | None = None
) -> list[ScheduleInfo]:
    """Every schedule in ``registry`` with its next run and the newest slot enqueued."""
    now = now or store.now()
    tasks = scheduled_tasks(registry)
    if not tasks:
        return []
    with store.read() as conn:
        last = last_slots(conn, [task.name for task in tasks])
    return [
        ScheduleInfo(
            schedule=task.schedule,
            queue=task.options.queue or "default",
            next_run=task.schedule.next_slot(now),
            last_slot=last.get(task.name),
        )
        for task in tasks
        if task.schedule is not None
    ]


def scheduled_tasks(registry: Mapping[str, Task[Any, Any]]) -> list[Task[Any, Any]]:
    """The tasks in ``registry`` that have a schedule, by name."""
    return [
        task for _, task in sorted(registry.items()) if getattr(task, "schedule", None) is not None
    ]


def enqueue_slot(
    store: Store,
    task: Task[Any, Any],
    schedule: Schedule,
    slot: datetime,
    conn: Connection | None = None,
) -> Job:
    """The job of ``slot``: written now, or the one written before (same key); in the
    transaction of ``conn`` if given. It takes the path of every enqueue, so it gets the
    task's concurrency key too."""
    # run_at is the slot itself: a late or backfilled slot runs at once, in slot order.
    options = EnqueueOptions(idempotency_key=schedule.key(slot), run_at=slot, session=conn)
    args, kwargs = decode_payload(schedule.payload)
    (job,) = enqueue(store, task, [Call(args, kwargs)], options)
    return job


class Scheduler:
    """Enqueues the due slots of every schedule in ``registry``; see the module docs.

    :meth:`tick` is one pass; :meth:`start` runs it on a thread until ``stop`` is set.

    :param clock: the current aware UTC time (default: the database's clock).
    """

    def __init__(
        self,
        store: Store,
        registry: Mapping[str, Task[Any, Any]],
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.tasks = scheduled_tasks(registry)
        self.clock = clock or store.now
        #: Per task: the ledger's cursor as this scheduler last read it; a pass with no
        #: slot due after it touches no table.
        self._cursor: dict[str, datetime] = {}

    def tick(self, now: datetime | None = None) -> float:
        """Enqueue every due slot; return the seconds until the next pass is needed.

        A slot that could not be written (the database is down) is tried again on the
        next pass; one that another scheduler wrote first is not written again.
        """
        now = now or self.clock()
        wait = TICK
        for task in self.tasks:
            schedule = task.schedule
            assert schedule is not None
            try:
                self._enqueue_due(task, schedule, now)
            # TypeError, ValueError: the enqueue's own checks (a concurrency_key that
            # fails for the schedule's arguments); the other schedules go on regardless.
            except (sa.exc.SQLAlchemyError, SQLQueueError, TypeError, ValueError) as exc:
                log.error("periodic task %s: could not enqueue (will retry): %s", task.name, exc)
                continue
            upcoming = schedule.next_slot(now)
            if upcoming is not None:
                wait = min(wait, (upcoming - now).total_seconds())
        return max(wait, 0.01)

    def _enqueue_due(self, task: Task[Any, Any], schedule: Schedule, now: datetime) -> None:
        cursor = self._cursor.get(task.name)
        if cursor is None:
            cursor = self._cursor[task.name] = self._first_look(task.name, now)
        if not schedule.due(cursor, now)[0]:
            return
        before = self.store.now()
        with self.store.write() as conn:
            # Held until commit: a second scheduler of this slot waits here, then finds it done.
            row = conn.execute(
                sa.select(schedules).where(schedules.c.task == task.name).with_for_update()
            ).first()
            if row is None:  # the ledger row was deleted: the schedule starts afresh
                del self._cursor[task.name]
                return
            cursor = _cursor(row)
            due, skipped = schedule.due(cursor, now)
            made = [enqueue_slot(self.store, task, schedule, slot, conn) for slot in due]
            if due:
                conn.execute(
                    sa.update(schedules)
                    .where(schedules.c.task == task.name)
                    .values(last_slot=due[-1], updated_at=now)
                )
        self._cursor[task.name] = due[-1] if due else cursor
        if not due:
            return
        self.store.wake()  # the jobs' own wake-ups came before the commit
        if skipped:
            log.warning(
                "periodic task %s: %d missed slot(s) before %s are past backfill_limit=%d; skipped",
                task.name,
                skipped,
                due[0].strftime(_SLOT_FORMAT),
                schedule.backfill_limit,
            )
        for slot, job in zip(due, made, strict=True):
            if job.created_at >= before:  # not a job this slot's key already had
                key = schedule.key(slot)
                log.info("periodic task %s: slot %s enqueued as job %s", task.name, key, job.id)

    def _first_look(self, name: str, now: datetime) -> datetime:
        """The ledger's cursor for ``name``; a schedule seen for the first time gets its
        row here, starting at ``now``."""
        with self.store.read() as conn:
            row = conn.execute(sa.select(schedules).where(schedules.c.task == name)).first()
        if row is not None:
            return _cursor(row)
        with self.store.write() as conn:
            try:
                with conn.begin_nested():
                    conn.execute(
                        sa.insert(schedules).values(
                            task=name, last_slot=None, created_at=now, updated_at=now
                        )
                    )
            except sa.exc.IntegrityError:
                pass  # another scheduler saw it first: its row counts
            row = conn.execute(sa.select(schedules).where(schedules.c.task == name)).one()
        return _cursor(row)

    def start(self, stop: threading.Event) -> threading.Thread | None:
        """Run :meth:`tick` on a daemon thread until ``stop`` is set; ``None`` without
        schedules. Join the thread after setting ``stop``."""
        if not self.tasks:
            return None
        thread = threading.Thread(
            target=self._loop, args=(stop,), name="sqlqueue-periodic", daemon=True
        )
        thread.start()
        return thread

    def _loop(self, stop: threading.Event) -> None:
        wait = 0.0
        while not stop.wait(wait):
            try:
                wait = self.tick()
            except Exception:
                # Never let the scheduler die with the worker still serving.
                log.exception("periodic scheduler: unexpected error; retrying")
                wait = TICK

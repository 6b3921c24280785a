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

A schedule can be disabled and enabled again at run time (:func:`set_enabled`): the flag
is a column of the ledger row, read by the same locking ``SELECT`` that decides which
slots to enqueue, so every scheduler obeys it from its next pass with no query of its
own. A disabled schedule's slots are not enqueued and its ledger does not move; once it
is enabled again, the slots up to that moment (``toggled_at``) stay missed, backfill or
not, and it carries on from its next slot. :func:`run_now` enqueues one run out of the
cadence, leaving the ledger alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..exceptions import SQLQueueError
from ..exceptions import UnknownSchedule
from .cron import DEFAULT_BACKFILL_LIMIT as DEFAULT_BACKFILL_LIMIT
from .cron import DEFAULT_BACKFILL_WINDOW as DEFAULT_BACKFILL_WINDOW
from .cron import SLOT_FORMAT
from .cron import Schedule as Schedule
from .enqueue import RunsJobs
from .enqueue import enqueue
from .jobs import Job
from .models import schedules
from .options import Call
from .options import EnqueueOptions
from .payload import decode_payload
from .store import Store
from .tasks import Task

# Schedule and the backfill defaults are re-exported (imported "as" themselves): they
# live below the tasks, in cron.py, and the extension finds them here.

log = logging.getLogger("flask_sqlqueue.periodic")

#: The scheduler looks at the clock at least this often (seconds).
TICK = 1.0


def last_slots(conn: Connection, names: Iterable[str]) -> dict[str, datetime | None]:
    """The newest slot enqueued for each of the tasks ``names`` (``None``: none yet)."""
    rows = conn.execute(
        sa.select(schedules.c.task, schedules.c.last_slot).where(schedules.c.task.in_(names))
    )
    return {task: last for task, last in rows}


def _cursor(row: Any) -> datetime:
    """Every slot up to this time is done: the newest one enqueued, or if none yet, the
    moment the schedule was first seen; or, if later, the moment it was last disabled
    or enabled (the slots missed while it was off stay missed)."""
    cursor: datetime = row.last_slot if row.last_slot is not None else row.created_at
    if row.toggled_at is not None and row.toggled_at > cursor:
        cursor = row.toggled_at
    return cursor


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """One schedule as ``flask queue schedules``, ``flask queue periodic`` and the admin
    show it.

    :ivar next_run: the next slot, in UTC; ``None`` while disabled, or if it never fires.
    :ivar last_slot: the newest slot enqueued (its last run), ``None`` until the first.
    :ivar enabled: ``False`` while disabled: no worker enqueues its slots.
    :ivar toggled_at: when it was last disabled or enabled, ``None`` if never.
    """

    schedule: Schedule
    queue: str
    next_run: datetime | None
    last_slot: datetime | None
    enabled: bool = True
    toggled_at: datetime | None = None

    @property
    def name(self) -> str:
        """The schedule's name: its task's."""
        return self.schedule.task

    @property
    def next_run_local(self) -> datetime | None:
        return None if self.next_run is None else self.next_run.astimezone(self.schedule.zone)


def describe(
    store: Store, registry: Mapping[str, Task[Any, Any]], now: datetime | None = None
) -> list[ScheduleInfo]:
    """Every schedule in ``registry``, by name, with its state, next run and the newest
    slot enqueued."""
    now = now or store.now()
    tasks = scheduled_tasks(registry)
    if not tasks:
        return []
    with store.read() as conn:
        rows = conn.execute(
            sa.select(
                schedules.c.task,
                schedules.c.last_slot,
                schedules.c.enabled,
                schedules.c.toggled_at,
            ).where(schedules.c.task.in_([task.name for task in tasks]))
        )
        ledger = {row.task: row for row in rows}
    infos = []
    for task in tasks:
        assert task.schedule is not None
        row = ledger.get(task.name)  # none until a scheduler (or a toggle) first sees it
        enabled = row is None or bool(row.enabled)
        infos.append(
            ScheduleInfo(
                schedule=task.schedule,
                queue=task.options.queue or "default",
                next_run=task.schedule.next_slot(now) if enabled else None,
                last_slot=None if row is None else row.last_slot,
                enabled=enabled,
                toggled_at=None if row is None else row.toggled_at,
            )
        )
    return infos


def disabled_schedules(conn: Connection) -> set[str]:
    """The names of the schedules disabled now."""
    rows = conn.execute(sa.select(schedules.c.task).where(sa.not_(schedules.c.enabled)))
    return set(rows.scalars())


def find_schedule(registry: Mapping[str, Task[Any, Any]], name: str) -> Task[Any, Any]:
    """The periodic task named ``name``.

    :raises UnknownSchedule: no periodic task of ``registry`` has that name.
    """
    task = registry.get(name) if isinstance(name, str) else None
    if task is None or getattr(task, "schedule", None) is None:
        known = [task.name for task in scheduled_tasks(registry)]
        raise UnknownSchedule(name, known)
    return task


def set_enabled(conn: Connection, name: str, enabled: bool, now: datetime) -> bool:
    """Enable or disable the schedule ``name`` (its ledger row is made if no scheduler
    saw it yet); ``False`` if it was so already. Name checked by the caller."""
    changed = sa.update(schedules).where(
        schedules.c.task == name, schedules.c.enabled == (not enabled)
    )
    if conn.execute(changed.values(enabled=enabled, toggled_at=now, updated_at=now)).rowcount:
        return True
    if conn.execute(sa.select(schedules.c.task).where(schedules.c.task == name)).first():
        return False  # so already
    if enabled:
        return False  # no row: enabled, as every schedule starts
    try:
        # A savepoint: a scheduler seeing the schedule first may insert the row first.
        with conn.begin_nested():
            conn.execute(
                sa.insert(schedules).values(
                    task=name,
                    last_slot=None,
                    created_at=now,
                    updated_at=now,
                    enabled=False,
                    toggled_at=now,
                )
            )
    except sa.exc.IntegrityError:
        return set_enabled(conn, name, enabled, now)
    return True


def run_now(
    store: Store,
    task: Task[Any, Any],
    *,
    eager: RunsJobs | None = None,
    conn: Connection | None = None,
) -> Job:
    """Enqueue one run of periodic ``task`` now, with its schedule's arguments, enabled
    or not; in the transaction of ``conn`` if given. The ledger is left alone: the
    schedule's next slot runs as it would have."""
    assert task.schedule is not None
    args, kwargs = decode_payload(task.schedule.payload)  # the stored forms of typed arguments
    options = EnqueueOptions(session=conn)
    (job,) = enqueue(store, task, [Call(args, kwargs)], options, encoded=True, eager=eager)
    return job


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
    args, kwargs = decode_payload(schedule.payload)  # the stored forms of typed arguments
    (job,) = enqueue(store, task, [Call(args, kwargs)], options, encoded=True)
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
            if not row.enabled:
                # Nothing to look at again before the next slot: the flag is read then.
                self._cursor[task.name] = now
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
                due[0].strftime(SLOT_FORMAT),
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

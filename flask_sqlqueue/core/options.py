"""What a call to enqueue says, checked before anything is written: its options, its
arguments against the task's signature, and the row a new job is.

Values only, no database: the store writes what :func:`job_values` makes, tasks keep
their defaults as :class:`EnqueueOptions`, and :func:`.enqueue.enqueue` checks each
:class:`Call` with these before it writes anything.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import TypedDict
from typing import cast

from sqlalchemy.engine import Connection

from ..bounds import EARLIEST_RUN_AT
from ..bounds import LATEST_RUN_AT
from ..bounds import RUN_AT_RANGE
from ..bounds import longest_delay
from .features import tags as _tags
from .features.uniqueness import Unique
from .jobs import Job
from .models import JobRow
from .models import JobStatus
from .payload import is_unicode

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import scoped_session

_QUEUE_NAME = re.compile(r"[\w.:-]{1,100}")
_INT32 = 2**31


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-call options; ``None`` means "the task's default". What callers say, and only
    that: what the queue sets on a job itself is a :class:`Machinery`."""

    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    session: Session | scoped_session[Any] | Connection | None = None
    #: The jobs (or their ids) that must complete before this one runs; kept as the
    #: sorted, distinct ids, ``None`` for none (core/features/dependencies.py).
    depends_on: Sequence[Job | int] | None = None
    #: Short labels to filter jobs by (core/features/tags.py); kept as distinct tags in their
    #: order, ``None`` for none. A task's tags and a call's add up.
    tags: Sequence[str] | None = None
    #: A small dict of JSON values the job carries, for its task and for people
    #: (core/features/tags.py); ``None`` for none.
    meta: Mapping[str, Any] | None = None
    #: When the job stops being worth starting (docs/expiry.md): seconds or a timedelta
    #: after it is enqueued, or an aware datetime. ``None``: never.
    expires: float | timedelta | datetime | None = None
    #: The version of the task its arguments are written for (core/features/versions.py);
    #: ``None``: the registered task's own (1 for a name not registered here).
    version: int | None = None
    #: At most one job per key while in scope, and what a conflict does
    #: (core/features/uniqueness.py, docs/uniqueness.md).
    unique: Unique | None = None

    def __post_init__(self) -> None:
        check_options(
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
        )
        if self.delay is not None and self.run_at is not None:
            raise ValueError("Pass delay or run_at, not both.")
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise TypeError(f"run_at must be a datetime, got {self.run_at!r}.")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise ValueError(
                    f"run_at={self.run_at!r} has no timezone; pass an aware datetime "
                    "such as datetime.now(UTC) + timedelta(...)."
                )
        # Checked again against the database's clock when the job is written.
        now = datetime.now(UTC)
        if self.expires is not None:
            expiry_time(self, now, due_time(self, now))
        else:
            due_time(self, now)
        key = self.idempotency_key
        if key is not None:
            check_key(key, "idempotency_key")
        if self.session is not None and not isinstance(self.session, Connection):
            _check_session(self.session)
        if self.depends_on is not None:
            object.__setattr__(self, "depends_on", check_depends_on(self.depends_on))
        if self.tags is not None:
            object.__setattr__(self, "tags", _tags.check_tags(self.tags))
        if self.meta is not None:
            object.__setattr__(self, "meta", _tags.check_meta(self.meta))
        if self.unique is not None and not isinstance(self.unique, Unique):
            raise TypeError(
                f"unique takes a Unique(...), got {self.unique!r}; for example "
                "unique=Unique(on_conflict='replace')."
            )

    @property
    def dependency_ids(self) -> tuple[int, ...]:
        """The ids of ``depends_on`` (made sorted and distinct ids at construction)."""
        return cast("tuple[int, ...]", self.depends_on or ())

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with every value ``other`` sets taking precedence."""
        if other is self or other == _NO_OPTIONS:
            return self  # a task's own options, as Task.enqueue passes them: checked once
        values = {
            name: getattr(other, name) if getattr(other, name) is not None else getattr(self, name)
            for name in self.__dataclass_fields__
        }
        if other.delay is not None:
            values["run_at"] = None
        if other.run_at is not None:
            values["delay"] = None
        # Tags add up: the task's, then the call's.
        values["tags"] = _tags.merge_tags(
            cast("tuple[str, ...] | None", self.tags), cast("tuple[str, ...] | None", other.tags)
        )
        return EnqueueOptions(**values)


@dataclass(frozen=True, slots=True)
class Machinery:
    """What the queue's own machinery sets on new jobs, never a caller: passed beside
    :class:`EnqueueOptions`, so that no public signature can set it. (A task's
    ``concurrency_key`` is each call's own: it comes with the call's payload.)"""

    #: What the job requires of each of ``depends_on`` (core/features/dependencies.py, REQUIRES);
    #: ``None``: that it completed. Set by batches, for their callbacks.
    require: str | None = None
    #: The batch the job belongs to (core/batches.py); set by batches only.
    batch_id: int | None = None
    #: The key ``unique`` gave for the call's arguments; set by enqueue() only.
    unique_key: str | None = None


#: Nothing set by the machinery.
NO_MACHINERY = Machinery()


# -- the vocabulary of the public signatures ------------------------------------------------
#
# Declared once, here, for ``**options: Unpack[...]``: ``Task.using``, ``SQLQueue.enqueue``
# and ``SQLQueue.enqueue_many`` (and ``@queue.task``'s ``TaskOptions``, in tasks.py).
# Each key is a field of EnqueueOptions, described at ``Task.using``;
# tests/test_options_vocabulary.py holds the signatures to these.


class CallOptions(TypedDict, total=False):
    """The options every enqueue takes, one job or many; ``None``: the task's default."""

    queue: str | None
    priority: int | None
    delay: float | timedelta | None
    run_at: datetime | None
    max_attempts: int | None
    session: Session | scoped_session[Any] | Connection | None
    depends_on: Sequence[Job | int] | None
    tags: Sequence[str] | None
    meta: Mapping[str, Any] | None
    expires: float | timedelta | datetime | None


class UsingOptions(CallOptions, total=False):
    """The options of ``Task.using``: those of one job, which may hold a key."""

    idempotency_key: str | None
    unique: Unique | None


class ByNameOptions(TypedDict, total=False):
    """What an enqueue by name adds, for a producer that does not import the task."""

    unregistered: bool
    encoded: bool
    version: int | None


class EnqueueByName(UsingOptions, ByNameOptions, total=False):
    """The options of ``SQLQueue.enqueue``."""


class EnqueueManyByName(CallOptions, ByNameOptions, total=False):
    """The options of ``SQLQueue.enqueue_many`` (idempotency keys go on each ``Call``)."""


def split_by_name(
    given: EnqueueByName | EnqueueManyByName,
) -> tuple[EnqueueOptions, ByNameOptions]:
    """The options of an enqueue by name: those :class:`EnqueueOptions` holds (``version``
    among them), and the two that only the path by name reads."""
    values: dict[str, Any] = dict(given)
    doors = ByNameOptions(
        unregistered=values.pop("unregistered", False), encoded=values.pop("encoded", False)
    )
    return EnqueueOptions(**values), doors


def check_keywords(given: Mapping[str, Any], vocabulary: Any, where: str) -> None:
    """Refuse a keyword that ``vocabulary`` (one of the TypedDicts above) does not
    declare, as Python refuses a keyword a function does not take: type checkers see
    ``**options: Unpack[...]``, but nothing checks it at run time.

    :raises TypeError: ``<where>() got an unexpected keyword argument 'name'``.
    """
    for name in given:
        if name not in vocabulary.__annotations__:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")


#: The largest id a job can have (a signed 64-bit key).
_MAX_ID = 2**63 - 1


def check_depends_on(depends_on: object) -> tuple[int, ...] | None:
    """The ids of ``depends_on`` (jobs or ids), sorted and distinct; ``None`` if empty.

    :raises TypeError: it is not a list of jobs and ids (a bool is not an id).
    :raises ValueError: an id that no job can have (zero or less, or past 64 bits).
    """
    if isinstance(depends_on, str | bytes | Mapping | Job | int) or not isinstance(
        depends_on, Iterable
    ):
        raise TypeError(
            f"depends_on takes a list of jobs or job ids, got {depends_on!r}; "
            "pass depends_on=[job] for one."
        )
    ids: set[int] = set()
    for item in depends_on:
        if isinstance(item, Job):
            item = item.id
        if type(item) is not int:  # not a bool, nor an int subclass that prints otherwise
            raise TypeError(f"depends_on takes jobs or job ids (int), got {item!r}.")
        if not 1 <= item <= _MAX_ID:
            raise ValueError(f"depends_on names no job with id {item}; nothing was enqueued.")
        ids.add(item)
    return tuple(sorted(ids)) or None


def _check_session(session: object) -> None:
    # Not a Connection, so an ORM session: the caller has loaded the ORM, which the queue
    # itself never imports (it writes Core rows; a worker is spared the ORM's memory).
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import scoped_session

    if not isinstance(session, Session | scoped_session):
        raise TypeError(
            "session must be a SQLAlchemy Session (or a scoped_session such as "
            f"Flask-SQLAlchemy's db.session) or Connection, got {session!r}."
        )


def check_options(
    *, queue: str | None = None, priority: int | None = None, max_attempts: int | None = None
) -> None:
    """Refuse a bad queue name, priority or attempt count with a message naming it."""
    if queue is not None and (not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue)):
        raise ValueError(
            f"queue={queue!r} is not a valid queue name: use 1-100 letters, digits, "
            "'_', '-', '.' or ':'."
        )
    if priority is not None and (type(priority) is not int or not -_INT32 <= priority < _INT32):
        raise TypeError(f"priority={priority!r} must be a whole number (32-bit).")
    if max_attempts is not None and (
        type(max_attempts) is not int or not 1 <= max_attempts < _INT32
    ):
        raise ValueError(f"max_attempts={max_attempts!r} must be a whole number >= 1.")


def check_key(key: object, what: str) -> str:
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or "\x00" in key or not is_unicode(key):
        raise ValueError(
            f"{what}={key!r} must be a string of 1-255 characters of valid Unicode text, "
            "without NUL."
        )
    return key


def check_task_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise ValueError(f"Task name {name!r} must be a string of 1-255 characters.")
    return name


def _delay_seconds(delay: float | timedelta, name: str = "delay") -> float:
    """The delay in seconds; ``inf`` for one too long for a float (refused by the caller)."""
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        try:
            seconds = float(delay)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
    else:
        raise TypeError(f"{name}={delay!r} must be seconds or a timedelta.")
    if not seconds >= 0:  # NaN too
        raise ValueError(f"{name}={delay!r} must be zero or more seconds.")
    return seconds


def due_time(options: EnqueueOptions, now: datetime) -> datetime:
    """When a job with these options is due, ``now`` being the database's time.

    :raises ValueError: ``run_at``, or ``now`` plus ``delay``, is outside the times the
        queue stores (:data:`~flask_sqlqueue.bounds.EARLIEST_RUN_AT` to
        :data:`~flask_sqlqueue.bounds.LATEST_RUN_AT`).
    """
    if options.run_at is not None:
        try:
            run_at = options.run_at.astimezone(UTC)
        except OverflowError:  # 9999-12-31 23:00 at UTC-5 is in the year 10000 in UTC
            run_at = None
        if run_at is None or not EARLIEST_RUN_AT <= run_at <= LATEST_RUN_AT:
            raise ValueError(
                f"run_at={options.run_at.isoformat()} is outside the times the queue "
                f"stores, {RUN_AT_RANGE}; pass a time in that range."
            )
        return run_at
    if options.delay is not None:
        seconds = _delay_seconds(options.delay)
        if seconds > longest_delay(now):
            raise ValueError(
                f"delay={options.delay!r} would make the job due after "
                f"{LATEST_RUN_AT:%Y-%m-%d} (UTC), the latest run_at the queue stores; "
                "pass a shorter delay."
            )
        return now + timedelta(seconds=seconds)
    return now


def expiry_time(options: EnqueueOptions, now: datetime, run_at: datetime) -> datetime | None:
    """When a job with these options, due at ``run_at``, expires (``None``: never),
    ``now`` being the database's time.

    :raises TypeError: ``expires`` is not seconds, a timedelta or a datetime.
    :raises ValueError: it is negative or not finite, a naive datetime, outside the times
        the queue stores, or not after ``run_at`` (the job could never start).
    """
    expires = options.expires
    if expires is None:
        return None
    if isinstance(expires, datetime):
        if expires.tzinfo is None or expires.utcoffset() is None:
            raise ValueError(
                f"expires={expires!r} has no timezone; pass an aware datetime such as "
                "datetime.now(UTC) + timedelta(hours=1), or seconds after the enqueue."
            )
        try:
            expires_at: datetime | None = expires.astimezone(UTC)
        except OverflowError:
            expires_at = None
        if expires_at is None or not EARLIEST_RUN_AT <= expires_at <= LATEST_RUN_AT:
            raise ValueError(
                f"expires={expires.isoformat()} is outside the times the queue stores, "
                f"{RUN_AT_RANGE}; pass a time in that range."
            )
    else:
        if isinstance(expires, bool) or not isinstance(expires, int | float | timedelta):
            raise TypeError(
                f"expires={expires!r} must be seconds after the enqueue, a timedelta, or an "
                "aware datetime."
            )
        seconds = _delay_seconds(expires, "expires")
        if not math.isfinite(seconds) or seconds > longest_delay(now):
            raise ValueError(
                f"expires={expires!r} would expire the job after {LATEST_RUN_AT:%Y-%m-%d} "
                "(UTC), the latest time the queue stores; pass a shorter time, or none "
                "for a job that never expires."
            )
        expires_at = now + timedelta(seconds=seconds)
    assert expires_at is not None
    if expires_at <= run_at:
        raise ValueError(
            f"expires={_shown_time(expires)} is not after the job is due "
            f"({run_at.isoformat()}): it could never start. Expire it later, or make it "
            "due sooner (delay=/run_at=)."
        )
    return expires_at


def _shown_time(value: float | timedelta | datetime) -> str:
    return value.isoformat() if isinstance(value, datetime) else repr(value)


def job_values(
    task: str,
    payload: str,
    options: EnqueueOptions,
    *,
    default_max_attempts: int,
    now: datetime,
    machinery: Machinery = NO_MACHINERY,
) -> JobRow:
    """The full row for a new job; ``options`` must already carry the task's defaults.

    :raises ValueError: the job would be due at a time the queue cannot store.
    """
    run_at = due_time(options, now)
    # A batch's id only where there is one: the row of a job in no batch is the same as
    # before batches (and the same statement, cached once). The same for an expiry.
    batch_id = machinery.batch_id
    batch: JobRow = {} if batch_id is None else {"batch_id": batch_id}
    if options.expires is not None:
        batch["expires_at"] = expiry_time(options, now, run_at)
    # Likewise a unique key (core/features/uniqueness.py), only where there is one.
    if machinery.unique_key is not None:
        batch["unique_key"] = machinery.unique_key
    # The same for tags and metadata: a job without them writes no more than before.
    labels = _tags.row_values(cast("tuple[str, ...] | None", options.tags), options.meta)
    return {
        **batch,
        **labels,
        "queue": options.queue or "default",
        "task": task,
        "payload": payload,
        "status": JobStatus.PENDING.value,
        "attempts": 0,
        "max_attempts": options.max_attempts or default_max_attempts,
        "rescues": 0,
        "releases": 0,
        "priority": options.priority or 0,
        "run_at": run_at,
        "created_at": now,
        "updated_at": now,
        "idempotency_key": options.idempotency_key,
        # Each call's own, from its arguments (``.producing.Encoded``, features/limits.py).
        "concurrency_key": None,
    }


@dataclass(frozen=True, slots=True)
class Call:
    """One job for :meth:`Task.enqueue_many`: its arguments, and its own idempotency key.

    ``send.enqueue_many([Call(["a@example.com", 1]), Call(kwargs={"email": "b@example.com",
    "report_id": 2}, idempotency_key="report-2")])``. A plain ``(args, kwargs)`` tuple
    works too where no key is needed.
    """

    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: At most one job per key, as ``.using(idempotency_key=...)`` gives one call.
    idempotency_key: str | None = None


#: What ``enqueue_many`` takes for each job.
CallLike = Call | tuple[Sequence[Any], Mapping[str, Any]]


# -- the arguments against the task's signature --------------------------------------------


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """The signature calls of ``fn`` are checked against; ``None`` if it has none to
    read (some builtins), and then any call is let through."""
    try:
        return inspect.signature(fn)
    except ValueError:
        return None


def misfit(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str | None:
    """Why a function with ``signature`` could not be called with these arguments
    (``"missing a required argument: 'b'"``), or ``None`` if it could."""
    if signature is None:
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return None


#: Options that change nothing (``EnqueueOptions.merged`` returns what it merges into).
_NO_OPTIONS = EnqueueOptions()

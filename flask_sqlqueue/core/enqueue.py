"""Turning a call into a job row: option checks, run_at math, the insert-once write."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session

from ..exceptions import PayloadError
from .models import JobStatus
from .payload import encode_payload

_QUEUE_NAME = re.compile(r"[\w.:-]{1,100}")
_INT32 = 2**31


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """Per-call options; ``None`` means "the task's default"."""

    queue: str | None = None
    priority: int | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    session: Session | scoped_session[Any] | Connection | None = None
    #: The key a task's ``concurrency_key`` gave for this call's arguments (limits.py).
    concurrency_key: str | None = None

    def __post_init__(self) -> None:
        check_options(
            queue=self.queue,
            priority=self.priority,
            max_attempts=self.max_attempts,
        )
        if self.delay is not None and self.run_at is not None:
            raise ValueError("Pass delay or run_at, not both.")
        if self.delay is not None:
            _delay_seconds(self.delay)
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise TypeError(f"run_at must be a datetime, got {self.run_at!r}.")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise ValueError(
                    f"run_at={self.run_at!r} has no timezone; pass an aware datetime "
                    "such as datetime.now(UTC) + timedelta(...)."
                )
        key = self.idempotency_key
        if key is not None:
            check_key(key, "idempotency_key")
        if self.session is not None and not isinstance(
            self.session, Session | scoped_session | Connection
        ):
            raise TypeError(
                "session must be a SQLAlchemy Session (or a scoped_session such as "
                f"Flask-SQLAlchemy's db.session) or Connection, got {self.session!r}."
            )

    def merged(self, other: EnqueueOptions) -> EnqueueOptions:
        """These options with every value ``other`` sets taking precedence."""
        values = {
            name: getattr(other, name) if getattr(other, name) is not None else getattr(self, name)
            for name in self.__dataclass_fields__
        }
        if other.delay is not None:
            values["run_at"] = None
        if other.run_at is not None:
            values["delay"] = None
        return EnqueueOptions(**values)


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
    if not isinstance(key, str) or not 1 <= len(key) <= 255 or "\x00" in key:
        raise ValueError(f"{what}={key!r} must be a string of 1-255 characters without NUL.")
    return key


def check_task_name(name: object) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 255:
        raise ValueError(f"Task name {name!r} must be a string of 1-255 characters.")
    return name


def _delay_seconds(delay: float | timedelta) -> float:
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise TypeError(f"delay={delay!r} must be seconds or a timedelta.")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"delay={delay!r} must be zero or more seconds.")
    return seconds


def job_values(
    task: str,
    payload: str,
    options: EnqueueOptions,
    *,
    default_max_attempts: int,
    now: datetime,
) -> dict[str, Any]:
    """The full row for a new job; ``options`` must already carry the task's defaults."""
    if options.run_at is not None:
        run_at = options.run_at
    elif options.delay is not None:
        run_at = now + timedelta(seconds=_delay_seconds(options.delay))
    else:
        run_at = now
    return {
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
        "concurrency_key": options.concurrency_key,
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

#: ``(args, kwargs) -> concurrency key``: a task's limit key for one call's arguments.
LimitKey = Callable[[tuple[Any, ...], dict[str, Any]], "str | None"]


def encode_calls(
    calls: Iterable[CallLike], limit_key: LimitKey | None = None
) -> list[tuple[str, str | None, str | None]]:
    """Check and encode every call before anything is written: ``(payload, idempotency
    key, concurrency key)`` each. The first bad call raises, naming its index."""
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
        raise TypeError(
            f"enqueue_many takes a list of calls, each Call(args, kwargs) or an "
            f"(args, kwargs) tuple; got {calls!r}."
        )
    encoded = []
    for index, item in enumerate(calls):
        where = f"calls[{index}]"
        if isinstance(item, Call):
            args, kwargs, key = item.args, item.kwargs, item.idempotency_key
        elif isinstance(item, tuple) and len(item) == 2:
            (args, kwargs), key = item, None
        else:
            raise TypeError(
                f"{where} = {item!r} is not a call: pass Call(args, kwargs) or an "
                "(args, kwargs) tuple."
            )
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(f"{where}: args must be a list of arguments, got {args!r}.")
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"{where}: kwargs must be a dict of keyword arguments, got {kwargs!r}.")
        if key is not None:
            try:
                check_key(key, "idempotency_key")
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        try:
            payload = encode_payload(args, kwargs)
        except PayloadError as exc:
            # The same error (a TypeError or ValueError), saying which call it is.
            exc.path = f"{where}.{exc.path}"
            exc.args = (f"{where}: {exc.args[0]}",)
            raise
        limit = None if limit_key is None else limit_key(tuple(args), dict(kwargs))
        encoded.append((payload, key, limit))
    return encoded

"""Turning a call into a job row: option checks, run_at math, the insert-once write."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session

from .models import JobStatus

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
    }

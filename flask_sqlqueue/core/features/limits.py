"""Concurrency and rate limits, per task or per task and key.

``@queue.task(concurrency=1, concurrency_key=lambda account_id, **_: account_id)``: at
most one job per account runs at once, across every worker on every host.
``rate_limit=(10, 60)``: at most ten starts per minute (per key with a key function).

The key is computed once, at enqueue, from the job's arguments, and stored in
``jobs.concurrency_key``. A task with its key is a *bucket*; each bucket has a row in
``sqlqueue_limits`` that the claim locks before it counts the bucket's running jobs, so
two workers never both take the same free slot (see ``claim.py``). The same row
keeps a rate limit's fixed window: the window's start, aligned to a multiple of the
period since the Unix epoch, and the number of starts in it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...exceptions import ConfigurationError
from ..models import JobStatus
from ..models import jobs
from ..models import limits as limits_table

#: A task, and the key its function gave (``None`` for a limit on the whole task).
Bucket = tuple[str, str | None]

_MAX_NAME = 255
_INT32 = 2**31
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class TaskLimits:
    """A task's limits, checked when the task is declared.

    :param concurrency: at most this many of its jobs (per key) run at once.
    :param rate: at most this many of its jobs (per key) start per ``period`` seconds.
    :param key: ``(*args, **kwargs) -> str | int``, called at enqueue with the job's
        arguments; each value is a limit of its own.
    """

    concurrency: int | None = None
    rate: int | None = None
    period: float | None = None
    key: Callable[..., object] | None = None

    @classmethod
    def declare(
        cls,
        *,
        concurrency: int | None = None,
        concurrency_key: Callable[..., object] | None = None,
        rate_limit: tuple[int, float | timedelta] | None = None,
    ) -> TaskLimits | None:
        """The limits ``@queue.task`` was given, or ``None``; a clear error if invalid."""
        if concurrency is not None and (
            type(concurrency) is not int or not 1 <= concurrency < _INT32
        ):
            raise ConfigurationError(
                f"concurrency={concurrency!r} must be a whole number of 1 or more."
            )
        rate = period = None
        if rate_limit is not None:
            rate, period = _rate_limit(rate_limit)
        if concurrency_key is not None:
            if not callable(concurrency_key):
                raise ConfigurationError(
                    f"concurrency_key={concurrency_key!r} must be a function of the task's "
                    "arguments, like lambda account_id, **_: account_id."
                )
            if concurrency is None and rate is None:
                raise ConfigurationError(
                    "concurrency_key limits nothing on its own: give concurrency=N "
                    "and/or rate_limit=(N, seconds) too."
                )
        if concurrency is None and rate is None:
            return None
        return cls(concurrency=concurrency, rate=rate, period=period, key=concurrency_key)

    def key_for(self, task: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
        """The key of a job with these arguments (``None`` without a key function).

        :raises ValueError: the key function raised (the job is not written).
        :raises TypeError: it returned something other than a ``str`` or an ``int``.
        """
        if self.key is None:
            return None
        try:
            value = self.key(*args, **kwargs)
        except Exception as exc:
            raise ValueError(
                f"concurrency_key of task {task!r} failed for args={args!r} "
                f"kwargs={dict(kwargs)!r}: {exc!r}; nothing was enqueued."
            ) from exc
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise TypeError(
                f"concurrency_key of task {task!r} returned {value!r}; it must return a "
                "str or an int. Nothing was enqueued."
            )
        return storable_key(str(value))

    def describe(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate} per {_seconds(self.period)}")
        return ", ".join(parts) + (" per key" if self.key is not None else "")


def _rate_limit(value: object) -> tuple[int, float]:
    form = "rate_limit must be (starts, period) such as (10, 60) or (10, timedelta(minutes=1))"
    if not isinstance(value, tuple) or len(value) != 2:
        raise ConfigurationError(f"{form}, got {value!r}.")
    rate, period = value
    if type(rate) is not int or not 1 <= rate < _INT32:
        raise ConfigurationError(f"{form}; starts={rate!r} must be a whole number of 1 or more.")
    if isinstance(period, timedelta):
        seconds = period.total_seconds()
    elif isinstance(period, int | float) and not isinstance(period, bool):
        seconds = float(period)
    else:
        raise ConfigurationError(f"{form}; period={period!r} must be seconds or a timedelta.")
    if not math.isfinite(seconds) or not 0.001 <= seconds <= 366 * 86400:
        raise ConfigurationError(f"{form}; period={period!r} must be from 1 millisecond to a year.")
    return rate, seconds


def storable_key(key: str) -> str:
    """``key`` as stored: as is if it fits, else a hash (over 255 characters, NUL, or
    text no database can store)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return _hashed(key)
    return key if len(key) <= _MAX_NAME and "\x00" not in key else _hashed(key)


def _hashed(text: str) -> str:
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def bucket_name(bucket: Bucket) -> str:
    """The bucket's row name in ``sqlqueue_limits``: the task name, or the task name and
    the key joined by the unit separator (which no sensible task name contains)."""
    task, key = bucket
    name = task if key is None else f"{task}\x1f{key}"
    return name if len(name) <= _MAX_NAME else _hashed(name)


def window_start(moment: datetime, period: float) -> datetime:
    """The start of the fixed window holding ``moment``: windows are aligned to whole
    multiples of ``period`` since the Unix epoch, to the microsecond."""
    micros = (moment - _EPOCH) // _MICRO
    size = max(round(period * 1_000_000), 1)
    return _EPOCH + (micros - micros % size) * _MICRO


def bucket_of(task: str, key: str | None, limits: TaskLimits) -> Bucket:
    """A job's bucket: its key counts only for a task with a key function."""
    return (task, key if limits.key is not None else None)


def bucket_where(bucket: Bucket, limits: TaskLimits) -> Any:
    """The jobs of ``bucket``, as a WHERE clause."""
    task, key = bucket
    if limits.key is None:
        return jobs.c.task == task
    if key is None:  # enqueued by a producer that does not register the task
        return sa.and_(jobs.c.task == task, jobs.c.concurrency_key.is_(None))
    # IS NOT NULL keeps the clause FALSE, never NULL, for a job without a key: the claim
    # negates these clauses, and NOT NULL would leave such a job out for good.
    return sa.and_(
        jobs.c.task == task, jobs.c.concurrency_key.is_not(None), jobs.c.concurrency_key == key
    )


def running_counts(
    conn: Connection, buckets: list[Bucket], limited: Mapping[str, TaskLimits]
) -> dict[Bucket, int]:
    """Running jobs in each of ``buckets``: one grouped count on the
    (task, concurrency_key, status) index."""
    counts: dict[Bucket, int] = dict.fromkeys(buckets, 0)
    if not buckets:
        return counts
    rows = conn.execute(
        sa.select(jobs.c.task, jobs.c.concurrency_key, sa.func.count())
        .where(
            jobs.c.status == JobStatus.RUNNING.value,
            sa.or_(*(bucket_where(b, limited[b[0]]) for b in buckets)),
        )
        .group_by(jobs.c.task, jobs.c.concurrency_key)
    )
    for task, key, n in rows:
        bucket = bucket_of(task, key, limited[task])
        if bucket in counts:
            counts[bucket] += int(n)
    return counts


def rate_rows(conn: Connection, buckets: list[Bucket]) -> dict[str, Any]:
    """The ``sqlqueue_limits`` rows of ``buckets`` that exist, by name (no lock)."""
    if not buckets:
        return {}
    names = [bucket_name(b) for b in buckets]
    rows = conn.execute(sa.select(limits_table).where(limits_table.c.name.in_(names)))
    return {row.name: row for row in rows}


def free_slots(
    bucket: Bucket,
    limits: TaskLimits,
    running: Mapping[Bucket, int],
    rows: Mapping[str, Any],
    start: datetime,
) -> int:
    """How many more jobs of ``bucket`` may start at ``start``."""
    free = math.inf
    if limits.concurrency is not None:
        free = limits.concurrency - running.get(bucket, 0)
    if limits.rate is not None:
        assert limits.period is not None
        free = min(
            free, limits.rate - starts_in_window(rows.get(bucket_name(bucket)), limits, start)
        )
    return int(max(free, 0))


def starts_in_window(row: Any, limits: TaskLimits, start: datetime) -> int:
    """Starts already counted in the window holding ``start``."""
    assert limits.period is not None
    if row is None or row.window_start is None:
        return 0
    return int(row.starts) if row.window_start >= window_start(start, limits.period) else 0


# -- what `flask queue status` and the admin show -----------------------------------------


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """One limited task, or one key of it, as it is now.

    For a task with a key function only keys with running jobs are listed; with none,
    the task is listed once with ``key=None`` and ``idle=True``.
    """

    task: str
    key: str | None
    limits: TaskLimits
    running: int
    #: Starts in the current rate window, or ``None`` without a rate limit.
    starts: int | None
    idle: bool = False

    @property
    def label(self) -> str:
        if self.limits.key is None:
            return self.task
        return f"{self.task} (per key)" if self.idle else f"{self.task} [{self.key}]"

    @property
    def summary(self) -> str:
        if self.idle:
            return f"{self.limits.describe()}; no key has a running job"
        parts = []
        if self.limits.concurrency is not None:
            parts.append(f"running {self.running}/{self.limits.concurrency}")
        else:
            parts.append(f"running {self.running}")
        if self.limits.rate is not None:
            parts.append(
                f"started {self.starts or 0}/{self.limits.rate} "
                f"in this {_seconds(self.limits.period)} window"
            )
        return ", ".join(parts)


def describe(
    conn: Connection, registry: Mapping[str, Any], now: datetime, *, max_keys: int = 20
) -> list[BucketStatus]:
    """The buckets of every limited task in ``registry``: the whole task for a task
    without a key function; for one with, each key that has running jobs (at most
    ``max_keys`` per task, busiest first)."""
    found: list[BucketStatus] = []
    for name in sorted(registry):
        limits: TaskLimits | None = getattr(registry[name], "limits", None)
        if limits is None:
            continue
        if limits.key is None:
            buckets: list[Bucket] = [(name, None)]
        else:
            keys = conn.execute(
                sa.select(jobs.c.concurrency_key)
                .where(jobs.c.task == name, jobs.c.status == JobStatus.RUNNING.value)
                .group_by(jobs.c.concurrency_key)
                .order_by(sa.func.count().desc(), jobs.c.concurrency_key)
                .limit(max_keys)
            ).scalars()
            buckets = [(name, key) for key in keys]
        if not buckets:
            found.append(BucketStatus(name, None, limits, 0, None, idle=True))
            continue
        running = running_counts(conn, buckets, {name: limits})
        rows = rate_rows(conn, buckets) if limits.rate is not None else {}
        for bucket in buckets:
            starts = (
                starts_in_window(rows.get(bucket_name(bucket)), limits, now)
                if limits.rate is not None
                else None
            )
            found.append(BucketStatus(name, bucket[1], limits, running[bucket], starts))
    return found


def _seconds(period: float | None) -> str:
    if period is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if period >= size and period % size == 0:
            return f"{period / size:g} {unit}"
    return f"{period:g} s"

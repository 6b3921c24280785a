"""The :class:`Job` users see: a plain snapshot of one row, re-read with :meth:`Job.refresh`,
or waited for with :meth:`Job.wait` until it finishes; and :func:`read_rows`, which reads
rows of jobs for it and for the lists, a row edited by hand into values that cannot be
read among them."""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from types import SimpleNamespace
from typing import Any
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..bounds import positive_seconds
from .features.bigpayloads import full
from .features.tags import read_meta
from .features.tags import read_tags
from .models import JobStatus
from .models import UTCDateTime
from .models import jobs
from .payload import decode_call
from .payload import decode_value


@dataclass(eq=False)
class Job:
    """One job as it was when read. Not live: call :meth:`refresh` to see changes."""

    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    #: A :class:`JobStatus`, or the raw text if the row holds a status this version
    #: does not know (edited by hand).
    status: JobStatus | str
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker_id: str | None = None
    last_error: str | None = None
    result: Any = None
    idempotency_key: str | None = None
    #: One dict per failed attempt: ``attempt``, ``type``, ``message``, ``traceback``,
    #: ``worker``, ``at``.
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Attempts taken back from a worker found lost (rescued) since the job was enqueued
    #: or last replayed.
    rescues: int = 0
    #: Its crash budget spent: the rescues whose worker never reported in again (a
    #: worker that was only paused takes its rescue back); at ``SQLQUEUE_MAX_CRASHES``
    #: the job is quarantined (docs/outcomes.md).
    crashes: int = 0
    releases: int = 0
    #: When cancellation of the running job was asked for (it stops if its task checks).
    cancel_requested_at: datetime | None = None
    #: The task's own report: a fraction from 0 to 1, and a short message.
    progress: float | None = None
    progress_message: str | None = None
    #: Why ``args``/``kwargs`` are empty, when the stored payload could not be decoded.
    payload_error: str | None = None
    #: The columns of a row edited by hand that hold what no timestamp can be, each
    #: with the text it holds, as ``{"run_at": "1999 by hand"}``; those attributes are
    #: ``None`` (:func:`read_rows`, docs/inspecting.md). ``{}`` for any other row.
    unreadable: dict[str, str] = field(default_factory=dict)
    #: The batch it is a member or a callback of (docs/workflows.md), if any.
    batch_id: int | None = None
    #: Its tags (docs/tags.md): its task's, then those given at enqueue.
    tags: list[str] = field(default_factory=list)
    #: The metadata given at enqueue (docs/tags.md); empty for none.
    meta: dict[str, Any] = field(default_factory=dict)
    #: When it stops being worth starting: no attempt starts after it (docs/expiry.md).
    expires_at: datetime | None = None
    #: Times its task raised ``Snooze`` (attempts it gave back to run later).
    snoozes: int = 0
    #: The version of its task its arguments were written for (docs/versions.md).
    version: int = 1
    #: The key it was enqueued with ``unique=`` under (docs/uniqueness.md), while it
    #: holds it: an enqueue that found it out of its scope clears it.
    unique_key: str | None = None
    _source: JobSource | None = field(default=None, repr=False)

    @classmethod
    def inserted(cls, job_id: int, values: Mapping[str, Any], source: JobSource) -> Job:
        """The job just inserted with ``values`` (its columns), without reading it back.
        Its payload was encoded from checked JSON: it decodes."""
        args, kwargs, version = decode_call(values["payload"])
        return cls(
            id=job_id,
            queue=values["queue"],
            task=values["task"],
            args=args,
            kwargs=kwargs,
            status=JobStatus(values["status"]),
            attempts=values["attempts"],
            max_attempts=values["max_attempts"],
            priority=values["priority"],
            run_at=values["run_at"],
            created_at=values["created_at"],
            updated_at=values["updated_at"],
            idempotency_key=values["idempotency_key"],
            rescues=values["rescues"],
            # crashes: its server default, 0, like every column added since 0004.
            releases=values["releases"],
            # A job that starts ended (a dependency already dead) has these.
            finished_at=values.get("finished_at"),
            last_error=values.get("last_error"),
            batch_id=values.get("batch_id"),
            tags=read_tags(values.get("tags")),
            meta=read_meta(values.get("meta")),
            expires_at=values.get("expires_at"),
            version=version,
            unique_key=values.get("unique_key"),
            _source=source,
        )

    @classmethod
    def from_row(cls, row: Any, source: JobSource | None = None) -> Job:
        payload_error = None
        try:
            args, kwargs, version = decode_call(row.payload)
        except ValueError as exc:
            args, kwargs, version = [], {}, 1
            payload_error = f"malformed payload: {exc}"
        try:
            status: JobStatus | str = JobStatus(row.status)
        except ValueError:
            status = row.status
        return cls(
            id=row.id,
            queue=row.queue,
            task=row.task,
            args=args,
            kwargs=kwargs,
            status=status,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            priority=row.priority,
            run_at=row.run_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            worker_id=row.worker_id,
            last_error=row.last_error,
            result=_decode_or_text(row.result),
            idempotency_key=row.idempotency_key,
            errors=_decode_or_text(row.errors) or [],
            rescues=row.rescues,
            crashes=row.crashes,
            releases=row.releases,
            # A just-inserted job (not read back) has none of these yet.
            cancel_requested_at=getattr(row, "cancel_requested_at", None),
            progress=getattr(row, "progress", None),
            progress_message=getattr(row, "progress_message", None),
            payload_error=payload_error,
            unreadable=getattr(row, "unreadable", None) or {},
            batch_id=getattr(row, "batch_id", None),
            tags=read_tags(getattr(row, "tags", None)),
            meta=read_meta(getattr(row, "meta", None)),
            expires_at=getattr(row, "expires_at", None),
            snoozes=getattr(row, "snoozes", 0),
            version=version,
            unique_key=getattr(row, "unique_key", None),
            _source=source,
        )

    def refresh(self) -> Job:
        """Re-read this job from the database, in place; returns ``self``.

        :raises LookupError: the job no longer exists (it was deleted or purged).
        """
        fresh = self._queue().get_job(self.id)
        if fresh is None:
            raise LookupError(f"Job {self.id} no longer exists.")
        return self._take(fresh)

    def wait(self, timeout: float | None = None, *, poll_interval: float = 1.0) -> Job:
        """Wait until this job is ``completed``, ``dead`` or ``cancelled``; then return it
        refreshed (``self``, re-read in place). Needs no app context.

        The write that finishes a job wakes its waiters at once: PostgreSQL's NOTIFY on
        any host, a datagram on this host for SQLite and MariaDB. The database is also
        rechecked every ``poll_interval`` seconds, which is how a waiter on another
        host than a MariaDB worker sees its job finished (docs/workflows.md).

        :param timeout: seconds to wait at most; ``None`` waits for as long as it takes.
        :param poll_interval: seconds between two rechecks of the database.
        :raises TimeoutError: the job has not finished after ``timeout`` seconds.
        :raises LookupError: the job no longer exists (it was deleted).
        :raises ValueError: ``timeout`` is negative or not a number, or
            ``poll_interval`` is not a positive number.
        """
        timeout, poll_interval = _wait_options(timeout, poll_interval)
        fresh = self._queue().wait_finished(self.id, timeout, poll_interval)
        assert fresh is not None  # only an abandoned wait returns None
        return self._take(fresh)

    async def async_wait(self, timeout: float | None = None, *, poll_interval: float = 1.0) -> Job:
        """:meth:`wait` for asyncio code: ``job = await job.async_wait(30)``.

        The event loop is not blocked: the wait runs on a thread of its own (not the
        loop's default executor, whose few threads long waits would all hold), in a copy
        of the caller's context (its Flask app context and context variables). If the
        awaiting task is cancelled, the thread stops waiting at its next wake-up or
        recheck of the database.
        """
        timeout, poll_interval = _wait_options(timeout, poll_interval)
        source = self._queue()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Job | None] = loop.create_future()
        wake, abandon = threading.Event(), threading.Event()

        def settle(value: Job | None, error: BaseException | None) -> None:
            if future.done():
                return  # cancelled meanwhile
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def wait() -> None:
            value, error = None, None
            try:
                value = source.wait_finished(
                    self.id, timeout, poll_interval, wake=wake, abandon=abandon
                )
            except BaseException as exc:
                error = exc
            try:
                loop.call_soon_threadsafe(settle, value, error)
            except RuntimeError:
                pass  # the loop is closed: nobody awaits this any more

        context = contextvars.copy_context()
        threading.Thread(
            target=context.run, args=(wait,), name=f"sqlqueue-wait-{self.id}", daemon=True
        ).start()
        try:
            fresh = await future
        finally:
            abandon.set()
            wake.set()
        assert fresh is not None
        return self._take(fresh)

    def _queue(self) -> JobSource:
        if self._source is None:
            raise RuntimeError("This Job was not read from a queue and cannot be re-read.")
        return self._source

    def _take(self, fresh: Job) -> Job:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        return self


class JobSource(Protocol):
    """Where a :class:`Job` is re-read and waited for: the queue's store."""

    def get_job(self, job_id: int) -> Job | None: ...

    def wait_finished(
        self,
        job_id: int,
        timeout: float | None,
        poll_interval: float,
        *,
        wake: threading.Event | None = None,
        abandon: threading.Event | None = None,
    ) -> Job | None: ...


def _wait_options(timeout: object, poll_interval: object) -> tuple[float | None, float]:
    """``timeout`` and ``poll_interval`` of a wait, checked."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}.")
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(
                f"timeout must be 0 or more seconds (None waits for as long as it takes); "
                f"got {timeout!r}."
            )
    poll = positive_seconds(poll_interval, "poll_interval", "1.0")
    return (None if timeout is None else float(timeout)), poll


#: What decoding a column value that no timestamp can be raises: SQLite's text (a
#: ValueError), a zero date from MariaDB (text, which ``UTCDateTime`` fails on), a year
#: past 9999 or infinity from PostgreSQL (the driver's DataError, raised for the rows
#: fetched with it).
UNDECODABLE = (ValueError, TypeError, AttributeError, sa.exc.DataError)


def read_whole(conn: Connection, query: sa.Select[Any]) -> list[Any]:
    """:func:`read_rows` of whole rows of ``sqlqueue_jobs``, each payload kept outside
    its row put back (:func:`.features.bigpayloads.full`: one more SELECT, only if any is)."""
    return full(conn, read_rows(conn, query))


def read_rows(conn: Connection, query: sa.Select[Any]) -> Sequence[Any]:
    """The rows of ``query``, a SELECT of columns of ``sqlqueue_jobs`` (``id`` among them).

    A timestamp edited by hand into something no ``datetime`` holds fails the whole
    read. Then the rows are read one by one: each that still fails comes back as an
    :class:`UnreadableRow`, that column ``None`` and its text in ``unreadable`` (which
    :class:`Job` and the lists take), and every other row as usual. A failure that is
    not a column of the jobs' timestamps is raised.
    """
    try:
        return conn.execute(query).all()
    except UNDECODABLE as exc:
        failure = exc
    found = []
    for job_id in conn.execute(query.with_only_columns(jobs.c.id)).scalars().all():
        one = query.where(jobs.c.id == job_id)
        try:
            row = conn.execute(one).first()
        except UNDECODABLE:
            row = _unreadable_row(conn, one, failure)
        if row is not None:  # None: deleted meanwhile
            found.append(row)
    return found


def _unreadable_row(conn: Connection, one: sa.Select[Any], failure: Exception) -> Any:
    """The one row of ``one`` that cannot be read as it is: its timestamps read as text,
    then each as itself, to find those that fail."""
    columns = list(one.selected_columns)
    stamps = {c.key for c in columns if isinstance(c.type, UTCDateTime)}
    as_text = [sa.cast(c, sa.String).label(c.key) if c.key in stamps else c for c in columns]
    row = conn.execute(one.with_only_columns(*as_text)).first()
    if row is None:
        return None
    values, unreadable = dict(row._mapping), {}
    for column in columns:
        if column.key in stamps:
            try:
                values[column.key] = conn.execute(one.with_only_columns(column)).scalar()
            except UNDECODABLE:
                unreadable[column.key], values[column.key] = values[column.key], None
    if not unreadable:
        raise failure
    return UnreadableRow(**values, unreadable=unreadable)


class UnreadableRow(SimpleNamespace):
    """A row of :func:`read_rows` with columns that cannot be read: read by attribute or
    through ``_mapping``, as a row is."""

    @property
    def _mapping(self) -> dict[str, Any]:
        return vars(self)

    def _asdict(self) -> dict[str, Any]:
        return dict(vars(self))


def unreadable_note(columns: Mapping[str, str]) -> str:
    """How columns that cannot be read are shown: ``unreadable: run_at holds 'x'``."""
    return "unreadable: " + ", ".join(f"{name} holds {text!r}" for name, text in columns.items())


def _decode_or_text(text: str | None) -> Any:
    try:
        return decode_value(text)
    except ValueError:
        return text


class ClaimedJob(Protocol):
    """A job as a claim returns it (the claim's own row, read by attribute; never
    copied): what a worker needs to run one attempt of it."""

    @property
    def id(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def payload(self) -> str: ...
    #: The attempt this claim started (counted at the claim).
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def idempotency_key(self) -> str | None: ...
    #: Fences every write that finishes this attempt.
    @property
    def claim_token(self) -> str: ...
    #: No attempt starts after it: the worker ends the job instead (docs/expiry.md).
    @property
    def expires_at(self) -> datetime | None: ...
    #: Times the task snoozed (``current_job.snoozes``).
    @property
    def snoozes(self) -> int: ...

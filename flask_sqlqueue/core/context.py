"""``current_job``: what a running task knows about itself, kept in a ``ContextVar``."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Any

import sqlalchemy as sa

from ..exceptions import ClaimLost
from ..exceptions import JobCancelled
from ..exceptions import NoJobContext
from . import transitions
from .failures import storable_text
from .features import dependencies
from .features.tags import labels
from .options import check_key
from .transitions import holds_claim

if TYPE_CHECKING:
    from .store import Store


log = logging.getLogger("flask_sqlqueue.worker")

#: Seconds between two reads of a job's cancel request, however often a task asks.
CANCEL_CHECK_INTERVAL = 1.0
#: Seconds between two progress writes of one job; values set in between are coalesced
#: and the latest is written when the interval ends (or when the task returns).
PROGRESS_INTERVAL = 1.0
#: Longest progress message kept; a longer one is cut, never refused.
MAX_PROGRESS_MESSAGE = 1000


@dataclass(slots=True, eq=False)
class _Live:
    """The mutable part of a running job's context: cancel and progress throttles."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Serialises progress writes, so the value taken last is also written last.
    write_lock: threading.Lock = field(default_factory=threading.Lock)
    cancel_seen: bool = False
    cancel_checked_at: float = -math.inf
    progress_written_at: float = -math.inf
    progress_pending: tuple[float, str | None] | None = None
    progress_timer: threading.Timer | None = None
    closed: bool = False
    #: The results of the job's dependencies, once read (they no longer change).
    dependency_results: Mapping[int, Any] | None = None
    #: The job's tags and metadata, once read (they never change).
    labels: tuple[tuple[str, ...], Mapping[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class JobContext:
    """The attempt a task is running in."""

    id: int
    task: str
    queue: str
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    worker_id: str
    claim_token: str
    store: Store
    #: Times the job snoozed before this attempt (``raise Snooze(...)``): a task that
    #: waits for something may give up after enough of them.
    snoozes: int = 0
    _live: _Live = field(default_factory=_Live, repr=False, compare=False)

    def reserve_effect(self, key: str | None = None) -> bool:
        """Record ``key`` as done by this job; ``True`` only for the first caller ever.

        Guard each external side effect with it: ``if current_job.reserve_effect("mail:42"):
        send()``. The reservation is committed before this returns, and only while this
        attempt still owns the job.

        :param key: 1-255 characters; ``None`` means the job's ``idempotency_key``.
        :raises ValueError: no key was given and the job has no idempotency key.
        :raises ClaimLost: the job was taken from this attempt (for example rescued).
        """
        key = self._effect_key(key, "reserve_effect")
        store = self.store

        def reserve(conn: object) -> bool:
            if not holds_claim(conn, self.id, self.claim_token):  # type: ignore[arg-type]
                raise ClaimLost(self.id)
            return store.ops.insert_effect(conn, key, self.id, store.now())  # type: ignore[arg-type]

        return bool(store.run_write(reserve))

    @contextmanager
    def effect(self, key: str | None = None) -> Iterator[bool]:
        """Reserve ``key`` as :meth:`reserve_effect` does, and mark it done when the block
        exits without an exception::

            with current_job.effect(f"mail:{order_id}") as first:
                if first:
                    send_receipt(order_id)

        ``first`` is ``True`` only for the first caller ever, as :meth:`reserve_effect`
        returns. Only that caller's block marks the effect done. A block that raises, or
        an attempt lost with its worker, leaves the reservation of unknown outcome: the
        dead-letter views (``flask queue show``, the admin) then say to reconcile before
        a replay, since the replay will not repeat it.

        :param key: 1-255 characters; ``None`` means the job's ``idempotency_key``.
        :raises ValueError: no key was given and the job has no idempotency key.
        :raises ClaimLost: the job was taken from this attempt before the reservation.
        """
        key = self._effect_key(key, "effect")
        first = self.reserve_effect(key)
        yield first
        if first:
            # Not fenced by the claim: the effect happened whoever owns the job now.
            now = self.store.now()
            self.store.run_write(lambda conn: transitions.mark_effect_done(conn, key, self.id, now))

    def _effect_key(self, key: str | None, method: str) -> str:
        if key is None:
            if self.idempotency_key is None:
                raise ValueError(
                    f"Job {self.id} has no idempotency_key; pass {method}(key) explicitly."
                )
            key = self.idempotency_key
        check_key(key, "effect key")
        return key

    # -- dependencies -----------------------------------------------------------------------

    @property
    def dependency_results(self) -> Mapping[int, Any]:
        """The result of each job this one depends on (``depends_on``), by job id: what
        each returned, as JSON gave it back. Read from the database the first time it
        is asked for, then kept: a dependency's result never changes once it completed.

        Empty for a job without dependencies. A dependency purged since it completed
        (``SQLQUEUE_KEEP_COMPLETED``, ``flask queue purge``) is missing from it.
        """
        live = self._live
        with live.lock:
            found = live.dependency_results
        if found is None:
            with self.store.read() as conn:
                found = MappingProxyType(dependencies.results(conn, self.id))
            with live.lock:
                live.dependency_results = found
        return found

    # -- tags and metadata ------------------------------------------------------------------

    @property
    def tags(self) -> list[str]:
        """The job's tags (docs/tags.md): its task's, then those given at enqueue. Read
        from the database the first time tags or metadata are asked for, then kept."""
        return list(self._labels()[0])

    @property
    def meta(self) -> Mapping[str, Any]:
        """The metadata given at enqueue (docs/tags.md), read-only; empty for none. Read
        as :attr:`tags` is, so a task that never asks costs no read."""
        return self._labels()[1]

    def _labels(self) -> tuple[tuple[str, ...], Mapping[str, Any]]:
        live = self._live
        with live.lock:
            found = live.labels
        if found is None:
            with self.store.read() as conn:
                tags, meta = labels(conn, self.id)
            found = (tuple(tags), MappingProxyType(meta))
            with live.lock:
                live.labels = found
        return found

    # -- cancellation -----------------------------------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        """``True`` once someone asked for this job to be cancelled (``flask queue cancel``,
        the admin). Cheap to check in a loop: the row is read at most once a second.

        Stop early when it is ``True`` (return, or raise :class:`JobCancelled` to have
        the job recorded as ``cancelled``); a task that never checks runs to its end.
        """
        live = self._live
        with live.lock:
            if live.cancel_seen:
                return True
            now = time.monotonic()
            if now - live.cancel_checked_at < CANCEL_CHECK_INTERVAL:
                return False
            live.cancel_checked_at = now
        try:
            with self.store.read() as conn:
                asked = bool(transitions.cancel_requests(conn, [self.id]))
        except sa.exc.SQLAlchemyError as exc:
            log.warning("job=%s: could not read its cancel request: %s", self.id, exc)
            return False
        if asked:
            self.note_cancel_requested()
        return asked

    def note_cancel_requested(self) -> None:
        """Record that a cancel request exists (for a worker that learnt it otherwise)."""
        with self._live.lock:
            self._live.cancel_seen = True

    def raise_if_cancelled(self) -> None:
        """Raise :class:`JobCancelled` if this job's cancellation was asked for.

        The worker then records the job as ``cancelled`` (not a failed attempt).
        """
        if self.cancel_requested:
            raise JobCancelled(self.id)

    # -- progress ---------------------------------------------------------------------------

    def set_progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the task got, shown in ``flask queue show`` and the admin.

        Call it as often as you like: at most one write a second reaches the database,
        and the latest value is always written (at the end of the second, or when the
        task returns).

        :param fraction: from ``0`` to ``1`` (``0.25`` is a quarter done).
        :param message: a short note such as ``"page 3 of 12"``; cut at 1000 characters.
        :raises ValueError: ``fraction`` is not a number from 0 to 1.
        :raises TypeError: ``fraction`` is not a number or ``message`` not a string.
        :raises ClaimLost: the job was taken from this attempt (for example rescued).
        """
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise TypeError(f"progress must be a number from 0 to 1, got {fraction!r}.")
        if not 0.0 <= fraction <= 1.0:  # NaN fails this too
            raise ValueError(f"progress must be a fraction from 0 to 1, got {fraction!r}.")
        if message is not None and not isinstance(message, str):
            raise TypeError(f"progress message must be a string or None, got {message!r}.")
        if message is not None:
            message = storable_text(message[:MAX_PROGRESS_MESSAGE])
        live = self._live
        with live.lock:
            if live.closed:
                return
            live.progress_pending = (float(fraction), message)
            wait = live.progress_written_at + PROGRESS_INTERVAL - time.monotonic()
            if wait > 0:
                if live.progress_timer is None:
                    timer = threading.Timer(wait, self._flush_in_background)
                    timer.name = f"sqlqueue-progress-{self.id}"
                    timer.daemon = True
                    live.progress_timer = timer
                    timer.start()
                return
        self._write_progress()

    def _write_progress(self) -> None:
        """Write the pending progress value, if any. Raises ClaimLost or database errors."""
        live = self._live
        with live.write_lock:
            with live.lock:
                pending, live.progress_pending = live.progress_pending, None
                if pending is None:
                    return
                live.progress_written_at = time.monotonic()
            fraction, message = pending
            done = self.store.run_write(
                lambda conn: transitions.set_progress(
                    conn, self.id, self.claim_token, fraction, message
                ),
                within=2.0,
            )
        if not done:
            raise ClaimLost(self.id)

    def _flush_in_background(self) -> None:
        with self._live.lock:
            self._live.progress_timer = None
        try:
            self._write_progress()
        except ClaimLost:
            pass  # the worker reports the lost claim when the task ends
        except Exception as exc:
            log.warning("job=%s: progress not recorded: %s", self.id, exc)

    def close(self) -> None:
        """Called by the worker when the task has returned: write the latest progress
        value now (a task's last report must not be lost to the throttle)."""
        live = self._live
        with live.lock:
            live.closed = True
            timer, live.progress_timer = live.progress_timer, None
        if timer is not None:
            timer.cancel()
        try:
            self._write_progress()
        except ClaimLost:
            pass
        except Exception as exc:
            log.warning("job=%s: last progress not recorded: %s", self.id, exc)


_current: ContextVar[JobContext | None] = ContextVar("sqlqueue_current_job", default=None)


def get_current() -> JobContext:
    job = _current.get()
    if job is None:
        raise NoJobContext("current_job is only available while a task runs in a worker.")
    return job


class _CurrentJob:
    """A proxy to the running job's :class:`JobContext`."""

    __slots__ = ()

    @property
    def id(self) -> int:
        return get_current().id

    @property
    def task(self) -> str:
        return get_current().task

    @property
    def queue(self) -> str:
        return get_current().queue

    @property
    def attempts(self) -> int:
        """Attempts started so far, this one included."""
        return get_current().attempts

    @property
    def max_attempts(self) -> int:
        return get_current().max_attempts

    @property
    def snoozes(self) -> int:
        """Times the job snoozed before this attempt (``raise Snooze(...)``)."""
        return get_current().snoozes

    @property
    def idempotency_key(self) -> str | None:
        return get_current().idempotency_key

    def reserve_effect(self, key: str | None = None) -> bool:
        return get_current().reserve_effect(key)

    def effect(self, key: str | None = None) -> AbstractContextManager[bool]:
        return get_current().effect(key)

    @property
    def dependency_results(self) -> Mapping[int, Any]:
        """The result of each job this one depends on, by job id (read once, lazily)."""
        return get_current().dependency_results

    @property
    def tags(self) -> list[str]:
        """The job's tags (read once, lazily)."""
        return get_current().tags

    @property
    def meta(self) -> Mapping[str, Any]:
        """The job's metadata, read-only (read once, lazily)."""
        return get_current().meta

    @property
    def cancel_requested(self) -> bool:
        """``True`` once this job's cancellation was asked for (read at most once a second)."""
        return get_current().cancel_requested

    def raise_if_cancelled(self) -> None:
        get_current().raise_if_cancelled()

    def set_progress(self, fraction: float, message: str | None = None) -> None:
        get_current().set_progress(fraction, message)

    def __bool__(self) -> bool:
        return _current.get() is not None

    def __repr__(self) -> str:
        job = _current.get()
        return "<current_job: none>" if job is None else f"<current_job {job.id} {job.task}>"


current_job = _CurrentJob()
for _name in ("reserve_effect", "effect", "raise_if_cancelled", "set_progress"):
    getattr(_CurrentJob, _name).__doc__ = getattr(JobContext, _name).__doc__

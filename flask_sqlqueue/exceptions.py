"""The errors flask_sqlqueue raises, and those that tasks raise to steer retries."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable
from datetime import UTC
from datetime import datetime
from datetime import timedelta

from .bounds import LATEST_RUN_AT
from .bounds import longest_delay

#: Ids an error message names at most; the rest are counted.
IDS_SHOWN = 20


def ids_text(ids: Iterable[object]) -> str:
    """``ids`` for an error message: all of them if few, else the first
    :data:`IDS_SHOWN` and how many in all."""
    listed = list(ids)
    shown = ", ".join(map(str, listed[:IDS_SHOWN]))
    return shown if len(listed) <= IDS_SHOWN else f"{shown}... ({len(listed):,} in all)"


class SQLQueueError(Exception):
    """Root of every error raised by flask_sqlqueue."""


class ConfigurationError(SQLQueueError):
    """The extension or a ``SQLQUEUE_*`` setting is set up wrongly."""


class QueueNotSetUp(ConfigurationError, RuntimeError):
    """The queue's state for an app cannot be found: there is no app, ``init_app`` was
    not called on it, or another ``SQLQueue`` serves it. A ``RuntimeError``, as
    Flask's own "working outside of application context" is."""

    #: The message when there is no app context and no app was passed.
    NO_APP = (
        "Calls to the queue need an app context: make them inside "
        "`with app.app_context():`, or pass app=... where the call takes one."
    )
    #: The message when ``init_app`` was never called on the app.
    NOT_SET_UP = "SQLQueue is not set up on this app; did you forget to call queue.init_app(app)?"
    #: The message when the app is served by another ``SQLQueue`` instance.
    OTHER_QUEUE = (
        "This app is set up with a different SQLQueue instance; use the one that "
        "init_app(app) was called on."
    )


class PayloadError(SQLQueueError, TypeError):
    """An argument or result cannot be stored as JSON that round-trips unchanged."""

    def __init__(self, path: str, value: object, reason: str) -> None:
        self.path = path
        self.value = value
        super().__init__(f"{path} = {_shown(value)} {reason}; job arguments must be plain JSON.")


class PayloadValueError(PayloadError, ValueError):
    """A JSON value the databases would not return unchanged (NaN, NUL characters)."""


class ArgumentTypeError(PayloadError):
    """An argument that does not fit the annotation of its parameter, which decides how it
    is stored (docs/arguments.md): refused at enqueue, and nothing is written."""

    def __init__(self, path: str, value: object, reason: str) -> None:
        self.path = path
        self.value = value
        SQLQueueError.__init__(self, f"{path} = {_shown(value)} {reason}.")


class ArgumentDecodeError(ArgumentTypeError, ValueError):
    """A stored argument that its parameter's annotation cannot turn back into a value:
    the job's attempt is not run, or an enqueue of stored forms is refused."""


class PayloadTooLarge(PayloadValueError):
    """Arguments whose JSON is larger than the database stores in one value: a
    :class:`PayloadError` (so a ``TypeError``) and a ``ValueError``."""

    def __init__(self, size: int, limit: int, where: str) -> None:
        self.path = "arguments"
        self.value = None
        self.size = size
        self.limit = limit
        SQLQueueError.__init__(
            self,
            f"The job's arguments take {size:,} bytes as JSON, over the {limit:,} bytes "
            f"{where} stores in one value; pass ids or file names, not the data itself.",
        )


def _shown(value: object) -> str:
    """``repr(value)`` cut to 80 characters; never raises, and never takes long."""
    if type(value) is int and value.bit_length() > 4096:
        return f"<an int of {value.bit_length():,} bits>"  # its repr may be refused
    if type(value) is str and len(value) > 80:
        value = value[:80]  # repr of the part shown only, however long the text
    try:
        shown = repr(value)
    except Exception:  # a structure too deep to show, or a __repr__ that fails
        shown = f"<{type(value).__name__} object>"
    return shown if len(shown) <= 80 else shown[:77] + "..."


class ResultTooLarge(SQLQueueError, ValueError):
    """A task returned more JSON than the queue's database stores in one value.

    The attempt fails and the job goes ``dead`` at once: its work is done, and running it
    again would repeat that work and, most likely, return as much again.

    :param task: the task's name.
    :param size: bytes of the result's JSON, as the database counts them.
    :param limit: the most bytes the database stores in one value.
    """

    def __init__(self, task: str, size: int, limit: int) -> None:
        self.task = task
        self.size = size
        self.limit = limit
        super().__init__(
            f"task {task} returned {size:,} bytes of JSON; this database stores at most "
            f"{limit:,}; return less, e.g. a reference to where the data is."
        )


class DuplicateTask(ConfigurationError):
    """Two tasks were registered under the same name."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"A task named {name!r} is already registered; pass name=... to tell them apart."
        )


class UnknownTask(SQLQueueError, LookupError):
    """A task name that is not registered with this queue.

    :param known: the names that are registered, to suggest the closest one.
    """

    def __init__(self, name: str, known: Iterable[str] = ()) -> None:
        self.name = name
        by_case = {known_name.casefold(): known_name for known_name in known}
        close = difflib.get_close_matches(name.casefold(), list(by_case), n=1)
        hint = f" (did you mean {by_case[close[0]]!r}?)" if close else ""
        super().__init__(
            f"No task {name!r} is registered in this app{hint}; import the module that "
            "declares it, or pass unregistered=True to enqueue it for a worker that does. "
            "Nothing was enqueued."
        )


class UnknownQueue(SQLQueueError, LookupError):
    """A queue name that no registered task uses and no job is in (likely a typo)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        listed = ", ".join(known) or "none"
        super().__init__(
            f"No queue {name!r}: no registered task uses it and no job is in it "
            f"(known queues: {listed}); nothing was changed."
        )


class UnknownSchedule(SQLQueueError, LookupError):
    """A name that is no periodic task of the app (likely a typo)."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        listed = ", ".join(known) or "none"
        super().__init__(
            f"No schedule {name!r}: no periodic task of this app has that name "
            f"(known schedules: {listed}); nothing was changed."
        )


class InvalidTransition(SQLQueueError, ValueError):
    """An operation that does not apply to a job in its current state (replaying a
    running job, cancelling a finished one...): the whole batch is refused and nothing
    changes. A ``ValueError``, as it was before it joined this tree."""


class UpcastError(SQLQueueError, ValueError):
    """A job's stored arguments cannot be brought to its task's version: no upcaster
    for a step, or one that raised or returned something else than ``(args, kwargs)``.
    The attempt is not run and the job goes dead (docs/versions.md)."""


class NewerVersion(SQLQueueError, ValueError):
    """A job was written for a later version of its task than the one this worker has
    (a producer deployed before the workers): it waits for a worker that has it."""


class SchemaError(SQLQueueError):
    """The queue's tables are missing or older than this version of flask_sqlqueue."""


class UnsupportedDatabase(ConfigurationError):
    """The database is not one the queue can claim jobs on safely."""

    def __init__(self, name: str, supported: list[str]) -> None:
        super().__init__(
            f"flask_sqlqueue cannot run on {name}; supported databases: {', '.join(supported)}."
        )


class QueueUnavailable(SQLQueueError):
    """The queue's database could not be reached or stayed locked; nothing was written."""


class NoJobContext(SQLQueueError, RuntimeError):
    """``current_job`` was used outside a running task."""


class Retry(Exception):
    """Raise inside a task to try again after ``delay`` instead of the usual backoff.

    The attempt counts; once attempts are spent the job goes dead as with any failure.

    :param delay: seconds, or a :class:`~datetime.timedelta`, before the next attempt.
    :raises ValueError: ``delay`` is negative, not finite, or would make the next attempt
        due after :data:`~flask_sqlqueue.bounds.LATEST_RUN_AT`; raised where the task
        raises ``Retry``, so the attempt fails with it as with any other error.
    :param reason: stored as the job's ``last_error``.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        seconds = _later_seconds("Retry", delay)
        self.delay = seconds
        self.reason = reason
        super().__init__(reason or f"retry requested in {seconds:g}s")


def _later_seconds(what: str, delay: float | timedelta) -> float:
    """The delay of a ``Retry`` or ``Snooze`` in seconds, refused where the task raises
    it if the worker could not store the time it gives."""
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not seconds >= 0:  # NaN too
        raise ValueError(f"{what} delay must be zero or more seconds, got {delay!r}.")
    if seconds > longest_delay(datetime.now(UTC)):
        # Refused here, where the task sees it: the worker could not store the time.
        raise ValueError(
            f"{what} delay={delay!r} would make the next attempt due after "
            f"{LATEST_RUN_AT:%Y-%m-%d} (UTC), the latest time the queue stores; "
            f"{what.lower()} sooner, or raise PermanentFailure to stop retrying."
        )
    return seconds


class Snooze(Exception):
    """Raise inside a task to run it again after ``delay``, without spending an attempt.

    For "come back later" (a rate-limited API, a resource not ready yet): the job goes
    back to ``pending``, due ``delay`` from now; ``attempts`` is as it was before this
    attempt, the backoff does not grow, ``last_error`` is left as it was, and the job's
    ``snoozes`` count goes up by one (``current_job.snoozes`` reads it, to give up after
    a while). A job whose cancellation was asked for ends ``cancelled`` instead.

    :param delay: seconds, or a :class:`~datetime.timedelta`, before it runs again.
    :param reason: written in the worker's log line.
    :raises ValueError: ``delay`` is negative, not finite, or would make the job due
        after :data:`~flask_sqlqueue.bounds.LATEST_RUN_AT`; raised where the task raises
        ``Snooze``, so the attempt fails with it as with any other error.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        self.delay = _later_seconds("Snooze", delay)
        self.reason = reason
        super().__init__(reason or f"snoozed for {self.delay:g}s")


class PermanentFailure(Exception):
    """Raise inside a task to send the job straight to the dead-letter state.

    No further attempts are made, whatever ``max_attempts`` says.
    """


class JobCancelled(Exception):
    """Raise inside a task to stop it because its cancellation was asked for.

    :meth:`current_job.raise_if_cancelled` raises it when a cancel request is pending.
    The worker records the job as ``cancelled``: not a failed attempt, never retried.
    """

    def __init__(self, job_id: int | None = None, reason: str = "") -> None:
        self.job_id = job_id
        self.reason = reason
        where = f"Job {job_id}" if job_id is not None else "The job"
        super().__init__(reason or f"{where} was cancelled.")


class ClaimLost(SQLQueueError):
    """This attempt no longer owns its job (it was rescued or released meanwhile).

    Raised by :meth:`current_job.reserve_effect`; the task should stop, since another
    attempt may be running the job now.
    """

    def __init__(self, job_id: int) -> None:
        super().__init__(f"Job {job_id} was taken from this attempt; stop without side effects.")


class DatabaseFileChanged(SQLQueueError):
    """The SQLite file was deleted or replaced after this process opened it.

    Its connections still hold the old file: what they wrote would be lost (a deleted
    file) or never seen by anyone (a replaced one), so nothing more is written.
    """

    def __init__(self, path: str, *, deleted: bool, running: list[int] | None = None) -> None:
        self.path = path
        self.deleted = deleted
        self.running = running
        what = "was deleted" if deleted else "was replaced by another file"
        text = (
            f"The queue's database file {path} {what} after this process opened it; "
            "nothing more is written to the old file."
        )
        if running is None:
            text += f" Restart the process to use the file now at {path}."
        else:
            if running:
                listed = ", ".join(map(str, running))
                text += f" Abandoned running job(s) {listed}: their outcomes cannot be recorded."
            text += f" The worker stopped; start it again to work on the file at {path}."
        super().__init__(text)

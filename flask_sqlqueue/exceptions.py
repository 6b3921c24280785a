"""The errors flask_sqlqueue raises, and the two that tasks raise to steer retries."""

from __future__ import annotations

from datetime import timedelta


class SQLQueueError(Exception):
    """Root of every error raised by flask_sqlqueue."""


class ConfigurationError(SQLQueueError):
    """The extension or a ``SQLQUEUE_*`` setting is set up wrongly."""


class PayloadError(SQLQueueError, TypeError):
    """An argument or result cannot be stored as JSON that round-trips unchanged."""

    def __init__(self, path: str, value: object, reason: str) -> None:
        self.path = path
        self.value = value
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{path} = {shown} {reason}; job arguments must be plain JSON.")


class PayloadValueError(PayloadError, ValueError):
    """A JSON value the databases would not return unchanged (NaN, NUL characters)."""


class DuplicateTask(ConfigurationError):
    """Two tasks were registered under the same name."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"A task named {name!r} is already registered; pass name=... to tell them apart."
        )


class UnknownTask(SQLQueueError, LookupError):
    """A task name that is not registered with this queue."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"No task {name!r} is registered here; import the module that defines it "
            "before enqueueing by name or starting the worker."
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
    :param reason: stored as the job's ``last_error``.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if not seconds >= 0:
            raise ValueError(f"Retry delay must be zero or more seconds, got {delay!r}.")
        self.delay = seconds
        self.reason = reason
        super().__init__(reason or f"retry requested in {seconds:g}s")


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

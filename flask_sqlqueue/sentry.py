"""Failed attempts reported to Sentry (the ``sentry`` extra: ``sentry-sdk>=2.0``).

::

    import sentry_sdk
    from flask_sqlqueue.sentry import SQLQueueIntegration

    sentry_sdk.init(dsn=..., integrations=[SQLQueueIntegration()])

Each failed attempt becomes one Sentry event: the exception with its stack trace, tagged
with the job's id, task, queue and attempt and whether the job will be retried or is
dead. The worker's own log line about the failure is then not sent as a second event by
Sentry's logging integration. See docs/sentry.md.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

try:
    import sentry_sdk
    from sentry_sdk.integrations import Integration
    from sentry_sdk.scope import add_global_event_processor
    from sentry_sdk.utils import capture_internal_exceptions
    from sentry_sdk.utils import event_from_exception
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "flask_sqlqueue.sentry needs sentry-sdk, which is not installed; "
        "install it with: pip install 'flask-sqlqueue[sentry]'"
    ) from exc

from .core import signals
from .core.isolation import AttemptFailed
from .exceptions import Retry

if TYPE_CHECKING:
    from sentry_sdk._types import Event
    from sentry_sdk._types import Hint

    from .core.context import JobContext

#: The logger whose failure lines this integration replaces by its own events.
WORKER_LOGGER = "flask_sqlqueue.worker"
#: The tags each event carries.
TAGS = ("sqlqueue.job_id", "sqlqueue.task", "sqlqueue.queue", "sqlqueue.attempt")
#: The tag that says what follows the failure: ``retry`` or ``dead``.
OUTCOME_TAG = "sqlqueue.outcome"

# One line of a Python traceback naming a frame, and the source line under it.
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line (?P<line>\d+), in (?P<function>.*)$')


class SQLQueueIntegration(Integration):
    """Report each failed attempt of a job to Sentry as an exception.

    Pass it to ``sentry_sdk.init(integrations=[SQLQueueIntegration()])`` in the process
    that runs the worker (``flask queue work`` loads the app, so initialising Sentry in
    the app factory is enough). A failure whose job will be retried is reported with the
    tag ``sqlqueue.outcome=retry``, the last one with ``sqlqueue.outcome=dead``. A task
    that raises :class:`~flask_sqlqueue.Retry` is reported only once its job is dead.
    """

    identifier = "sqlqueue"

    @staticmethod
    def setup_once() -> None:
        # Once per process, whatever the clients: each receiver checks that the current
        # client has this integration, so a client without it sends nothing.
        signals.job_retried.connect(_retried, weak=False)
        signals.job_dead.connect(_dead, weak=False)
        add_global_event_processor(_drop_failure_log_lines)


def _retried(
    _sender: Any, *, job: JobContext, error: BaseException | None, retry_at: datetime, **_: Any
) -> None:
    if isinstance(error, Retry):
        return  # the task asked for another attempt: not an error until attempts run out
    _report(job, error, "retry", retry_at=retry_at.isoformat())


def _dead(_sender: Any, *, job: JobContext, error: BaseException | None, **_: Any) -> None:
    _report(job, error, "dead")


def _report(job: JobContext, error: BaseException | None, outcome: str, **context: Any) -> None:
    client = sentry_sdk.get_client()
    if client.get_integration(SQLQueueIntegration) is None:
        return
    with capture_internal_exceptions():
        mechanism = {"type": SQLQueueIntegration.identifier, "handled": False}
        if error is not None and not isinstance(error, AttemptFailed):
            # In the worker's thread: the exception itself, its frames and their locals.
            event, hint = event_from_exception(
                error, client_options=client.options, mechanism=mechanism
            )
        elif error is not None:
            # In a child process: what came back is the type, message and traceback text.
            event, hint = _event_from_text(error.kind, error.message, error.text, mechanism)
        else:
            # The task never ran (unknown, or its arguments unreadable): the stored error.
            event, hint = _event_from_stored(job, mechanism)
        with sentry_sdk.new_scope() as scope:
            for tag, value in zip(TAGS, (job.id, job.task, job.queue, job.attempts), strict=True):
                scope.set_tag(tag, value)
            scope.set_tag(OUTCOME_TAG, outcome)
            scope.set_context(
                "sqlqueue",
                {"max_attempts": job.max_attempts, "worker": job.worker_id, **context},
            )
            sentry_sdk.capture_event(event, hint=hint)


def _event_from_text(
    kind: str, message: str, text: str, mechanism: dict[str, Any]
) -> tuple[Event, Hint]:
    """An event for an error known only as text: its type, message, and the frames read
    back from the traceback (file, line, function and source line; no local variables)."""
    module, _, name = kind.rpartition(".")
    value: dict[str, Any] = {"type": name, "value": message, "mechanism": mechanism}
    if module:
        value["module"] = module
    frames = _frames(text)
    if frames:
        value["stacktrace"] = {"frames": frames}
    event: Event = {"level": "error", "exception": {"values": [value]}}
    if text:
        event["extra"] = {"sqlqueue.traceback": text}
    return event, {}


def _event_from_stored(job: JobContext, mechanism: dict[str, Any]) -> tuple[Event, Hint]:
    stored = job.store.get_job(job.id)
    record = stored.errors[-1] if stored is not None and stored.errors else {}
    return _event_from_text(
        str(record.get("type") or "JobFailed"),
        str(record.get("message") or f"job {job.id} failed"),
        str(record.get("traceback") or ""),
        mechanism,
    )


def _frames(text: str) -> list[dict[str, Any]]:
    """The frames of the last traceback in ``text`` (the error raised; the chained ones
    before it stay in the text), oldest first as Sentry wants them."""
    block = text.rpartition("Traceback (most recent call last):\n")[2]
    frames: list[dict[str, Any]] = []
    for line in block.splitlines():
        found = _FRAME.match(line)
        if found:
            frames.append(
                {
                    "filename": found["path"],
                    "abs_path": found["path"],
                    "lineno": int(found["line"]),
                    "function": found["function"],
                }
            )
        elif frames and line.startswith("    ") and "context_line" not in frames[-1]:
            frames[-1]["context_line"] = line.strip()
    return frames


def _drop_failure_log_lines(event: Event, hint: Hint) -> Event | None:
    """Drop the events Sentry's logging integration makes of the worker's lines about a
    failure ("failed, job is dead", and "malformed payload, job is dead" before it): this
    integration reports that failure itself."""
    record = hint.get("log_record")
    if (
        record is not None
        and record.name == WORKER_LOGGER
        and (
            getattr(record, "sqlqueue_outcome", None) in {"retry", "dead"}
            or "job is dead" in str(record.msg)
        )
        and sentry_sdk.get_client().get_integration(SQLQueueIntegration) is not None
    ):
        return None
    return event

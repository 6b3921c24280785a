"""OpenTelemetry tracing: a span around each enqueue and each attempt, the trace context
carried in the job's metadata from the code that enqueued it to every attempt that runs
it (docs/opentelemetry.md).

::

    from flask_sqlqueue.otel import instrument

    instrument(queue)  # once, where the queue is made: every process of the app

Needs the ``otel`` extra (``opentelemetry-api``). It follows OpenTelemetry's messaging
conventions: a ``PRODUCER`` span ``"<queue> publish"`` around each enqueue, whose context
is injected into the metadata of the jobs it writes (with the configured propagator: W3C
``traceparent``, and ``tracestate`` and ``baggage`` when they are set), and a ``CONSUMER``
span ``"<task> process"`` around each attempt, a child of that context and linked to it.
The core knows nothing of this: it runs the queue's hooks (core/hooks.py), and this
module adds its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any
from weakref import WeakKeyDictionary

try:
    from opentelemetry import propagate
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace import Status
    from opentelemetry.trace import StatusCode
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "flask_sqlqueue.otel needs OpenTelemetry: pip install 'flask-sqlqueue[otel]' "
        "(or opentelemetry-api)."
    ) from exc

from .core.features.tags import check_meta
from .core.hooks import Enqueueing
from .core.isolation import AttemptFailed
from .exceptions import JobCancelled
from .exceptions import Snooze
from .extension import QueueExtension

log = logging.getLogger("flask_sqlqueue.otel")

#: ``messaging.system`` of every span.
SYSTEM = "sqlqueue"
#: The instrumentation scope's name (the tracer's).
SCOPE = "flask_sqlqueue"


class Instrumentation:
    """The spans of one queue, from :func:`instrument`; :meth:`uninstrument` removes them."""

    def __init__(
        self, queue: QueueExtension, tracer_provider: trace.TracerProvider | None = None
    ) -> None:
        self.queue = queue
        self.tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)

    def install(self) -> None:
        """Add the spans to the queue's hooks (once)."""
        hooks = self.queue.hooks
        if self.enqueue_span not in hooks.enqueue:
            hooks.enqueue.append(self.enqueue_span)
            hooks.attempt.append(self.attempt_span)

    def uninstrument(self) -> None:
        """Stop making spans and injecting trace context for this queue."""
        hooks = self.queue.hooks
        if self.enqueue_span in hooks.enqueue:
            hooks.enqueue.remove(self.enqueue_span)
            hooks.attempt.remove(self.attempt_span)

    # -- producing ---------------------------------------------------------------------------

    @contextmanager
    def enqueue_span(self, enqueueing: Enqueueing) -> Iterator[None]:
        """The ``PRODUCER`` span of one enqueue (one for a whole ``enqueue_many``), its
        context injected into the metadata of the jobs it writes."""
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation": "publish",
            "messaging.operation.type": "publish",
            "messaging.destination.name": enqueueing.queue,
            "messaging.sqlqueue.task": enqueueing.task,
        }
        name = f"{enqueueing.queue} publish"
        with self.tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            _inject(enqueueing)
            yield
            jobs = enqueueing.jobs
            if enqueueing.many:
                span.set_attribute("messaging.batch.message_count", len(jobs))
            elif jobs:
                span.set_attribute("messaging.message.id", str(jobs[0].id))

    # -- running -----------------------------------------------------------------------------

    @contextmanager
    def attempt_span(self, job: Any) -> Iterator[None]:
        """The ``CONSUMER`` span of one attempt, current while the task runs: a child of
        the context its enqueue carried, and linked to it (a new trace without one)."""
        parent = propagate.extract(_carrier(_meta_of(job)), context=Context())
        carried = trace.get_current_span(parent).get_span_context()
        links = [Link(carried)] if carried.is_valid else []
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
            "messaging.sqlqueue.task": job.task,
            "messaging.sqlqueue.attempt": job.attempts,
            "messaging.sqlqueue.max_attempts": job.max_attempts,
        }
        span = self.tracer.start_span(
            f"{job.task} process",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        # Errors are recorded below: a snooze or a cancellation is not one.
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                yield
            except Snooze:
                span.set_attribute("messaging.sqlqueue.outcome", "snoozed")
                raise
            except JobCancelled:
                span.set_attribute("messaging.sqlqueue.outcome", "cancelled")
                raise
            except BaseException as exc:
                kind = _type_name(exc)
                told: dict[str, str] = {}
                if isinstance(exc, AttemptFailed):  # the child's error, not its stand-in
                    kind = exc.kind
                    told = {"exception.type": kind, "exception.stacktrace": exc.text}
                span.set_attribute("messaging.sqlqueue.outcome", "failed")
                span.set_attribute("error.type", kind)
                span.record_exception(exc, attributes=told)
                span.set_status(Status(StatusCode.ERROR, f"{kind}: {exc}"))
                raise
            span.set_attribute("messaging.sqlqueue.outcome", "succeeded")


#: Each instrumented queue's instrumentation (a queue forgotten is forgotten here too).
_instrumented: WeakKeyDictionary[QueueExtension, Instrumentation] = WeakKeyDictionary()


def instrument(
    queue: QueueExtension, *, tracer_provider: trace.TracerProvider | None = None
) -> Instrumentation:
    """Trace ``queue``'s enqueues and attempts in this process (see the module's text).

    Call it where the queue is made, so that every process of the app (web and worker)
    runs it. Calling it again for the same queue replaces the earlier instrumentation.

    :param tracer_provider: the ``TracerProvider`` to make spans with; default: the
        global one (``opentelemetry.trace.set_tracer_provider``).
    :returns: the instrumentation; its :meth:`~Instrumentation.uninstrument` undoes it.
    """
    current = _instrumented.pop(queue, None)
    if current is not None:
        current.uninstrument()
    made = Instrumentation(queue, tracer_provider)
    made.install()
    _instrumented[queue] = made
    return made


def uninstrument(queue: QueueExtension) -> None:
    """Undo :func:`instrument` for ``queue`` (nothing if it is not instrumented)."""
    current = _instrumented.pop(queue, None)
    if current is not None:
        current.uninstrument()


def _inject(enqueueing: Enqueueing) -> None:
    """Put the current trace context into the metadata of the enqueue's jobs. A key the
    caller gave keeps the caller's value (its own creation context, say); a context that
    would take the metadata past its size is left out, with a warning, rather than
    refusing the enqueue."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    added = {key: value for key, value in carrier.items() if key not in enqueueing.meta}
    if not added:
        return
    merged = {**enqueueing.meta, **added}
    try:
        check_meta(merged)
    except ValueError as exc:
        log.warning(
            "task %s: the trace context is not carried to the job: %s", enqueueing.task, exc
        )
        return
    enqueueing.meta.update(added)


def _meta_of(job: Any) -> Mapping[str, Any]:
    """The job's metadata (one read the first time), or nothing if it cannot be read."""
    try:
        meta: Mapping[str, Any] = job.meta
    except Exception as exc:  # the attempt runs all the same, in a trace of its own
        log.warning("job=%s: its trace context could not be read: %r", job.id, exc)
        return {}
    return meta


def _carrier(meta: Mapping[str, Any]) -> dict[str, str]:
    """The metadata's string values: what a propagator may read (a key edited into a
    number is ignored, not an error)."""
    return {key: value for key, value in meta.items() if isinstance(value, str)}


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")

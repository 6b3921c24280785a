"""Hooks around producing and running jobs, for integrations that must wrap them rather
than hear about them afterwards (a tracing span around each enqueue and each attempt,
docs/opentelemetry.md).

The signals (core/signals.py) say what happened once it is committed; a hook is a
context manager entered before the work and left after it, on the same thread, and may
add to what an enqueue writes (the metadata of its jobs). Each queue has one
:class:`Hooks`, shared by the stores of every app it serves; with none added, an enqueue
or an attempt does nothing more than before.

A hook that raises on entry or exit is logged and skipped: it never fails an enqueue or
an attempt, and never hides the error of one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import ExitStack
from contextlib import contextmanager
from contextlib import nullcontext
from dataclasses import dataclass
from dataclasses import field
from typing import Any

log = logging.getLogger("flask_sqlqueue.hooks")


@dataclass(eq=False, slots=True)
class Enqueueing:
    """An enqueue about to write its jobs, as the hooks around it see it."""

    #: The Flask app the queue writes for (the signals' sender).
    sender: Any
    #: The task's name.
    task: str
    #: The queue the jobs go to.
    queue: str
    #: Whether it is an ``enqueue_many`` (one call writing any number of jobs).
    many: bool
    #: The metadata every job of the call will carry (the call's and its task's): a hook
    #: may add keys before the write; the result is checked as ``meta=`` is.
    meta: dict[str, Any]
    #: The jobs, once written (set before the hooks are left); empty if it failed.
    jobs: list[Any] = field(default_factory=list)


#: Called with each enqueue; what it returns is entered around the write.
EnqueueHook = Callable[[Enqueueing], AbstractContextManager[object]]
#: Called with each attempt's ``current_job`` (a ``JobContext``); what it returns is
#: entered on the job's thread, inside its app context, around ``job_started`` and the
#: task; it sees the task's exception, if any, on exit.
AttemptHook = Callable[[Any], AbstractContextManager[object]]


class Hooks:
    """The hooks of one queue (``queue.hooks``): add to or remove from the lists."""

    def __init__(self) -> None:
        #: Entered around each enqueue (``enqueue``, ``enqueue_many``, workflows,
        #: periodic slots), in the producer's thread.
        self.enqueue: list[EnqueueHook] = []
        #: Entered around each attempt a worker of this process runs.
        self.attempt: list[AttemptHook] = []

    def around_enqueue(self, enqueueing: Enqueueing) -> AbstractContextManager[object]:
        """Every enqueue hook, entered in order."""
        return _around(self.enqueue, enqueueing)

    def around_attempt(self, job: Any) -> AbstractContextManager[object]:
        """Every attempt hook, entered in order (nothing when there are none)."""
        return _around(self.attempt, job) if self.attempt else nullcontext()


def _around(hooks: list[Callable[[Any], AbstractContextManager[object]]], value: Any) -> ExitStack:
    stack = ExitStack()
    for hook in list(hooks):
        stack.enter_context(_guarded(hook, value))
    return stack


@contextmanager
def _guarded(hook: Callable[[Any], AbstractContextManager[object]], value: Any) -> Iterator[None]:
    """``hook(value)`` entered and left, its own errors logged and swallowed; the error
    of the work it wraps passes through unchanged."""
    try:
        manager = hook(value)
        manager.__enter__()
    except Exception:
        log.exception("hook %r failed on entry; skipped", hook)
        yield
        return
    try:
        yield
    except BaseException as exc:
        try:
            manager.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as failed:
            if failed is not exc:
                log.exception("hook %r failed on exit", hook)
        raise
    try:
        manager.__exit__(None, None, None)
    except Exception:
        log.exception("hook %r failed on exit", hook)

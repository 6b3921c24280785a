"""``async def`` tasks: each attempt's coroutine runs to its end on an event loop of its own.

Calling an ``async def`` task's function only makes a coroutine; the attempt is what
the coroutine does. Wherever an attempt runs (a worker's job thread, a child process,
the caller in eager mode and ``drain()``), :func:`run_to_end` awaits it with
:func:`asyncio.run` in that same thread: a new event loop that is closed when the
attempt ends, so nothing the attempt started (tasks, loop-bound clients) outlives it or
leaks into the next attempt, whichever thread that runs on. The loop's main task runs
in a copy of the thread's context, so ``current_job`` and the attempt's app context are
seen inside the coroutine, and its exceptions (``Retry``, ``PermanentFailure``,
``JobCancelled``...) reach the worker as a sync task's would.

One attempt per loop keeps async tasks exactly as concurrent as sync ones (one per job
thread or child). Running many attempts on one loop would replace :func:`run_to_end` for
async tasks and nothing else.

Producers in asyncio code (``await task.aenqueue(...)``) call the same enqueue as
everyone, on a thread (:func:`in_thread`): one path from calls to rows, whoever calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import ParamSpec
from typing import TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def run_to_end(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """Call a task's function; if it returns a coroutine (an ``async def`` task), run the
    coroutine to its end and return what it returns."""
    value = fn(*args, **kwargs)
    if inspect.iscoroutine(value):
        return run_coroutine(value)
    return value


def run_coroutine(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` on a new event loop and return its result (or raise its exception)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    # This thread runs an event loop already (eager mode called from async code, such as
    # an async Flask view) and asyncio.run cannot nest: run the coroutine on a thread of
    # its own, in this context, while the caller waits as it would for a sync task.
    context = contextvars.copy_context()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = context.run(asyncio.run, coro)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="sqlqueue-async", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def in_thread(fn: Callable[P, R], doc: str) -> Callable[P, Coroutine[Any, Any, R]]:
    """``fn`` for asyncio code, as a coroutine function documented by ``doc``: awaiting
    it runs ``fn`` on a thread of the event loop's default executor
    (:func:`asyncio.to_thread`), in a copy of the caller's context, so the Flask app
    context and ``contextvars`` the caller set are seen there, and the loop is not
    blocked meanwhile. For short calls (a thread is held until ``fn`` returns)."""

    @functools.wraps(fn)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(fn, *args, **kwargs)

    run.__doc__ = doc
    run.__name__ = f"a{fn.__name__}"
    run.__qualname__ = f"{fn.__qualname__.rpartition('.')[0]}.a{fn.__name__}".lstrip(".")
    return run

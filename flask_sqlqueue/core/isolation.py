"""Attempts run in child processes: hard timeouts, forcible cancellation, crash isolation.

Python cannot stop a thread, so a task whose attempts must be stoppable runs them in a
child process (``isolate=True``, or every task under ``flask queue work --processes N``).
The worker process stays the parent: it claims, heartbeats and records every outcome
through its usual fenced writes; the children only run tasks.

Each child is long-lived. It is started with ``spawn`` (``fork`` is unsafe in a parent
that runs threads and holds database connections; a fork server would be one more
process whose death, say by a SIGTERM sent to the whole group, leaves the parent unable
to tell whether a child still runs), loads the app once through a picklable
:class:`RuntimeLoader`, then runs one attempt at a time sent over a pipe. A child thrown
away is replaced at once, in the background, so the next attempt rarely waits for one.
With ``max_jobs`` (``--max-jobs-per-child``) a child is retired after that many attempts,
between two of them; its successor starts with its last one. With ``max_memory``
(``--max-memory-per-child``) a child whose resident memory is over the limit, once a
second while it runs an attempt or as the attempt ends, is retired after that attempt;
its successor starts the moment the parent sees it over.
``current_job`` works inside it, and ``reserve_effect`` writes through the child's own
engine, fenced by the attempt's claim token as in a thread.

The parent waits for the outcome and, while it waits, enforces the task's ``timeout``
and polls the job's cancel request. To stop an attempt it sends :data:`STOP_SIGNAL` (the
task's ``finally`` blocks run), then SIGKILL after :data:`KILL_GRACE` seconds, and throws
that child away. Children ignore SIGTERM and SIGINT: those reach a whole process group
or service (Ctrl-C, systemd), and only the worker decides what its stop does to running
attempts (its grace period). A child that dies on its own (a segfault,
``os._exit``, the OOM killer) is a failed attempt, never a lost worker. A child whose
parent died exits by itself within a second.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import math
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING
from typing import Any
from typing import NamedTuple
from typing import Protocol

from ..exceptions import ClaimLost
from ..exceptions import ConfigurationError
from ..exceptions import JobCancelled
from ..exceptions import PayloadError
from ..exceptions import PermanentFailure
from ..exceptions import Retry
from ..exceptions import Snooze
from . import logcontext
from .aio import run_to_end
from .context import JobContext
from .context import _current
from .failures import MAX_ERROR_MESSAGE
from .failures import cut_text
from .failures import format_error
from .payload import encode_value

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from .store import Store
    from .tasks import Task

log = logging.getLogger("flask_sqlqueue.worker")

#: How the worker asks a child to stop its attempt (SIGTERM is ignored, see above).
STOP_SIGNAL = signal.SIGUSR1
#: Seconds between STOP_SIGNAL and SIGKILL when an attempt is stopped.
KILL_GRACE = 1.0
#: Seconds between two checks of a running isolated job's cancel request.
CANCEL_POLL = 1.0
#: Seconds a new child may take to load the app before it counts as failed.
START_TIMEOUT = 120.0
#: The error type recorded for an attempt stopped at its timeout.
TIMEOUT_KIND = "JobTimeout"
#: The error type recorded for an attempt whose process died on its own.
DIED_KIND = "JobProcessDied"
#: The error type recorded when no child process could be started for an attempt.
START_KIND = "JobProcessStartFailed"
#: Bytes in a MiB, the unit of ``max_memory``.
MIB = 1024 * 1024


class ChildRuntime(NamedTuple):
    """What a child process needs to run tasks, built once in the child."""

    store: Store
    registry: Mapping[str, Task[Any, Any]]
    #: Called once per attempt; the task runs inside what it returns (an app context).
    job_context: Callable[[], AbstractContextManager[Any]]


class RuntimeLoader(Protocol):
    """Builds the :class:`ChildRuntime` in a child. Must be picklable: the Flask glue
    passes one that loads the app the way ``flask`` loaded it in the worker."""

    def __call__(self) -> ChildRuntime: ...


class AttemptFailed(Exception):
    """An attempt that failed in a child process (or was stopped there), as the parent
    records it: the error type, message and traceback are the child's, not this class's."""

    def __init__(self, kind: str, message: str, text: str = "") -> None:
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message
        self.text = text


class _PermanentAttemptFailed(AttemptFailed, PermanentFailure):
    """The task raised :class:`PermanentFailure` in its child."""


class _RetryAttemptFailed(AttemptFailed, Retry):
    """The task raised :class:`Retry` in its child."""

    def __init__(self, kind: str, message: str, text: str, delay: float) -> None:
        AttemptFailed.__init__(self, kind, message, text)
        self.delay = delay
        self.reason = message


class _SnoozedInChild(AttemptFailed, Snooze):
    """The task raised :class:`Snooze` in its child (its delay checked there)."""

    def __init__(self, kind: str, message: str, text: str, delay: float) -> None:
        AttemptFailed.__init__(self, kind, message, text)
        self.delay = delay
        self.reason = "" if message == f"snoozed for {delay:g}s" else message  # the default


class _Unstorable:
    """A result the child could not store as JSON; the worker logs it and stores none."""

    def __init__(self, description: str) -> None:
        self.description = description

    def __repr__(self) -> str:
        return self.description


class _Terminated(BaseException):
    """Raised in a child's main thread by STOP_SIGNAL: unwind the task, then exit."""


# -- the parent side ---------------------------------------------------------------------


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, mp: Any, loader: RuntimeLoader, number: int) -> None:
        self.conn, theirs = mp.Pipe()
        self.process = mp.Process(
            target=child_main,
            args=(theirs, loader, _log_levels()),
            name=f"sqlqueue-child-{number}",
        )
        self.process.start()
        theirs.close()
        self.ready = False
        #: Attempts sent to it; with ``max_jobs`` it is retired after that many.
        self.jobs = 0
        #: Whether its successor was started already: it is retired after this attempt.
        self.succeeded = False
        # A busy child may be stopped by its job's thread (a timeout, a lost claim) and
        # by the worker's shutdown at once: the pipe must be closed once.
        self._stop_lock = threading.Lock()
        self._asked = False

    @property
    def pid(self) -> int | None:
        return self.process.pid  # type: ignore[no-any-return]

    def wait_ready(self, timeout: float) -> None:
        """Wait for the child to have loaded the app; :class:`AttemptFailed` if it could not."""
        if self.ready:
            return
        try:
            if not self.conn.poll(timeout):
                raise AttemptFailed(START_KIND, f"the child did not start within {timeout:g}s")
            message = self.conn.recv()
        except (EOFError, OSError):
            raise AttemptFailed(START_KIND, f"the child {self._exit_text()}") from None
        if message[0] != "ready":
            text = str(message[1])
            raise AttemptFailed(
                START_KIND, f"the child could not load the app: {_last(text)}", text
            )
        self.ready = True

    def run(
        self,
        message: tuple[Any, ...],
        timeout: float | None,
        cancelled: Callable[[], bool],
        job_id: int,
    ) -> tuple[Any, ...]:
        """Send one attempt and wait for its outcome, stopping the child at the timeout or
        on a cancel request."""
        self.conn.send(message)
        started = time.monotonic()
        deadline = math.inf if timeout is None else started + timeout
        next_check = started + CANCEL_POLL
        while True:
            wait = max(0.0, min(deadline, next_check) - time.monotonic())
            try:
                if self.conn.poll(wait):
                    return self.conn.recv()  # type: ignore[no-any-return]
            except (EOFError, OSError):
                self.stop(KILL_GRACE)  # reaps it, so the exit code is known
                raise AttemptFailed(
                    DIED_KIND, f"the process running the attempt {self._exit_text()}"
                ) from None
            now = time.monotonic()
            if now >= deadline:
                assert timeout is not None
                self.stop(KILL_GRACE)
                raise AttemptFailed(TIMEOUT_KIND, f"timed out after {timeout:g}s")
            if now >= next_check:
                next_check = now + CANCEL_POLL
                if cancelled():
                    self.stop(KILL_GRACE)
                    raise JobCancelled(
                        job_id, f"Job {job_id} was cancelled; its process was stopped."
                    )

    def stop(self, grace: float) -> None:
        """STOP_SIGNAL, then SIGKILL after ``grace`` seconds; reap it either way."""
        process = self.process
        with self._stop_lock:
            if process.is_alive():
                try:
                    os.kill(process.pid, STOP_SIGNAL)
                except ProcessLookupError:
                    pass  # it ended meanwhile
                process.join(grace)
            if process.is_alive():
                process.kill()
                process.join(10)
            self.conn.close()

    def ask_to_exit(self) -> None:
        """Ask an idle child to exit (once), without waiting for it."""
        if self._asked:
            return
        self._asked = True
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass  # already gone

    def shut_down(self, grace: float) -> None:
        """Ask an idle child to exit, then make sure it did."""
        self.ask_to_exit()
        self.process.join(grace)
        self.stop(grace)

    def _exit_text(self) -> str:
        self.process.join(1)
        code = self.process.exitcode
        if code is None:
            return "closed its pipe"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"


class Isolation:
    """The worker's child processes: at most one per job thread, reused between attempts.

    :param loader: builds the app in each child (picklable).
    :param max_jobs: retire a child once it ran this many attempts (``None``: never). Its
        successor is started when it takes its last one, so that it has loaded the app by
        the time the slot needs it; the retired child exits between attempts, never
        during one.
    :param max_memory: retire a child, after its attempt, once its resident memory is over
        this many MiB (``None``: never); see :func:`resident_memory`. Its successor is
        started when the parent sees it over: during a long attempt (checked with the
        cancel request, once a second), or as the attempt ends.
    :param spares: idle children kept started beyond the busy ones: each time an attempt
        takes an idle child and fewer than this many are left idle, one more is started,
        so that a child killed during an attempt is replaced by one that is ready.
    """

    def __init__(
        self,
        loader: RuntimeLoader,
        max_jobs: int | None = None,
        max_memory: int | None = None,
        spares: int = 0,
    ) -> None:
        self.loader = loader
        self.max_jobs = max_jobs
        self.max_memory = max_memory
        self.spares = spares
        self._lock = threading.Lock()
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._started = 0
        self._closing = False
        # multiprocessing joins live non-daemon children at exit, and an idle child waits
        # for work forever: stop ours first (atexit runs the last registered first).
        atexit.register(self.close)

    @functools.cached_property
    def _mp(self) -> Any:
        # Imported with the first child: a worker that starts none never loads it.
        import multiprocessing

        return multiprocessing.get_context("spawn")

    def reopen(self) -> None:
        """Start and keep children again after :meth:`close` (a worker run again)."""
        with self._lock:
            self._closing = False

    def prestart(self, n: int) -> None:
        """Start ``n`` children and wait until each has loaded the app.

        :raises ConfigurationError: a child could not load the app (nothing is left running).
        """
        children = [self._new_child() for _ in range(n)]
        try:
            for child in children:
                child.wait_ready(START_TIMEOUT)
        except AttemptFailed as exc:
            for child in children:
                child.stop(KILL_GRACE)
            detail = f"\n{exc.text.rstrip()}" if exc.text else ""
            raise ConfigurationError(
                f"The worker's child processes cannot run tasks: {exc.message}.{detail}"
            ) from None
        self._warn_if_born_over(children)
        with self._lock:
            self._idle.extend(children)

    def run(
        self,
        ctx: JobContext,
        args: tuple[Any, ...] | list[Any],
        kwargs: Mapping[str, Any],
        timeout: float | None,
        cancelled: Callable[[], bool],
    ) -> Any:
        """Run one attempt in a child; return the task's value or raise what the worker
        records: :class:`AttemptFailed` (with the child's error), its permanent and retry
        forms, :class:`ClaimLost` or :class:`JobCancelled`."""
        message = ("run", _fields(ctx), list(args), dict(kwargs))
        child = self._acquire()
        self._count(child)
        try:
            try:
                outcome = child.run(message, timeout, self._polled(child, cancelled), ctx.id)
            except (BrokenPipeError, ConnectionResetError):
                # It died while idle, before the attempt began: a fresh child runs it.
                child.stop(KILL_GRACE)
                self._release(child, keep=False)
                child = self._acquire()
                self._count(child)
                outcome = child.run(message, timeout, self._polled(child, cancelled), ctx.id)
        except BaseException:
            self._release(child, keep=False)
            if self._closing:
                # The worker is shutting down and handed this job back already.
                raise ClaimLost(ctx.id) from None
            raise
        self._check_memory(child)  # the attempt's leak, if any, is resident now
        if child.succeeded:  # its successor is on its way (max_jobs or max_memory)
            self._retire(child)
        else:
            self._release(child, keep=True)
        return _outcome(outcome, ctx.id)

    def close(self) -> None:
        """Stop every child: idle ones politely, busy ones (past the grace) at once."""
        with self._lock:
            self._closing = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
        for child in busy:
            child.stop(KILL_GRACE)
        for child in idle:  # all asked first: they unload their apps side by side
            child.ask_to_exit()
        for child in idle:
            child.shut_down(KILL_GRACE)

    def _count(self, child: _Child) -> None:
        """Count the attempt ``child`` is about to run; at its last, start its successor."""
        child.jobs += 1
        if self.max_jobs is not None and child.jobs >= self.max_jobs and not child.succeeded:
            child.succeeded = True
            self._add_spare()

    def _polled(self, child: _Child, cancelled: Callable[[], bool]) -> Callable[[], bool]:
        """What ``child`` calls once a second while it runs an attempt: the cancel
        request, and with ``max_memory`` its resident memory."""
        if self.max_memory is None:
            return cancelled

        def poll() -> bool:
            self._check_memory(child)
            return cancelled()

        return poll

    def _check_memory(self, child: _Child) -> None:
        """With ``max_memory``: a child over it gets its successor started now, and is
        retired after its attempt."""
        if self.max_memory is None or child.succeeded or child.pid is None:
            return
        used = resident_memory(child.pid)
        if used is None or used <= self.max_memory * MIB:
            return
        log.info(
            "child process %s uses %d MiB, over its limit of %d MiB: replaced after its attempt",
            child.pid,
            used // MIB,
            self.max_memory,
        )
        child.succeeded = True
        self._add_spare()

    def _warn_if_born_over(self, children: list[_Child]) -> None:
        """Say so when fresh children are over ``max_memory`` already: each would then
        be replaced after every attempt."""
        if self.max_memory is None:
            return
        used = max((resident_memory(child.pid or 0) or 0) for child in children)
        if used > self.max_memory * MIB:
            log.warning(
                "child processes use %d MiB once the app is loaded, over their limit of "
                "%d MiB: each will be replaced after every attempt; raise the limit",
                used // MIB,
                self.max_memory,
            )

    def _retire(self, child: _Child) -> None:
        """Let ``child``, done with its attempts, exit (its successor is on its way): on a
        thread of its own, so the outcome is recorded without waiting for the exit."""
        with self._lock:
            self._busy.discard(child)
        threading.Thread(
            target=child.shut_down, args=(KILL_GRACE,), name="sqlqueue-child-retire", daemon=True
        ).start()

    def _new_child(self) -> _Child:
        with self._lock:
            self._started += 1
            number = self._started
        return _Child(self._mp, self.loader, number)

    def _acquire(self) -> _Child:
        """An idle child (or a new one) that has loaded the app, marked busy."""
        child = None
        with self._lock:
            while self._idle and child is None:
                # The longest started first: a spare started just now may still be loading.
                candidate = self._idle.pop(0)
                if candidate.process.is_alive():
                    child = candidate
                else:
                    candidate.stop(0)
            if child is not None:
                self._busy.add(child)
            short = self.spares and not self._closing and len(self._idle) < self.spares
        if short:
            self._add_spare()  # it loads the app while this attempt runs
        if child is None:
            child = self._new_child()
            with self._lock:
                self._busy.add(child)
        try:  # a spare may still be loading the app
            child.wait_ready(START_TIMEOUT)
        except AttemptFailed:
            self._release(child, keep=False)
            raise
        return child

    def _release(self, child: _Child, *, keep: bool) -> None:
        with self._lock:
            self._busy.discard(child)
            if keep and not self._closing:
                self._idle.append(child)
                return
            replace = not keep and not self._closing and not child.succeeded
        child.stop(KILL_GRACE)
        if replace:
            # Start its successor now: it loads the app while this outcome is recorded
            # and the next job claimed. (Readiness is awaited when it is first used.)
            self._add_spare()

    def _add_spare(self) -> None:
        """Start a child and keep it idle (it is waited for when first used)."""
        spare = self._new_child()
        with self._lock:
            if not self._closing:
                self._idle.append(spare)
                return
        spare.stop(0)


def resident_memory(pid: int) -> int | None:
    """The resident memory of process ``pid`` in bytes, or ``None`` where unknown (the
    process is gone, or the system has no ``/proc``: macOS, Windows).

    It is ``VmRSS`` from ``/proc/<pid>/status``, read by the parent: the size now, from
    the kernel's own counters, readable while the child runs an attempt and whatever the
    child is doing. ``resource.getrusage`` in the child would give ``ru_maxrss``, the
    peak instead (a child over the limit once would stay over it) and in a unit that
    differs by system; ``/proc/self/statm`` in the child reads the same counter as
    ``VmRSS`` but would need the child to report it. The child is the parent's own and
    not yet reaped, so its pid cannot name another process meanwhile.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024  # "VmRSS:   53160 kB"
    except (OSError, ValueError, IndexError):
        return None
    return None  # a zombie has no VmRSS line


def _fields(ctx: JobContext) -> dict[str, Any]:
    """The attempt's context as plain values the child can rebuild it from."""
    return {
        f.name: getattr(ctx, f.name)
        for f in dataclasses.fields(ctx)
        if f.name != "store" and not f.name.startswith("_")
    }


def _outcome(outcome: tuple[Any, ...], job_id: int) -> Any:
    kind = outcome[0]
    if kind == "ok":
        return outcome[1]
    if kind == "unstorable":
        return _Unstorable(outcome[1])
    _, mode, error_kind, message, text, delay = outcome
    if mode == "claim_lost":
        raise ClaimLost(job_id)
    if mode == "cancelled":
        raise JobCancelled(job_id, message)
    if mode == "permanent":
        raise _PermanentAttemptFailed(error_kind, message, text)
    if mode == "retry":
        raise _RetryAttemptFailed(error_kind, message, text, delay)
    if mode == "snooze":
        raise _SnoozedInChild(error_kind, message, text, delay)
    raise AttemptFailed(error_kind, message, text)


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


def _log_levels() -> tuple[int, int, bool]:
    """How the children log: the root's and the queue's levels, and JSON lines or not."""
    levels = logging.getLogger().level, logging.getLogger("flask_sqlqueue").level
    return (*levels, logcontext.writes_json())


# -- the child side ----------------------------------------------------------------------


def child_main(conn: Connection, loader: RuntimeLoader, levels: tuple[int, int, bool]) -> None:
    """A child's whole life: load the app, then run attempts until told to stop."""
    # Ctrl-C and a service manager's SIGTERM reach the whole process group: the worker
    # decides what happens to running attempts (its grace period), not the children.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, _on_stop)
    threading.Thread(target=_watch_parent, name="sqlqueue-child-watch", daemon=True).start()
    try:
        _configure_logging(levels)
        try:
            runtime = loader()
        except Exception:
            conn.send(("failed", traceback.format_exc()))
            return
        logcontext.install()  # the app's log lines inside a task name the job, as on a thread
        conn.send(("ready", os.getpid()))
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone or closed the pipe
            if message is None:
                return
            conn.send(_run(runtime, message))
    except _Terminated:
        os._exit(128 + STOP_SIGNAL)


def _on_stop(_signum: int, _frame: Any) -> None:
    raise _Terminated


def _watch_parent() -> None:
    # A parent killed with SIGKILL cannot stop its children; they must not run on,
    # unsupervised, while the job is rescued and run again elsewhere.
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is not None:
        parent.join()  # returns when the worker's end of the sentinel pipe closes
        os._exit(1)


def _configure_logging(levels: tuple[int, int, bool]) -> None:
    root_level, queue_level, json_lines = levels
    logcontext.configure(queue_level, json_lines=json_lines)
    logging.getLogger().setLevel(root_level)


def _run(runtime: ChildRuntime, message: tuple[Any, ...]) -> tuple[Any, ...]:
    _, fields, args, kwargs = message
    task = runtime.registry.get(fields["task"])
    if task is None:
        return ("error", "error", "UnknownTask", f"no task {fields['task']!r} in the child", "", 0)
    ctx = JobContext(**fields, store=runtime.store)
    outcome: tuple[Any, ...] | None = None
    try:
        with runtime.job_context():
            reset = _current.set(ctx)
            try:
                # Decoded here: what crosses the pipe is the stored JSON, never the
                # values (the parent decoded them once already, to refuse a bad row).
                outcome = _success(run_to_end(task.fn, *task.decode(args, kwargs)))
            except _Terminated:
                raise
            except BaseException as exc:  # a task's SystemExit must not end the child
                outcome = _failure(exc)
            finally:
                _current.reset(reset)
                close = getattr(ctx, "close", None)
                if close is not None:
                    close()  # the last progress report lands before the outcome
    except _Terminated:
        raise
    except Exception as exc:
        if outcome is None:
            outcome = _failure(exc)
        else:
            log.warning("job=%s: job context failed on exit: %r", ctx.id, exc)
    assert outcome is not None
    return outcome


def _success(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ("ok", None)
    try:
        encode_value(value)
    except PayloadError as exc:
        return ("unstorable", str(exc))
    return ("ok", value)


def _failure(exc: BaseException) -> tuple[Any, ...]:
    kind = f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    # Cut here as the worker cuts them: what crosses the pipe is what is stored.
    text = format_error(exc)
    message = cut_text(str(exc), MAX_ERROR_MESSAGE)
    delay = 0.0
    if isinstance(exc, ClaimLost):
        mode = "claim_lost"
    elif isinstance(exc, JobCancelled):
        mode = "cancelled"
    elif isinstance(exc, PermanentFailure):
        mode = "permanent"
    elif isinstance(exc, Retry):
        mode, delay = "retry", exc.delay
    elif isinstance(exc, Snooze):
        mode, delay = "snooze", exc.delay
    else:
        mode = "error"
    return ("error", mode, kind, message, text, delay)

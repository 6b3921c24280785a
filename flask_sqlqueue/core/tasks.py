"""Tasks: registered functions that can be run now or enqueued for a worker."""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timedelta
from typing import Any
from typing import Generic
from typing import ParamSpec
from typing import Protocol
from typing import TypedDict
from typing import TypeVar
from typing import Unpack

from ..bounds import positive_seconds
from ..exceptions import DuplicateTask
from .aio import in_thread
from .cron import Schedule
from .failures import BackoffFunc
from .features.arguments import ArgumentCodec
from .features.arguments import codec_for
from .features.limits import TaskLimits
from .features.uniqueness import Unique
from .features.versions import Upcast
from .features.versions import Upcaster
from .features.versions import check_versions
from .features.versions import preview
from .features.versions import upcast_call
from .jobs import Job
from .options import Call
from .options import CallLike
from .options import EnqueueOptions
from .options import UsingOptions
from .options import check_keywords
from .options import check_options
from .options import check_task_name
from .options import signature_of

P = ParamSpec("P")
R = TypeVar("R")


class Producer(Protocol):
    """Writes a task's jobs, one per call, through :func:`~.enqueue.enqueue`: the Flask
    extension supplies one that finds the current app's store."""

    def __call__(
        self,
        task: Task[Any, Any],
        calls: Iterable[CallLike],
        options: EnqueueOptions,
        *,
        many: bool,
    ) -> list[Job]: ...


class Task(Generic[P, R]):
    """A function registered with a queue.

    Calling it runs the function inline; :meth:`enqueue` writes a job for a worker.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        name: str,
        options: EnqueueOptions,
        backoff: BackoffFunc | None,
        producer: Producer,
        timeout: float | None = None,
        isolate: bool = False,
        limits: TaskLimits | None = None,
        version: int = 1,
        upcast: Mapping[int, Upcaster] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@task needs a function, got {fn!r}.")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a callable (attempt -> seconds), got {backoff!r}.")
        check_timeout(timeout)
        if not isinstance(isolate, bool):
            raise TypeError(f"isolate must be True or False, got {isolate!r}.")
        self.fn = fn
        self.name = check_task_name(name)
        #: The version of its arguments that new jobs are written with (docs/versions.md).
        self.version = version
        #: What turns a job's arguments of version k into those of version k + 1.
        self.upcasters = check_versions(self.name, version, upcast)
        #: What each enqueue's arguments are checked against (read once, here).
        self.signature = signature_of(fn)
        #: Encodes and decodes the arguments of parameters annotated with a type JSON
        #: lacks (docs/arguments.md); ``None`` when no parameter is.
        self.codec: ArgumentCodec | None = codec_for(fn, self.signature)
        #: The task's defaults for queue, priority and max_attempts.
        self.options = options
        self.backoff = backoff
        #: Seconds an attempt may run; enforced only when it runs in a child process
        #: (``isolate=True`` or ``flask queue work --processes N``): docs/timeouts.md.
        self.timeout: float | None = None if timeout is None else float(timeout)
        #: Run each attempt in a child process, even on a thread worker.
        self.isolate = isolate
        #: When it also runs on its own: set by ``@queue.periodic``.
        self.schedule: Schedule | None = None
        #: Its concurrency and rate limits (docs/limits.md), or ``None``.
        self.limits = limits
        self._producer = producer
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Write a job that runs this task with these arguments; committed on return.

        :raises TypeError: the function could not take these arguments, or one is not
            plain JSON (:class:`~flask_sqlqueue.PayloadError`), or does not fit its
            parameter's annotation (docs/arguments.md); nothing is written.
        :raises ValueError: a value would not round-trip unchanged, or the arguments
            are larger than the database stores in one value; nothing is written.
        """
        return _enqueue_one(self, args, kwargs, self.options)

    aenqueue = in_thread(
        enqueue,
        """:meth:`enqueue` for asyncio code: ``job = await send_report.aenqueue(email, 42)``.

        The same enqueue, run on a thread of the event loop's default executor in a copy
        of the caller's context (the app context included), so the loop is not blocked
        while the job is written. Errors are :meth:`enqueue`'s.
        """,
    )

    def enqueue_many(self, calls: Iterable[CallLike]) -> list[Job]:
        """Write one job per call, all in one transaction; committed on return.

        ::

            send_report.enqueue_many([(["a@example.com", 1], {}), (["b@example.com", 2], {})])
            send_report.enqueue_many(Call([email, n], idempotency_key=f"r-{n}") for ...)

        Every call's arguments are checked before anything is written, as
        :meth:`enqueue` checks them: a bad one raises ``TypeError`` or ``ValueError``
        naming its index (``calls[3]: args[0] = ...``) and no job is written. Workers
        are woken once.

        :param calls: each a :class:`Call` (arguments and, if wanted, its own
            ``idempotency_key``) or an ``(args, kwargs)`` tuple.
        :returns: the jobs, in the order of ``calls``. A call whose idempotency key
            exists already (or repeats an earlier call's) gives the job holding it.
        """
        return _enqueue_many(self, calls, self.options)

    def step(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """A call of this task captured for a workflow, not enqueued:
        ``queue.chain(fetch.step(url), parse.step())`` or ``queue.batch([...])``
        (docs/workflows.md). Its arguments are checked when the workflow is enqueued."""
        return Step(self, args, kwargs, self.options)

    def using(self, **options: Unpack[UsingOptions]) -> BoundTask[P, R]:
        """This task with per-call options, for ``.using(...).enqueue(...)``.

        :param queue: the queue the job goes to; ``priority``, ``max_attempts``: as for
            ``@queue.task``. Each overrides the task's own.
        :param delay: seconds or a timedelta from now; or ``run_at``, an aware datetime.
            Either must give a time the queue stores
            (:data:`~flask_sqlqueue.bounds.LATEST_RUN_AT` at the latest).
        :param idempotency_key: at most one job per key; enqueueing it again returns
            the existing job.
        :param session: write the job in this Session's or Connection's transaction.
        :param depends_on: jobs (or job ids) that must complete first: the job starts
            ``waiting`` and becomes ``pending`` once all have completed, or ends
            ``cancelled`` if one ends dead or cancelled (docs/workflows.md). Each must
            exist when the job is written (in ``session``'s transaction, if given).
        :param unique: at most one job of this task per key (its arguments, or a key
            given) while in scope, and what a conflict does: return the job holding the
            key, or give it this call's arguments and ``run_at`` (debounce); see
            :class:`~flask_sqlqueue.Unique` and docs/uniqueness.md. Overrides the task's.
        :param tags: short labels to find the job by (``flask queue list --tag``, the
            admin's tag filter), added to the task's own (docs/tags.md).
        :param meta: a small dict of JSON values the job carries, read back as
            ``job.meta`` and ``current_job.meta`` (docs/tags.md).
        :param expires: seconds or a timedelta after the enqueue, or an aware datetime:
            if no attempt has started by then, none will, and the job ends ``cancelled``
            (docs/expiry.md). Must be after the job is due.
        :raises ValueError: an option is invalid, ``delay``/``run_at``/``expires`` gives a
            time the queue cannot store, ``expires`` is not after the job is due, a tag is
            invalid or there are too many, ``meta`` is too large or would not round-trip,
            or (at enqueue) ``depends_on`` names no job.
        :raises TypeError: an unknown option, ``depends_on`` not a list of jobs and ids,
            ``tags`` not a list of strings, or ``meta`` not a dict of JSON values.
        """
        check_keywords(options, UsingOptions, "Task.using")
        return BoundTask(self, self.options.merged(EnqueueOptions(**options)))

    def decode(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The values a job's stored arguments stand for, as the function is called with.

        :raises ~flask_sqlqueue.exceptions.ArgumentDecodeError: one does not decode by
            its parameter's annotation (a ``ValueError``).
        """
        codec = self.codec
        return (args, kwargs) if codec is None else codec.decode(args, kwargs)

    def upcast(
        self, stored: int, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The stored arguments of a job written for version ``stored`` of this task, as
        this version takes them (plain JSON still: :meth:`decode` comes after).

        :raises ~flask_sqlqueue.exceptions.NewerVersion: ``stored`` is later than this.
        :raises ~flask_sqlqueue.exceptions.UpcastError: an upcaster is missing or fails.
        """
        if stored == self.version:
            return args, kwargs
        return upcast_call(self.name, self.version, self.upcasters, stored, args, kwargs)

    def upcast_preview(self, job: Job) -> Upcast | None:
        """What ``job``'s stored arguments run as under this version of the task, when
        they were written for another (``None`` when they run as they are)."""
        return preview(self.name, self.version, self.upcasters, job.version, job.args, job.kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


class TaskOptions(TypedDict, total=False):
    """The options of ``@queue.task`` other than ``name`` (and of ``@queue.periodic``,
    which passes them on); each is described at ``@queue.task``."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    backoff: BackoffFunc | None
    timeout: float | None
    isolate: bool
    concurrency: int | None
    concurrency_key: Callable[..., object] | None
    rate_limit: tuple[int, float | timedelta] | None
    tags: Sequence[str] | None
    expires: float | timedelta | None
    version: int
    upcast: Mapping[int, Upcaster] | None
    unique: Unique | None


class TaskDeclaration:
    """A task's options (``@queue.task(...)``), checked when they are given, before any
    function: each task declared with them is made by :meth:`make`."""

    def __init__(self, options: TaskOptions, producer: Producer) -> None:
        """:raises ConfigurationError: a limit is invalid; :raises ValueError,
        TypeError: another option is."""
        check_keywords(options, TaskOptions, "QueueExtension.task")
        check_options(
            queue=options.get("queue"),
            priority=options.get("priority"),
            max_attempts=options.get("max_attempts"),
        )
        check_timeout(options.get("timeout"))
        expires = options.get("expires")
        if isinstance(expires, datetime):
            raise TypeError(
                "@queue.task(expires=...) is a span after each enqueue (seconds or a "
                "timedelta); give a datetime per call with .using(expires=...)."
            )
        self.defaults = EnqueueOptions(
            queue=options.get("queue"),
            priority=options.get("priority"),
            max_attempts=options.get("max_attempts"),
            tags=options.get("tags"),
            expires=expires,
            unique=options.get("unique"),
        )
        if not isinstance(options.get("isolate", False), bool):
            raise TypeError(f"isolate must be True or False, got {options['isolate']!r}.")
        self.limits = TaskLimits.declare(
            concurrency=options.get("concurrency"),
            concurrency_key=options.get("concurrency_key"),
            rate_limit=options.get("rate_limit"),
        )
        self.options = options
        self.producer = producer

    def make(self, fn: Callable[P, R], name: str | None = None) -> Task[P, R]:
        """The task of ``fn``, named ``name`` or ``"<module>.<function>"``."""
        options = self.options
        return Task(
            fn,
            name=name or f"{fn.__module__}.{fn.__qualname__}",
            options=self.defaults,
            backoff=options.get("backoff"),
            producer=self.producer,
            timeout=options.get("timeout"),
            isolate=options.get("isolate", False),
            limits=self.limits,
            version=options.get("version", 1),
            upcast=options.get("upcast"),
        )


def check_timeout(timeout: object) -> None:
    """Refuse a task timeout that is not a positive, finite number of seconds."""
    if timeout is not None:
        positive_seconds(timeout, "timeout", "30")


class BoundTask(Generic[P, R]):
    """A task with options chosen for one call."""

    def __init__(self, task: Task[P, R], options: EnqueueOptions) -> None:
        self.task = task
        self.options = options

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """:meth:`Task.enqueue` with these options."""
        return _enqueue_one(self.task, args, kwargs, self.options)

    aenqueue = in_thread(enqueue, """:meth:`Task.aenqueue` with these options.""")

    def enqueue_many(self, calls: Iterable[CallLike]) -> list[Job]:
        """:meth:`Task.enqueue_many` with these options (``session=`` included: the
        jobs are written in that transaction). Give idempotency keys per call, with
        :class:`Call`; ``.using(idempotency_key=...)`` is refused here."""
        return _enqueue_many(self.task, calls, self.options)

    def step(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """:meth:`Task.step` with these options (``session=`` is the workflow's, and
        ``depends_on`` adds to what the workflow makes it wait for)."""
        return Step(self.task, args, kwargs, self.options)


@dataclass(frozen=True, slots=True)
class Step:
    """One call of a task in a chain or a batch: what :meth:`Task.step` captured."""

    task: Task[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: EnqueueOptions = field(default_factory=EnqueueOptions)

    def __repr__(self) -> str:
        return f"<Step {self.task.name}>"


def _enqueue_one(
    task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: EnqueueOptions
) -> Job:
    (job,) = task._producer(task, [Call(args, kwargs)], options, many=False)
    return job


def _enqueue_many(
    task: Task[Any, Any], calls: Iterable[CallLike], options: EnqueueOptions
) -> list[Job]:
    return task._producer(task, calls, options, many=True)


class TaskRegistry(Mapping[str, Task[Any, Any]]):
    """Tasks by name; a second task under a name already taken is refused."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}

    def add(self, task: Task[Any, Any]) -> None:
        if task.name in self._tasks:
            raise DuplicateTask(task.name)
        self._tasks[task.name] = task

    def __getitem__(self, name: str) -> Task[Any, Any]:
        return self._tasks[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


def task_timeouts(registry: Mapping[str, Task[..., Any]]) -> list[tuple[str, float | None, bool]]:
    """``(task, timeout, enforced)`` for each task with a timeout or isolation: a timeout
    is enforced only when the attempt runs in a child process (``isolate=True``)."""
    return [
        (name, task.timeout, task.isolate)
        for name, task in sorted(registry.items())
        if task.timeout is not None or task.isolate
    ]

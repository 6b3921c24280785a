"""Tasks: registered functions that can be run now or enqueued for a worker."""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from datetime import datetime
from datetime import timedelta
from typing import Any
from typing import Generic
from typing import ParamSpec
from typing import Protocol
from typing import TypeVar

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session

from ..exceptions import DuplicateTask
from .enqueue import EnqueueOptions
from .enqueue import check_task_name
from .jobs import Job
from .lifecycle import BackoffFunc

P = ParamSpec("P")
R = TypeVar("R")


class Producer(Protocol):
    """Writes a job for a task: the Flask extension supplies one bound to the current app."""

    def __call__(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: EnqueueOptions,
    ) -> Job: ...


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
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@task needs a function, got {fn!r}.")
        if backoff is not None and not callable(backoff):
            raise TypeError(f"backoff must be a callable (attempt -> seconds), got {backoff!r}.")
        self.fn = fn
        self.name = check_task_name(name)
        #: The task's defaults for queue, priority and max_attempts.
        self.options = options
        self.backoff = backoff
        self._producer = producer
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Write a job that runs this task with these arguments; committed on return."""
        return self._producer(self, args, kwargs, self.options)

    def using(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        session: Session | scoped_session[Any] | Connection | None = None,
    ) -> BoundTask[P, R]:
        """This task with per-call options, for ``.using(...).enqueue(...)``.

        :param delay: seconds or a timedelta from now; or ``run_at``, an aware datetime.
        :param idempotency_key: at most one job per key; enqueueing it again returns
            the existing job.
        :param session: write the job in this Session's or Connection's transaction.
        """
        extra = EnqueueOptions(
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            session=session,
        )
        return BoundTask(self, self.options.merged(extra))

    def __repr__(self) -> str:
        return f"<Task {self.name}>"


class BoundTask(Generic[P, R]):
    """A task with options chosen for one call."""

    def __init__(self, task: Task[P, R], options: EnqueueOptions) -> None:
        self.task = task
        self.options = options

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        return self.task._producer(self.task, args, kwargs, self.options)


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

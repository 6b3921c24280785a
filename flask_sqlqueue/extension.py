"""The Flask extension: ``SQLQueue``, ``init_app``, ``@queue.task`` and per-app state."""

from __future__ import annotations

import threading
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timedelta
from typing import Any
from typing import ParamSpec
from typing import TypeVar
from typing import overload

from flask import Blueprint
from flask import Flask
from flask import current_app
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.orm import scoped_session

from . import schema
from .config import DEFAULTS
from .config import Settings
from .core.enqueue import EnqueueOptions
from .core.enqueue import check_options
from .core.enqueue import check_task_name
from .core.jobs import Job
from .core.lifecycle import BackoffFunc
from .core.payload import encode_payload
from .core.store import Store
from .core.tasks import Task
from .core.tasks import TaskRegistry
from .core.worker import Worker
from .core.worker import WorkerOptions
from .exceptions import ConfigurationError

P = ParamSpec("P")
R = TypeVar("R")

EXTENSION_KEY = "sqlqueue"


@dataclass
class _State:
    """What one app needs: its settings and its store. Lives in ``app.extensions``."""

    queue: SQLQueue
    settings: Settings
    store: Store
    _schema_ok: bool = False
    _eager_worker: Worker | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure_schema(self) -> None:
        """Check once per process that the tables exist and are current."""
        if not self._schema_ok:
            # A read transaction: on SQLite a write one (BEGIN IMMEDIATE) would wait for,
            # and time out on, a caller's session= transaction that already wrote.
            schema.check(self.store.read_engine)
            self.store.check_server()
            self._schema_ok = True

    def eager_worker(self, app: Flask) -> Worker:
        with self._lock:
            if self._eager_worker is None:
                self._eager_worker = Worker(
                    self.store,
                    self.queue.registry,
                    WorkerOptions(stale_after=self.settings.stale_after),
                    job_context=app.app_context,
                )
            return self._eager_worker


class SQLQueue:
    """A background-job queue stored in a database: SQLite by default.

    ::

        queue = SQLQueue()

        @queue.task
        def ping() -> str: ...

        def create_app() -> Flask:
            app = Flask(__name__)
            queue.init_app(app)
            return app

    Tasks may be declared before :meth:`init_app`; one instance may serve several apps.
    """

    def __init__(self, app: Flask | None = None) -> None:
        #: Every task declared on this queue, by name.
        self.registry = TaskRegistry()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Set the queue up on ``app``: config defaults, database engine, CLI commands.

        :raises ConfigurationError: the app already has a queue, or a setting is invalid.
        """
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(
                "SQLQueue is already set up on this app; call init_app once per app."
            )
        for key, default in DEFAULTS.items():
            app.config.setdefault(key, dict(default) if isinstance(default, dict) else default)
        settings = Settings.from_mapping(app.config, instance_path=app.instance_path)
        app.extensions[EXTENSION_KEY] = _State(self, settings, Store.from_settings(settings))

        from .cli import queue_cli

        if "queue" not in app.cli.commands:
            app.cli.add_command(queue_cli)

    # -- declaring tasks ---------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: BackoffFunc | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: BackoffFunc | None = None,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a task, bare (``@queue.task``) or with options.

        :param name: defaults to ``"<module>.<function>"``.
        :param queue: the queue its jobs go to (``"default"``).
        :param priority: higher runs first among eligible jobs (``0``).
        :param max_attempts: attempts before a job goes dead (``SQLQUEUE_MAX_ATTEMPTS``).
        :param backoff: ``attempt -> seconds`` (or a timedelta) before the next attempt,
            instead of the configured exponential backoff.
        :raises DuplicateTask: the name is taken.
        """
        check_options(queue=queue, priority=priority, max_attempts=max_attempts)

        def register(function: Callable[P, R]) -> Task[P, R]:
            task_name = name or f"{function.__module__}.{function.__qualname__}"
            task: Task[P, R] = Task(
                function,
                name=task_name,
                options=EnqueueOptions(queue=queue, priority=priority, max_attempts=max_attempts),
                backoff=backoff,
                producer=self._produce,
            )
            self.registry.add(task)
            return task

        return register if fn is None else register(fn)

    # -- producing and reading ------------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        session: Session | scoped_session[Any] | Connection | None = None,
    ) -> Job:
        """Enqueue a task by name, for code that does not import it.

        A registered task's defaults apply; an unregistered name is stored as given and
        waits, visible in ``flask queue status``, for a worker that knows it.
        """
        check_task_name(task)
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(f"args must be a list of arguments, got {args!r}.")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a dict of keyword arguments, got {kwargs!r}.")
        options = EnqueueOptions(
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            session=session,
        )
        registered = self.registry.get(task)
        if registered is not None:
            options = registered.options.merged(options)
        return self._write(task, encode_payload(args, kwargs or {}), options)

    def _produce(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        options: EnqueueOptions,
    ) -> Job:
        return self._write(task.name, encode_payload(args, kwargs), options)

    def _write(self, task: str, payload: str, options: EnqueueOptions) -> Job:
        state = self.state()
        state.ensure_schema()
        job = state.store.enqueue(task, payload, options)
        if state.settings.eager and task in self.registry:
            state.eager_worker(current_app._get_current_object()).run_job(job.id)  # type: ignore[attr-defined]
            job.refresh()
        return job

    def get_job(self, job_id: int) -> Job | None:
        """The job with this id as it is now, or ``None``."""
        state = self.state()
        state.ensure_schema()
        return state.store.get_job(job_id)

    def admin_blueprint(self, authorize: Callable[[], Any] | None = None) -> Blueprint:
        """The admin dashboard as a blueprint named ``"sqlqueue"``; register it with a
        ``url_prefix``. It is closed by default: every request calls ``authorize()`` and
        gets 403 unless it returns something truthy, and without ``authorize`` every
        request gets 403. Its forms need ``app.secret_key`` (CSRF tokens).

        ::

            app.register_blueprint(
                queue.admin_blueprint(authorize=lambda: current_user.is_admin),
                url_prefix="/queue",
            )
        """
        from .admin import create_blueprint

        return create_blueprint(self, authorize)

    # -- running --------------------------------------------------------------------------------

    def worker(self, options: WorkerOptions | None = None, app: Flask | None = None) -> Worker:
        """A worker for ``app`` (default: the current app), each job in its own app context."""
        app = app or current_app._get_current_object()  # type: ignore[attr-defined]
        state = self.state(app)
        state.ensure_schema()
        return Worker(
            state.store,
            self.registry,
            options or WorkerOptions(stale_after=state.settings.stale_after),
            job_context=app.app_context,
        )

    def upgrade_database(self, revision: str = "head", app: Flask | None = None) -> None:
        """Create or upgrade the queue's tables (what ``flask queue db upgrade`` does)."""
        state = self.state(app)
        schema.upgrade(state.store.engine, revision)
        state._schema_ok = False

    def state(self, app: Flask | None = None) -> _State:
        """The per-app state, for the CLI and tests. Needs an app context without ``app``."""
        if app is None:
            try:
                app = current_app._get_current_object()  # type: ignore[attr-defined]
            except RuntimeError:
                raise RuntimeError(
                    "Working with the queue needs an app context: use `with app.app_context():`."
                ) from None
        state = app.extensions.get(EXTENSION_KEY)
        if state is None:
            raise RuntimeError(
                "SQLQueue is not set up on this app; did you forget to call queue.init_app(app)?"
            )
        if state.queue is not self:
            raise RuntimeError("This app is set up with a different SQLQueue instance.")
        return state  # type: ignore[no-any-return]

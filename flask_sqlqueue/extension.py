"""The Flask glue: :class:`QueueExtension` (``init_app``, ``@queue.task``, producing,
workers) and each app's :class:`QueueState`, found through :func:`queue_state`.

Layering: this module imports the core and nothing that sits on it. The adapters (the
``flask queue`` commands, the admin and metrics blueprints, the test helpers, the child
processes' app loader) import it, never the reverse; ``flask_sqlqueue.SQLQueue``, which
users import, is the façade above them all (``facade.py``) that wires them in.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any
from typing import ParamSpec
from typing import TypeVar
from typing import Unpack
from typing import overload

from flask import Flask
from flask import current_app
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from . import schema
from .config import DEFAULTS
from .config import Settings
from .core import batches
from .core import operations
from .core.actions import Cancellation
from .core.aio import in_thread
from .core.batches import Batch
from .core.dialects import in_folder
from .core.dialects import in_memory
from .core.enqueue import Call
from .core.enqueue import CallLike
from .core.enqueue import EnqueueOptions
from .core.enqueue import check_options
from .core.enqueue import enqueue
from .core.features.audit import Audit
from .core.hooks import Hooks
from .core.isolation import RuntimeLoader
from .core.jobs import Job
from .core.options import ByNameOptions
from .core.options import EnqueueByName
from .core.options import EnqueueManyByName
from .core.options import check_keywords
from .core.options import split_by_name
from .core.periodic import DEFAULT_BACKFILL_LIMIT
from .core.periodic import DEFAULT_BACKFILL_WINDOW
from .core.periodic import Schedule
from .core.periodic import ScheduleInfo
from .core.periodic import describe as describe_schedules
from .core.store import Store
from .core.tasks import Step
from .core.tasks import Task
from .core.tasks import TaskDeclaration
from .core.tasks import TaskOptions
from .core.tasks import TaskRegistry
from .core.worker import Worker
from .core.worker import WorkerOptions
from .exceptions import ConfigurationError
from .exceptions import QueueNotSetUp

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from sqlalchemy.orm import scoped_session

P = ParamSpec("P")
R = TypeVar("R")

EXTENSION_KEY = "sqlqueue"


@dataclass
class QueueState:
    """What one app needs of the queue: the extension that serves it, its settings and
    its store. Lives in ``app.extensions["sqlqueue"]``; find it with
    :meth:`QueueExtension.state` (or :func:`queue_state` without the extension at hand).
    """

    queue: QueueExtension
    settings: Settings
    store: Store
    _schema_ok: bool = False
    _eager_worker: Worker | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def registry(self) -> TaskRegistry:
        """The tasks of the queue that serves this app."""
        return self.queue.registry

    def ensure_schema(self) -> None:
        """Check once per process that the tables exist and are current.

        :raises SchemaError: they are missing, older or newer than this package expects.
        """
        if not self._schema_ok:
            # A read transaction: on SQLite a write one (BEGIN IMMEDIATE) would wait for,
            # and time out on, a caller's session= transaction that already wrote.
            schema.check(self.store.read_engine)
            self.store.check_server()
            self._schema_ok = True

    def check_worker_can_run(self) -> None:
        """Refuse a worker on a database no worker can share: the app's in-memory one
        (``Store.in_memory``). Checked before the tables, which a worker's own process
        would not find there.

        :raises ConfigurationError: naming ``SQLQUEUE_USE_APP_DATABASE`` and what to do.
        """
        if self.store.in_memory:
            raise ConfigurationError(_IN_MEMORY_WORKER)

    def schema_changed(self) -> None:
        """Check the tables again at the next use: they were just upgraded or downgraded."""
        self._schema_ok = False

    def worker_options(self, **options: Any) -> WorkerOptions:
        """:class:`WorkerOptions` for this app: ``stale_after`` as it is configured, the
        other fields as given or their defaults."""
        options.setdefault("stale_after", self.settings.stale_after)
        return WorkerOptions(**options)

    def eager_worker(self, app: Flask) -> Worker:
        """The worker that runs this app's jobs at enqueue in eager mode (made once)."""
        with self._lock:
            if self._eager_worker is None:
                self._eager_worker = Worker(
                    self.store,
                    self.registry,
                    self.worker_options(),
                    job_context=app.app_context,
                )
            return self._eager_worker


def resolve_app(app: Flask | None = None) -> Flask:
    """``app``, or else the current app.

    :raises QueueNotSetUp: no ``app`` and no app context.
    """
    if app is not None:
        return app
    try:
        return current_app._get_current_object()  # type: ignore[attr-defined,no-any-return]
    except RuntimeError:
        raise QueueNotSetUp(QueueNotSetUp.NO_APP) from None


def queue_state(app: Flask | None = None, *, queue: QueueExtension | None = None) -> QueueState:
    """The queue's state for ``app`` (default: the current app): the one way every part
    of the package finds it, with one message for each way it can be missing.

    :param queue: refuse an app that another extension instance serves.
    :raises QueueNotSetUp: no app context (and no ``app``); ``init_app`` was not called
        on the app; or ``queue`` is given and is not the app's.
    """
    found = resolve_app(app).extensions.get(EXTENSION_KEY)
    if not isinstance(found, QueueState):
        raise QueueNotSetUp(QueueNotSetUp.NOT_SET_UP)
    if queue is not None and found.queue is not queue:
        raise QueueNotSetUp(QueueNotSetUp.OTHER_QUEUE)
    return found


def _flask_sqlalchemy_engine(app: Flask) -> Engine:
    """The default engine of the app's Flask-SQLAlchemy, for ``SQLQUEUE_USE_APP_DATABASE``:
    the queue opens an engine of its own on its URL (its connections need settings of
    their own: docs/flask-sqlalchemy.md), except on an in-memory database, which only
    this engine's one connection holds: the queue shares the engine itself.

    :raises ConfigurationError: Flask-SQLAlchemy is not set up on the app (yet).
    """
    db = app.extensions.get("sqlalchemy")
    if db is None:
        raise ConfigurationError(
            "SQLQUEUE_USE_APP_DATABASE is set, but Flask-SQLAlchemy is not set up on this "
            "app: call db.init_app(app) before queue.init_app(app)."
        )
    with app.app_context():
        engine: Engine | None = db.engines.get(None)
    if engine is None:
        raise ConfigurationError(
            "SQLQUEUE_USE_APP_DATABASE is set, but Flask-SQLAlchemy has no default "
            "database on this app: set SQLALCHEMY_DATABASE_URI."
        )
    return engine


#: Why no worker runs on an app's in-memory database, and what to do instead.
_IN_MEMORY_WORKER = (
    "SQLQUEUE_USE_APP_DATABASE puts the queue in the app's database, and "
    "SQLALCHEMY_DATABASE_URI is an in-memory SQLite database: it lives in one connection "
    "of one process, which no worker can share (a `flask queue work` process has an empty "
    "one of its own). Run the jobs where they are enqueued, as tests do: "
    "SQLQUEUE_EAGER = True, or drain() from flask_sqlqueue.testing; or, to run a worker, "
    "give the app a database file: SQLALCHEMY_DATABASE_URI = 'sqlite:///test.db'."
)


class QueueExtension:
    """The Flask extension proper: ``init_app``, tasks, producing and reading jobs,
    workers. Users import its subclass ``flask_sqlqueue.SQLQueue``, which adds the
    ``flask queue`` commands, the admin and metrics blueprints and ``drain``.

    Tasks may be declared before :meth:`init_app`; one instance may serve several apps.
    """

    def __init__(self, app: Flask | None = None) -> None:
        #: Every task declared on this queue, by name.
        self.registry = TaskRegistry()
        #: The hooks around every enqueue and attempt of this queue's apps
        #: (core/hooks.py; flask_sqlqueue.otel adds its spans there).
        self.hooks = Hooks()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Set the queue up on ``app``: config defaults, database engine (and, through
        ``flask_sqlqueue.SQLQueue``, the ``flask queue`` commands).

        :raises ConfigurationError: the app already has a queue, or a setting is invalid.
        """
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(
                "SQLQueue is already set up on this app; call init_app once per app."
            )
        for key, default in DEFAULTS.items():
            app.config.setdefault(key, dict(default) if isinstance(default, dict) else default)
        settings = Settings.from_mapping(
            app.config,
            app.instance_path,
            app_database=lambda: _flask_sqlalchemy_engine(app).url.render_as_string(
                hide_password=False
            ),
        )
        # A relative SQLite path is read from the instance folder, as Flask-SQLAlchemy
        # reads its own: the same file whichever directory a worker is started from.
        uri = in_folder(settings.database_uri, app.instance_path)
        if uri != settings.database_uri:
            settings = dataclasses.replace(settings, database_uri=uri)
        if settings.use_app_database and in_memory(settings.database_uri):
            # The database is the app engine's one connection (Flask-SQLAlchemy gives
            # sqlite:// a StaticPool): the queue's tables and jobs go there, through the
            # app's engine, for eager mode and drain() (no worker: see worker()).
            store = Store(_flask_sqlalchemy_engine(app), settings)
        else:
            store = Store.from_settings(settings)
        store.signal_sender = app  # signals name the app, as Flask's own do
        store.hooks = self.hooks  # shared: a hook added later serves every app
        app.extensions[EXTENSION_KEY] = QueueState(self, settings, store)

    # -- declaring tasks ---------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a function as a task, bare (``@queue.task``) or with options.

        :param name: defaults to ``"<module>.<function>"``.
        :param queue: the queue its jobs go to (``"default"``).
        :param priority: higher runs first among eligible jobs (``0``).
        :param max_attempts: attempts before a job goes dead (``SQLQUEUE_MAX_ATTEMPTS``).
        :param backoff: ``attempt -> seconds`` (or a timedelta) before the next attempt,
            instead of the configured exponential backoff.
        :param timeout: seconds an attempt may run. Enforced (the attempt is killed and
            counts as failed) only when it runs in a child process: ``isolate=True`` or
            ``flask queue work --processes N``; on a thread it is only reported.
        :param isolate: run each attempt in a child process of the worker, so that a
            timeout or a cancellation can stop it and a crash cannot take the worker down.
        :param concurrency: at most this many of its jobs run at once, across every
            worker on every host (per key with ``concurrency_key``): docs/limits.md.
        :param concurrency_key: ``(*args, **kwargs) -> str | int``, called at enqueue
            with the job's arguments; each key gets limits of its own, e.g.
            ``lambda account_id, **_: account_id``.
        :param rate_limit: ``(starts, period)``: at most ``starts`` jobs (per key) start
            in each fixed window of ``period`` seconds (or a timedelta).
        :param tags: tags every job of the task gets; ``.using(tags=...)`` adds to them
            (docs/tags.md).
        :param expires: seconds (or a timedelta) after each enqueue by which an attempt
            must have started, or the job ends ``cancelled`` without running
            (docs/expiry.md); ``.using(expires=...)`` overrides it per call.
        :param version: the version of its arguments (``1``): raise it when a change of
            signature makes stored jobs' arguments wrong for it (docs/versions.md).
        :param upcast: ``{old_version: (args, kwargs) -> (args, kwargs)}``: turns the
            stored arguments of each earlier version into the next version's, so delayed,
            retried and dead jobs written before the change still run.
        :param unique: the default :class:`~flask_sqlqueue.Unique` of its jobs: at most
            one per key while in scope, and what a conflict does (docs/uniqueness.md);
            ``.using(unique=...)`` overrides it.
        :raises DuplicateTask: the name is taken.
        :raises ConfigurationError: a limit is invalid.
        :raises ValueError: ``timeout`` is not a positive number of seconds.
        """
        declared = TaskDeclaration(options, self._produce)

        def register(function: Callable[P, R]) -> Task[P, R]:
            task = declared.make(function, name)
            self.registry.add(task)
            return task

        return register if fn is None else register(fn)

    def periodic(
        self,
        schedule: str,
        *,
        timezone: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        backfill: bool = False,
        backfill_limit: int = DEFAULT_BACKFILL_LIMIT,
        backfill_window: timedelta | float = DEFAULT_BACKFILL_WINDOW,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Callable[[Callable[P, R]], Task[P, R]]:
        """Register a task that the workers also enqueue on a cron schedule.

        ::

            @queue.periodic("*/5 * * * *", timezone="Europe/Paris")
            def refresh_rates() -> None: ...

        Each time slot becomes exactly one job however many workers run, enforced by a
        unique key in the database. It is still an ordinary task: ``.enqueue()`` works.

        :param schedule: a cron expression (5 fields; or 6 with seconds first).
        :param timezone: IANA zone name in which the expression is read (``"UTC"``).
        :param args: positional arguments of every scheduled run (JSON).
        :param kwargs: keyword arguments of every scheduled run (JSON).
        :param backfill: after every worker was down, enqueue the missed slots too (at
            most ``backfill_limit``, none older than ``backfill_window``); by default a
            slot not enqueued within a minute of its time is skipped.

        The other options are those of :meth:`task`.

        :raises ConfigurationError: invalid expression, unknown zone, arguments that do
            not fit the function, or the task options' own errors.
        """
        check_options(
            queue=options.get("queue"),
            priority=options.get("priority"),
            max_attempts=options.get("max_attempts"),
        )

        def register(function: Callable[P, R]) -> Task[P, R]:
            if isinstance(function, Task):
                raise TypeError(
                    f"@queue.periodic declares the task itself; use it instead of "
                    f"@queue.task on {function.name!r}, with the same options."
                )
            task_name = name or f"{function.__module__}.{function.__qualname__}"
            plan = Schedule.create(
                task_name,
                schedule,
                timezone=timezone,
                fn=function,
                args=args,
                kwargs=kwargs,
                backfill=backfill,
                backfill_limit=backfill_limit,
                backfill_window=backfill_window,
            )
            task = self.task(name=task_name, **options)(function)
            task.schedule = plan
            return task

        return register

    # -- producing and reading ------------------------------------------------------------------

    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Unpack[EnqueueByName],
    ) -> Job:
        """Enqueue a task by name, for code that does not import it.

        The task's defaults apply, and ``args`` and ``kwargs`` must fit its signature,
        as with ``Task.enqueue``; the other options are those of ``Task.using``.

        :param unregistered: enqueue a name that this app does not register, as it is
            (the queue's defaults, no argument checks beyond JSON), for a worker that
            registers it; until one does, the job waits, visible in
            ``flask queue status``. Without it such a name is refused.
        :param encoded: the arguments of typed parameters (docs/arguments.md) are given
            in their stored JSON forms, as ``job.args`` and ``flask queue enqueue`` have
            them (an ISO 8601 string for a ``datetime``): each is decoded by its
            annotation to check it. Without it they are given as values.
        :param version: the version of the task the arguments are written for
            (docs/versions.md): with ``unregistered``, the version a worker's task must
            upcast them from (``1`` if not given); for a registered task it can only be
            that task's own.
        :raises UnknownTask: no task of this app has the name, and ``unregistered`` is
            not set; nothing is written.
        :raises TypeError: the arguments do not fit the task, or are not plain JSON.
        :raises ValueError: a value would not round-trip, the arguments are larger than
            the database stores, or an option is invalid.
        """
        check_keywords(options, EnqueueByName, "QueueExtension.enqueue")
        call = Call(args, {} if kwargs is None else kwargs)
        (job,) = self._produce(task, [call], *split_by_name(options), many=False)
        return job

    aenqueue = in_thread(
        enqueue,
        """:meth:`enqueue` for asyncio code: ``job = await queue.aenqueue("reports.send",
        args=[email, 42])``, run on a thread of the event loop's default executor in a
        copy of the caller's context (its app context included). Errors are
        :meth:`enqueue`'s.""",
    )

    def enqueue_many(
        self,
        task: str,
        calls: Iterable[CallLike],
        **options: Unpack[EnqueueManyByName],
    ) -> list[Job]:
        """Enqueue many jobs of a task by name in one transaction: what
        :meth:`Task.enqueue_many` does, for code that does not import the task.

        :param calls: each a :class:`~flask_sqlqueue.core.enqueue.Call` or an
            ``(args, kwargs)`` tuple; idempotency keys go on each ``Call``.
        :param depends_on: as for :meth:`enqueue`, for every job of the batch.
        :param tags: as for :meth:`enqueue`, for every job of the batch.
        :param meta: as for :meth:`enqueue`, for every job of the batch.
        :param unregistered: as for :meth:`enqueue`.
        :param encoded: as for :meth:`enqueue`.
        :param version: as for :meth:`enqueue`.
        :raises UnknownTask: as :meth:`enqueue`; nothing is written.
        """
        check_keywords(options, EnqueueManyByName, "QueueExtension.enqueue_many")
        return self._produce(task, calls, *split_by_name(options), many=True)

    def _produce(
        self,
        task: Task[Any, Any] | str,
        calls: Iterable[CallLike],
        options: EnqueueOptions,
        by_name: ByNameOptions | None = None,
        *,
        many: bool,
    ) -> list[Job]:
        """Every enqueue of the app: find its store, then the core's one path."""
        state = self.state()
        state.ensure_schema()
        eager = state.eager_worker(resolve_app()) if state.settings.eager else None
        return enqueue(
            state.store,
            task,
            calls,
            options,
            registry=self.registry,
            many=many,
            unregistered=(by_name or {}).get("unregistered", False),
            encoded=(by_name or {}).get("encoded", False),
            eager=eager,
        )

    def chain(
        self, *steps: Step, session: Session | scoped_session[Any] | Connection | None = None
    ) -> list[Job]:
        """Enqueue ``steps`` (each ``task.step(...)`` or ``task.using(...).step(...)``)
        as a chain: each job waits for the one before to complete, and a step that ends
        dead or cancelled cancels the rest. All are written in one transaction
        (``session``'s, if given, else committed on return). A step reads the result of
        the one before from ``current_job.dependency_results`` (docs/workflows.md).

        :returns: the jobs, in order.
        :raises ValueError: no step; :raises TypeError: a step's arguments do not fit
            its task. Nothing is written then.
        """
        state = self.state()
        state.ensure_schema()
        eager = state.eager_worker(resolve_app()) if state.settings.eager else None
        return batches.chain(
            state.store, steps, session=session, registry=self.registry, eager=eager
        )

    def batch(
        self,
        steps: Sequence[Step],
        *,
        on_success: Step | None = None,
        on_failure: Step | None = None,
        on_complete: Step | None = None,
        label: str | None = None,
        session: Session | scoped_session[Any] | Connection | None = None,
    ) -> Batch:
        """Enqueue ``steps`` as a batch with callbacks, all in one transaction
        (``session``'s, if given). Each callback is one job, made pending (or
        cancelled) once: ``on_success`` once every member completed (it ends cancelled
        as soon as one ends dead or cancelled), ``on_failure`` once every member
        finished and one did not complete (cancelled if all completed), ``on_complete``
        once every member finished, whatever the outcome. It then runs as every job
        does, at least once: a callback whose worker dies mid-run runs again. A callback
        reads the members' results from ``current_job.dependency_results``.

        :param label: a name for the batch, for people (at most 255 characters).
        :returns: the batch: its ``id``, ``jobs``, ``progress()`` and ``cancel()``.
        :raises ValueError: no step, or a step with an ``idempotency_key``; nothing is
            written.
        """
        state = self.state()
        state.ensure_schema()
        eager = state.eager_worker(resolve_app()) if state.settings.eager else None
        return batches.batch(
            state.store,
            steps,
            on_success=on_success,
            on_failure=on_failure,
            on_complete=on_complete,
            label=label,
            session=session,
            registry=self.registry,
            eager=eager,
        )

    def get_batch(self, batch_id: int) -> Batch | None:
        """The batch with this id, or ``None``."""
        return batches.get_batch(self._store(), batch_id)

    def cancel_batch(self, batch_id: int) -> Cancellation:
        """Cancel the members and callbacks of a batch that are waiting or pending, and
        ask those running to stop (as ``flask queue cancel`` does), in one transaction.

        :raises LookupError: no batch has this id.
        """
        return batches.cancel_batch(self._store(), batch_id)

    def get_job(self, job_id: int) -> Job | None:
        """The job with this id as it is now, or ``None``."""
        return self._store().get_job(job_id)

    def pause(self, name: str, *, actor: str = "app") -> bool:
        """Stop every worker, on every host, from claiming jobs of queue ``name``; jobs
        already running finish. Enqueueing goes on; the jobs wait for :meth:`resume`.

        :param actor: who acts, as the audit log names them (docs/admin.md).
        :returns: ``False`` if the queue was paused already.
        :raises UnknownQueue: no registered task uses ``name`` and no job is in it
            (nothing is changed).
        """
        return self._set_paused(name, paused=True, actor=actor)

    def resume(self, name: str, *, actor: str = "app") -> bool:
        """Let workers claim jobs of queue ``name`` again.

        :param actor: as for :meth:`pause`.
        :returns: ``False`` if the queue was not paused.
        :raises UnknownQueue: as :meth:`pause`.
        """
        return self._set_paused(name, paused=False, actor=actor)

    def paused_queues(self) -> dict[str, datetime]:
        """Every paused queue, with the time it was paused."""
        return operations.paused_queues(self._store())

    def schedules(self) -> list[ScheduleInfo]:
        """Every periodic schedule of the app, by name: its cron expression, whether it
        is enabled, the newest slot enqueued (its last run) and its next run."""
        return describe_schedules(self._store(), self.registry)

    def disable_schedule(self, name: str, *, actor: str = "app") -> bool:
        """Stop every worker, on every host, from enqueueing the slots of the periodic
        task ``name`` until :meth:`enable_schedule`; jobs already enqueued still run.

        :param actor: who acts, as the audit log names them (docs/admin.md).
        :returns: ``False`` if it was disabled already.
        :raises UnknownSchedule: (a ``LookupError``) no periodic task has that name;
            nothing is changed.
        """
        return self._set_schedule_enabled(name, enabled=False, actor=actor)

    def enable_schedule(self, name: str, *, actor: str = "app") -> bool:
        """Let the workers enqueue the slots of ``name`` again, from its next slot on:
        the slots missed while it was disabled are not enqueued, backfill or not.

        :param actor: as for :meth:`disable_schedule`.
        :returns: ``False`` if it was enabled already.
        :raises UnknownSchedule: as :meth:`disable_schedule`.
        """
        return self._set_schedule_enabled(name, enabled=True, actor=actor)

    def run_schedule(self, name: str, *, actor: str = "app") -> Job:
        """Enqueue one run of the periodic task ``name`` now, with its schedule's
        arguments, whether the schedule is enabled or not. The schedule's own slots
        are untouched: its next slot runs on time as well.

        :param actor: as for :meth:`disable_schedule`.
        :raises UnknownSchedule: as :meth:`disable_schedule`; nothing is enqueued.
        """
        state = self.state()
        state.ensure_schema()
        eager = state.eager_worker(resolve_app()) if state.settings.eager else None
        return operations.run_schedule(
            state.store, name, registry=self.registry, eager=eager, audit=Audit(actor)
        )

    def _set_schedule_enabled(self, name: str, *, enabled: bool, actor: str) -> bool:
        store = self._store()
        return operations.set_schedule_enabled(
            store, name, enabled=enabled, registry=self.registry, audit=Audit(actor)
        )

    def _set_paused(self, name: str, *, paused: bool, actor: str) -> bool:
        store = self._store()
        changed = operations.set_paused(
            store, [name], paused=paused, registry=self.registry, audit=Audit(actor)
        )
        return bool(changed)

    def _store(self) -> Store:
        """The current app's store, its schema checked."""
        state = self.state()
        state.ensure_schema()
        return state.store

    # -- running --------------------------------------------------------------------------------

    def worker(
        self,
        options: WorkerOptions | None = None,
        app: Flask | None = None,
        *,
        loader: RuntimeLoader | None = None,
    ) -> Worker:
        """A worker for ``app`` (default: the current app), each job in its own app context.

        :param loader: builds the app in child processes, for ``isolate=True`` tasks and
            ``WorkerOptions(processes=N)``; pass
            ``flask_sqlqueue.processes.AppLoader("module:create_app")``. Without one,
            every job runs on a thread.
        """
        app = resolve_app(app)
        state = self.state(app)
        state.check_worker_can_run()
        state.ensure_schema()
        return Worker(
            state.store,
            self.registry,
            options or state.worker_options(),
            job_context=app.app_context,
            loader=loader,
        )

    def upgrade_database(self, revision: str = "head", app: Flask | None = None) -> None:
        """Create or upgrade the queue's tables (what ``flask queue db upgrade`` does)."""
        state = self.state(app)
        schema.upgrade(state.store.engine, revision)
        state.schema_changed()

    def state(self, app: Flask | None = None) -> QueueState:
        """The queue's state for ``app`` (default: the current app): its settings and its
        :class:`~flask_sqlqueue.core.store.Store`, for code that works with the database
        directly (``queue.state().store.read()``) and for the package's own adapters.

        :raises QueueNotSetUp: (a ``RuntimeError``) no app context and no ``app``; the
            app was never given to ``init_app``; or another ``SQLQueue`` serves it.
        """
        return queue_state(app, queue=self)

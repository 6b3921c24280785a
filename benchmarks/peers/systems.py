"""The systems under test, each behind the same small interface.

A system gives the harness an empty store and an empty output file for one measurement
(``fresh``), a producer that enqueues ``write(i=..., email=...)`` jobs one per commit
(``enqueue_each``) or many at once (``enqueue_bulk``), the command its users run a worker
with (at its defaults, or at the matched settings: :class:`Setting`), and two counts:
jobs waiting, read from its own store, and jobs finished, the lines of the output file.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .common import base_env
from .common import close_counters
from .common import mysql_count as _mysql_count
from .common import mysql_database
from .common import pg_count as _pg_count
from .common import postgres_database
from .common import sqlite_count as _sqlite_count
from .workload import OUTPUT
from .workload import Output
from .workload import email_of

PY = sys.executable
BIN = Path(PY).parent  # the console scripts the packages install, beside the interpreter


def script(name: str) -> str:
    """A console script of this virtualenv: the command users type (``flask``, ``rq``)."""
    return str(BIN / name)


@dataclass(frozen=True)
class Setting:
    """How a measurement runs a system's workers: at the system's defaults, or at the
    matched settings at ``concurrency`` (``None`` for a system without that setting: it is
    measured once, and the figure stands at every concurrency)."""

    matched: bool = False
    concurrency: int | None = None

    @property
    def key(self) -> str:
        """The figures' key: ``defaults``, ``matched`` or ``matched@4``."""
        if not self.matched:
            return "defaults"
        return "matched" if self.concurrency is None else f"matched@{self.concurrency}"


DEFAULTS = Setting()


@dataclass
class Context:
    """What the harness shares with every system in one invocation."""

    folder: Path
    postgres: str  # an admin URL, libpq form
    mysql: str  # an admin URL, mysql+pymysql://…
    redis_url: str | None


class System:
    name = ""
    store = ""  # "SQLite", "PostgreSQL", "MariaDB" or "Redis"
    kind = "peer"  # "sqlqueue", "peer" or "ceiling"
    needs = ""  # "postgres", "mysql" or "redis": skipped with a message when absent
    bulk_note = ""
    # False: the worker has no concurrency setting; matched once, shown at every one.
    concurrent = True
    concurrency_note = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.env: dict[str, str] = {}
        self.setting = DEFAULTS
        self.enqueued = 0  # jobs 0 .. enqueued - 1 are in the store
        self._output: Output | None = None

    @contextlib.contextmanager
    def fresh(self, setting: Setting = DEFAULTS) -> Iterator[None]:
        """An empty store and an empty output file, for one measurement at ``setting``."""
        self.setting, self.enqueued = setting, 0
        path = self.ctx.folder / f"{self.name}-{uuid.uuid4().hex[:8]}.out"
        self._output = Output(path)
        try:
            with self.open_store():
                yield
        finally:
            self._output.close()
            path.unlink(missing_ok=True)

    def open_store(self) -> contextlib.AbstractContextManager[None]:
        """A fresh store (and its producer) for as long as the context is open."""
        raise NotImplementedError

    @property
    def output(self) -> Output:
        assert self._output is not None, "only inside fresh()"
        return self._output

    def new_ids(self, n: int) -> range:
        """The next ``n`` job numbers, counted as enqueued."""
        ids = range(self.enqueued, self.enqueued + n)
        self.enqueued += n
        return ids

    def enqueue_each(self, n: int) -> None:
        """``n`` jobs, each in its own transaction, as ``n`` web requests would."""
        for i in self.new_ids(n):
            self.enqueue_one(i, email_of(i))

    def enqueue_one(self, i: int, email: str) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, n: int) -> None:
        """``n`` jobs at once, the system's own way (``bulk_note`` says which)."""
        self.enqueue_batch([(i, email_of(i)) for i in self.new_ids(n)])

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        raise NotImplementedError

    def enqueue_probe(self, path: str) -> None:
        raise NotImplementedError

    def pending(self) -> int:
        """Jobs waiting, counted in the system's own store."""
        raise NotImplementedError

    def finished(self) -> int:
        """Jobs finished: the lines of the output file (cheap: read where it left off)."""
        return self.output.count()

    def check_output(self, *, complete: bool = True) -> None:
        """The output file holds each enqueued job once (with ``complete``, every one)."""
        self.output.check(self.enqueued, complete=complete)

    def worker_argv(self, setting: Setting) -> list[str]:
        """The worker's command line at ``setting``."""
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return base_env(**self.env, **{OUTPUT: str(self.output.path)})

    def command(self, setting: Setting) -> str:
        """The worker command, for the report: as typed (``flask``, not its full path)."""
        argv = self.worker_argv(setting)
        head = Path(argv[0])
        shown = "python" if argv[0] == PY else head.name if head.parent == BIN else argv[0]
        return " ".join([shown, *argv[1:]])

    def logging(self, setting: Setting) -> str:
        """What the worker logs at ``setting``, for the command table."""
        raise NotImplementedError

    def note(self, setting: Setting) -> str:
        """Anything else the command table should say about the worker at ``setting``."""
        return ""

    def versions(self) -> str:
        return ""


@contextlib.contextmanager
def _sqlite_file(folder: Path, label: str) -> Iterator[Path]:
    path = folder / f"{label}-{uuid.uuid4().hex[:8]}.db"
    try:
        yield path
    finally:
        close_counters()
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")


# backend: (name suffix, store, server needed)
BACKENDS = {
    "sqlite": ("sqlite", "SQLite", ""),
    "postgres": ("pg", "PostgreSQL", "postgres"),
    "mysql": ("mysql", "MariaDB", "mysql"),
}


def _database(stack: contextlib.ExitStack, ctx: Context, backend: str, label: str) -> str:
    """A fresh store for as long as ``stack`` is open: a SQLite file's path, or a
    PostgreSQL (libpq form) or MariaDB database's URL."""
    if backend == "sqlite":
        return str(stack.enter_context(_sqlite_file(ctx.folder, label)))
    if backend == "postgres":
        return stack.enter_context(postgres_database(ctx.postgres, label))
    return stack.enter_context(mysql_database(ctx.mysql, label))


def _count(backend: str, target: str, sql: str) -> int:
    if backend == "sqlite":
        return _sqlite_count(Path(target), sql)
    if backend == "postgres":
        return _pg_count(target, sql)
    return _mysql_count(target, sql)


def _default_or(setting: Setting, default: str, matched: str) -> str:
    return matched if setting.matched else default


# -- flask_sqlqueue ---------------------------------------------------------------------


class SQLQueueSystem(System):
    kind = "sqlqueue"
    bulk_note = "`write.enqueue_many(...)`, one call"

    def __init__(self, ctx: Context, backend: str) -> None:
        super().__init__(ctx)
        self.backend = backend
        suffix, self.store, self.needs = BACKENDS[backend]
        self.name = f"flask_sqlqueue-{suffix}"
        self._app: Any = None
        self._target = ""

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        from benchmarks.peers import app_sqlqueue

        with contextlib.ExitStack() as stack:
            self._target = _database(stack, self.ctx, self.backend, "fsq")
            if self.backend == "sqlite":
                uri = f"sqlite:///{self._target}"
            else:  # the drivers the project's extras install
                driver = "postgresql+psycopg" if self.backend == "postgres" else "mysql+pymysql"
                uri = f"{driver}://{self._target.split('://', 1)[1]}"
            self.env = {
                "BENCH_DATABASE_URI": uri,
                "FLASK_APP": "benchmarks.peers.app_sqlqueue:create_app",
            }
            self._app = app_sqlqueue.create_app(uri)
            app_sqlqueue.queue.upgrade_database(app=self._app)
            with self._app.app_context():
                app_sqlqueue.queue.state().ensure_schema()  # the one-off check, not timed
            try:
                yield
            finally:
                self._app.extensions["sqlqueue"].store.engine.dispose()

    def enqueue_one(self, i: int, email: str) -> None:
        """One call in an app context of its own, as a web request makes it."""
        from benchmarks.peers.app_sqlqueue import write

        with self._app.app_context():
            write.enqueue(i=i, email=email)

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        from benchmarks.peers.app_sqlqueue import write

        with self._app.app_context():
            write.enqueue_many([((), {"i": i, "email": email}) for i, email in jobs])

    def enqueue_probe(self, path: str) -> None:
        from benchmarks.peers.app_sqlqueue import probe

        with self._app.app_context():
            probe.enqueue(path)

    def _count(self, status: str) -> int:
        sql = f"SELECT count(*) FROM sqlqueue_jobs WHERE status = '{status}'"
        return _count(self.backend, self._target, sql)

    def pending(self) -> int:
        return self._count("pending")

    def worker_argv(self, setting: Setting) -> list[str]:
        argv = [script("flask"), "queue", "work"]
        if not setting.matched:
            return argv
        return [*argv, "--concurrency", str(setting.concurrency), "--log-level", "warning"]

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "INFO, a line per job (the default)", "`--log-level warning`")

    def versions(self) -> str:
        return f"flask_sqlqueue {version('flask-sqlqueue')}"


# -- the ceilings ---------------------------------------------------------------------


class RawSystem(System):
    kind = "ceiling"
    concurrent = False
    concurrency_note = "no setting: claims up to 100 jobs per transaction, runs them in turn"
    DRIVERS = {"sqlite": "sqlite", "postgres": "psycopg", "mysql": "pymysql"}

    def __init__(self, ctx: Context, backend: str) -> None:
        super().__init__(ctx)
        self.backend = backend
        self.name = f"raw-{self.DRIVERS[backend]}"
        _, self.store, self.needs = BACKENDS[backend]
        self.bulk_note = "`executemany` in one transaction"
        self._target = ""
        self._conn: Any = None

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        from benchmarks.peers import raw_worker

        with contextlib.ExitStack() as stack:
            self._target = _database(stack, self.ctx, self.backend, "raw")
            if self.backend == "sqlite":
                raw_worker.sqlite_setup(self._target)
                self._conn = raw_worker.sqlite_connect(self._target)
            elif self.backend == "postgres":
                import psycopg

                self._conn = psycopg.connect(self._target)
                with self._conn.transaction():
                    self._conn.execute(raw_worker.POSTGRES_SCHEMA)
            else:
                from benchmarks.peers.common import mysql_connect

                raw_worker.mysql_setup(self._target)
                self._conn = mysql_connect(self._target, autocommit=False)
            try:
                yield
            finally:
                self._conn.close()

    def _insert(self, rows: list[tuple[str, str]]) -> None:
        """Insert ``(task, payload)`` rows in one transaction (on PostgreSQL each insert
        also notifies the waiting workers)."""
        import time

        from benchmarks.peers import raw_worker

        conn = self._conn
        if self.backend == "sqlite":
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(raw_worker.INSERT_SQLITE, [(*row, now, now) for row in rows])
            conn.execute("COMMIT")
            return
        sql = raw_worker.INSERT_POSTGRES if self.backend == "postgres" else raw_worker.INSERT_MYSQL
        with contextlib.ExitStack() as stack:
            if self.backend == "postgres":
                stack.enter_context(conn.transaction())
            cur = stack.enter_context(conn.cursor())
            if len(rows) == 1:
                cur.execute(sql, rows[0])
            else:  # PyMySQL sends an INSERT's executemany as multi-row INSERTs
                cur.executemany(sql, rows)
        if self.backend == "mysql":
            conn.commit()

    def enqueue_one(self, i: int, email: str) -> None:
        from benchmarks.peers.raw_worker import payload

        self._insert([("write", payload(i=i, email=email))])

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        from benchmarks.peers.raw_worker import payload

        self._insert([("write", payload(i=i, email=email)) for i, email in jobs])

    def enqueue_probe(self, path: str) -> None:
        from benchmarks.peers.raw_worker import payload

        self._insert([("probe", payload(path))])

    def pending(self) -> int:
        sql = "SELECT count(*) FROM raw_jobs WHERE status = 'pending'"
        return _count(self.backend, self._target, sql)

    def worker_argv(self, setting: Setting) -> list[str]:
        return [PY, "-m", "benchmarks.peers.raw_worker", self.backend, self._target]

    def command(self, setting: Setting) -> str:
        return f"python -m benchmarks.peers.raw_worker {self.backend} <database>"

    def logging(self, setting: Setting) -> str:
        return "none"

    def note(self, setting: Setting) -> str:
        idle = "waits on `LISTEN`" if self.backend == "postgres" else "claims again every 1 ms"
        return f"idle: {idle}"

    def versions(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite3 {sqlite3.sqlite_version}"
        return f"{self.DRIVERS[self.backend]} {version(self.DRIVERS[self.backend])}"


# -- Huey ------------------------------------------------------------------------------

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


class HueySystem(System):
    name = "huey-sqlite"
    store = "SQLite"
    bulk_note = "one call per job, each its own commit: Huey has no bulk enqueue"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.synchronous: dict[bool, str] = {}  # by Setting.matched, as read

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        from benchmarks.peers import app_huey

        fsync = self.setting.matched
        with _sqlite_file(self.ctx.folder, "huey") as path:
            self._path = path
            self.env = {"BENCH_HUEY_FILE": str(path), "BENCH_HUEY_FSYNC": "1" if fsync else "0"}
            self._huey, self._write, self._probe = app_huey.make(str(path), fsync)
            level = self._huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0]
            self.synchronous[fsync] = SYNCHRONOUS.get(level, str(level))
            try:
                yield
            finally:
                self._huey.storage.close()

    def enqueue_one(self, i: int, email: str) -> None:
        self._write(i=i, email=email)

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        for i, email in jobs:
            self._write(i=i, email=email)

    def enqueue_probe(self, path: str) -> None:
        self._probe(path)

    def pending(self) -> int:
        return _sqlite_count(self._path, "SELECT count(*) FROM task")

    def worker_argv(self, setting: Setting) -> list[str]:
        argv = [script("huey_consumer"), "benchmarks.peers.app_huey.huey"]
        if not setting.matched:
            return argv
        return [*argv, "-w", str(setting.concurrency), "-k", "thread", "-q"]

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "INFO, lines per task (the default)", "`-q`")

    def note(self, setting: Setting) -> str:
        made = "`SqliteHuey(name, filename=...)`"
        if setting.matched:
            made = "`SqliteHuey(name, filename=..., fsync=True)`"
        read = self.synchronous.get(setting.matched, "not read")
        return f"{made}: `PRAGMA synchronous` reads {read}"

    def versions(self) -> str:
        return f"huey {version('huey')}"


# -- Redis peers -----------------------------------------------------------------------


class RQSystem(System):
    name = "rq"
    store = "Redis"
    needs = "redis"
    bulk_note = "`Queue.enqueue_many(...)` (one pipeline)"
    concurrent = False
    concurrency_note = "no setting: a worker process runs one job at a time"

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        import redis
        import rq

        assert self.ctx.redis_url is not None
        self._redis = redis.Redis.from_url(self.ctx.redis_url)
        self._redis.flushall()
        self._queue = rq.Queue("default", connection=self._redis)
        try:
            yield
        finally:
            self._redis.flushall()
            self._redis.close()

    def enqueue_one(self, i: int, email: str) -> None:
        from benchmarks.peers.app_rq import write

        self._queue.enqueue(write, i=i, email=email)

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        from benchmarks.peers.app_rq import write

        prepare = self._queue.prepare_data
        calls = [prepare(write, kwargs={"i": i, "email": email}) for i, email in jobs]
        self._queue.enqueue_many(calls)

    def enqueue_probe(self, path: str) -> None:
        from benchmarks.peers.app_rq import probe

        self._queue.enqueue(probe, path)

    def pending(self) -> int:
        return len(self._queue)

    def worker_argv(self, setting: Setting) -> list[str]:
        assert self.ctx.redis_url is not None
        url = ["--url", self.ctx.redis_url]
        if not setting.matched:
            return [script("rq"), "worker", *url, "default"]
        simple = ["--worker-class", "rq.worker.SimpleWorker"]
        return [script("rq"), "worker", *simple, *url, "--quiet", "default"]

    def command(self, setting: Setting) -> str:
        return super().command(setting).replace(str(self.ctx.redis_url), "<redis>")

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "INFO, lines per job (the default)", "`--quiet`")

    def note(self, setting: Setting) -> str:
        return _default_or(
            setting,
            "the default worker class, `rq.Worker`: a forked work horse per job",
            "`SimpleWorker`: jobs run in the worker process, no fork",
        )

    def versions(self) -> str:
        return f"rq {version('rq')}"


class CelerySystem(System):
    name = "celery"
    store = "Redis"
    needs = "redis"
    bulk_note = "`group(write.s(...) ...).apply_async()`"

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        import redis

        assert self.ctx.redis_url is not None
        self.env = {"BENCH_REDIS_URL": self.ctx.redis_url}
        os.environ["BENCH_REDIS_URL"] = self.ctx.redis_url
        from benchmarks.peers import app_celery

        self._app = app_celery
        self._broker = redis.Redis.from_url(f"{self.ctx.redis_url}/0")
        self._broker.flushall()
        try:
            yield
        finally:
            self._broker.flushall()
            self._broker.close()

    def enqueue_one(self, i: int, email: str) -> None:
        self._app.write.delay(i=i, email=email)

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        from celery import group  # type: ignore[import-untyped]

        group(self._app.write.s(i=i, email=email) for i, email in jobs).apply_async()

    def enqueue_probe(self, path: str) -> None:
        self._app.probe.delay(path)

    def pending(self) -> int:
        return int(self._broker.llen("celery"))

    def worker_argv(self, setting: Setting) -> list[str]:
        argv = [script("celery"), "-A", "benchmarks.peers.app_celery", "worker"]
        if not setting.matched:
            return argv
        # Threads, as flask_sqlqueue's and Huey's workers: one process at every concurrency.
        pool = ["--pool", "threads", "--concurrency", str(setting.concurrency)]
        return [*argv, *pool, "--loglevel", "WARNING"]

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "WARNING (the default)", "`--loglevel WARNING`")

    def note(self, setting: Setting) -> str:
        return _default_or(
            setting, f"prefork pool of {os.cpu_count()} child processes (the CPU count)", ""
        )

    def versions(self) -> str:
        return f"celery {version('celery')}, kombu {version('kombu')}, redis-py {version('redis')}"


# -- PostgreSQL peers ------------------------------------------------------------------


class ProcrastinateSystem(System):
    name = "procrastinate"
    store = "PostgreSQL"
    needs = "postgres"
    bulk_note = "`write.batch_defer(...)`"
    APP = "benchmarks.peers.app_procrastinate.app"

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        from benchmarks.peers import app_procrastinate

        with postgres_database(self.ctx.postgres, "procrastinate") as dsn:
            self._dsn = dsn
            self.env = {"BENCH_PG_DSN": dsn}
            self._app, self._write, self._probe = app_procrastinate.make(dsn)
            with self._app.open():
                self._app.schema_manager.apply_schema()
                yield

    def enqueue_one(self, i: int, email: str) -> None:
        self._write.defer(i=i, email=email)

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        self._write.batch_defer(*[{"i": i, "email": email} for i, email in jobs])

    def enqueue_probe(self, path: str) -> None:
        self._probe.defer(path=path)

    def pending(self) -> int:
        return _pg_count(self._dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")

    def worker_argv(self, setting: Setting) -> list[str]:
        if not setting.matched:
            return [script("procrastinate"), "--app", self.APP, "worker"]
        quiet = ["--log-level", "warning"]
        concurrency = ["--concurrency", str(setting.concurrency)]
        return [script("procrastinate"), *quiet, "--app", self.APP, "worker", *concurrency]

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "INFO, lines per job (the default)", "`--log-level warning`")

    def versions(self) -> str:
        return f"procrastinate {version('procrastinate')}"


class PgQueuerSystem(System):
    name = "pgqueuer"
    store = "PostgreSQL"
    needs = "postgres"
    bulk_note = "`Queries.enqueue([...])`, one statement"
    concurrency_note = (
        "`--batch-size N`: jobs taken per dequeue, each run as an asyncio task "
        "(`--max-concurrent-tasks` left unset, as at the defaults)"
    )

    @contextlib.contextmanager
    def open_store(self) -> Iterator[None]:
        with postgres_database(self.ctx.postgres, "pgqueuer") as dsn:
            self._dsn = dsn
            self.env = {"BENCH_PG_DSN": dsn, "PGDSN": dsn}
            self._loop = asyncio.new_event_loop()
            try:
                self._queries = self._loop.run_until_complete(self._connect())
                self._loop.run_until_complete(self._queries.install())
                yield
            finally:
                self._loop.run_until_complete(self._conn.close())
                self._loop.close()

    async def _connect(self) -> Any:
        from pgqueuer.queries import Queries

        from benchmarks.peers.app_pgqueuer import connect

        driver, self._conn = await connect(self._dsn)
        return Queries(driver)

    def enqueue_each(self, n: int) -> None:
        """``n`` awaited enqueues in one coroutine, as an async web app makes them."""
        from benchmarks.peers.app_pgqueuer import payload

        ids = self.new_ids(n)

        async def go() -> None:
            for i in ids:
                await self._queries.enqueue("write", payload(i, email_of(i)))

        self._loop.run_until_complete(go())

    def enqueue_batch(self, jobs: list[tuple[int, str]]) -> None:
        from benchmarks.peers.app_pgqueuer import payload

        n = len(jobs)
        payloads = [payload(i, email) for i, email in jobs]
        self._loop.run_until_complete(self._queries.enqueue(["write"] * n, payloads, [0] * n))

    def enqueue_probe(self, path: str) -> None:
        self._loop.run_until_complete(self._queries.enqueue("probe", path.encode()))

    def pending(self) -> int:
        return _pg_count(self._dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'queued'")

    def worker_argv(self, setting: Setting) -> list[str]:
        argv = [PY, "-m", "benchmarks.peers.app_pgqueuer"]
        if not setting.matched:
            return argv
        return [*argv, "--batch-size", str(setting.concurrency), "--log-level", "WARNING"]

    def command(self, setting: Setting) -> str:
        flags = super().command(setting).removeprefix("python -m benchmarks.peers.app_pgqueuer")
        return f"pgq run{flags} benchmarks.peers.app_pgqueuer:main"

    def logging(self, setting: Setting) -> str:
        return _default_or(setting, "INFO (the CLI's default)", "`--log-level WARNING`")

    def note(self, setting: Setting) -> str:
        defaults = "other defaults" if setting.matched else "defaults (batch size 10)"
        return (
            "run as `python -m benchmarks.peers.app_pgqueuer`: the `pgq` command of pgqueuer "
            "1.6.0 exits at start with the installed typer, so this calls what it calls: its "
            f"logger set up, then `pgqueuer.run(...)` with the CLI's {defaults}, on uvloop as "
            "the CLI runs it"
        )

    def versions(self) -> str:
        driver = "asyncpg" if importlib.util.find_spec("asyncpg") else "psycopg"
        return f"pgqueuer {version('pgqueuer')} ({driver} {version(driver)})"


def all_systems(ctx: Context) -> list[System]:
    return [
        SQLQueueSystem(ctx, "sqlite"),
        RawSystem(ctx, "sqlite"),
        HueySystem(ctx),
        SQLQueueSystem(ctx, "postgres"),
        RawSystem(ctx, "postgres"),
        ProcrastinateSystem(ctx),
        PgQueuerSystem(ctx),
        SQLQueueSystem(ctx, "mysql"),
        RawSystem(ctx, "mysql"),
        RQSystem(ctx),
        CelerySystem(ctx),
    ]

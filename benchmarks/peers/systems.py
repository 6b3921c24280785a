"""The systems under test, each behind the same small interface.

A system gives the harness an empty store (``fresh``), a producer that enqueues one job
per commit (``enqueue_each``) or many at once (``enqueue_bulk``), the command its users
run a worker with at a given concurrency (the same for every system that has the notion),
and two counts read from its own store: jobs waiting and jobs finished.
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

from .common import BenchError
from .common import base_env
from .common import close_counters
from .common import mysql_count as _mysql_count
from .common import mysql_database
from .common import pg_count as _pg_count
from .common import postgres_database
from .common import sqlite_count as _sqlite_count

PY = sys.executable


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
    latency = True
    bulk_note = ""
    # False: the worker has no concurrency setting; measured once, shown at every one.
    concurrent = True
    concurrency_note = ""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.env: dict[str, str] = {}

    def fresh(self) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def enqueue_each(self, n: int) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, n: int) -> None:
        raise NotImplementedError

    def enqueue_probe(self, path: str) -> None:
        raise NotImplementedError

    def pending(self) -> int:
        raise NotImplementedError

    def finished(self) -> int:
        raise NotImplementedError

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        """The worker's command line; ``concurrency`` is None for a system without one."""
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return base_env(**self.env)

    def command(self, concurrency: int | None = None) -> str:
        """The worker command, for the report."""
        argv = self.worker_argv(concurrency)
        if argv[0] == PY:
            argv = ["python", *argv[1:]]
        return " ".join(argv)

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


# -- flask_sqlqueue ---------------------------------------------------------------------


class SQLQueueSystem(System):
    kind = "sqlqueue"

    def __init__(self, ctx: Context, backend: str) -> None:
        super().__init__(ctx)
        self.backend = backend
        suffix, self.store, self.needs = BACKENDS[backend]
        self.name = f"flask_sqlqueue-{suffix}"
        self._app: Any = None
        self._ctx: Any = None
        self._target = ""

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
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
            self._ctx = self._app.app_context()
            self._ctx.push()
            app_sqlqueue.queue.state().ensure_schema()  # the one-off check, not timed
            try:
                yield
            finally:
                self._ctx.pop()
                self._app.extensions["sqlqueue"].store.engine.dispose()

    def enqueue_each(self, n: int) -> None:
        from benchmarks.peers.app_sqlqueue import noop

        for _ in range(n):
            noop.enqueue()

    def enqueue_bulk(self, n: int) -> None:
        from benchmarks.peers.app_sqlqueue import noop
        from benchmarks.peers.app_sqlqueue import queue

        refused = ""
        if hasattr(noop, "enqueue_many"):
            try:
                noop.enqueue_many([((), {})] * n)  # (args, kwargs) per job
            except TypeError as exc:  # a different signature: say so, use the fallback
                refused = f"`enqueue_many([((), {{}})] * n)` refused ({exc}); "
            else:
                self.bulk_note = "`noop.enqueue_many(...)`, one call"
                return
        else:
            refused = "no `enqueue_many` yet: "
        self.bulk_note = refused + "`noop.using(session=conn).enqueue()` in one transaction"
        with queue.state().store.write() as conn:
            bound = noop.using(session=conn)
            for _ in range(n):
                bound.enqueue()

    def enqueue_probe(self, path: str) -> None:
        from benchmarks.peers.app_sqlqueue import probe

        probe.enqueue(path)

    def _count(self, status: str) -> int:
        sql = f"SELECT count(*) FROM sqlqueue_jobs WHERE status = '{status}'"
        return _count(self.backend, self._target, sql)

    def pending(self) -> int:
        return self._count("pending")

    def finished(self) -> int:
        return self._count("completed")

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        argv = [PY, "-m", "flask", "queue", "work"]
        return argv if concurrency is None else [*argv, "--concurrency", str(concurrency)]

    def versions(self) -> str:
        return f"flask_sqlqueue {version('flask-sqlqueue')}"


# -- the ceilings ---------------------------------------------------------------------


class RawSystem(System):
    kind = "ceiling"
    latency = False
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
    def fresh(self) -> Iterator[None]:
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

    def enqueue_each(self, n: int) -> None:
        import json
        import time

        from benchmarks.peers import raw_worker

        conn = self._conn
        if self.backend == "sqlite":
            for _ in range(n):
                payload = json.dumps({"args": [], "kwargs": {}})
                now = time.time()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(raw_worker.INSERT_SQLITE, ("noop", payload, now, now))
                conn.execute("COMMIT")
        elif self.backend == "postgres":
            for _ in range(n):
                payload = json.dumps({"args": [], "kwargs": {}})
                with conn.transaction():
                    conn.execute(raw_worker.INSERT_POSTGRES, ("noop", payload))
        else:
            with conn.cursor() as cur:
                for _ in range(n):
                    payload = json.dumps({"args": [], "kwargs": {}})
                    cur.execute(raw_worker.INSERT_MYSQL, ("noop", payload))
                    conn.commit()

    def enqueue_bulk(self, n: int) -> None:
        import json
        import time

        from benchmarks.peers import raw_worker

        conn = self._conn
        payloads = [json.dumps({"args": [], "kwargs": {}}) for _ in range(n)]
        if self.backend == "sqlite":
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(raw_worker.INSERT_SQLITE, [("noop", p, now, now) for p in payloads])
            conn.execute("COMMIT")
        elif self.backend == "postgres":
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(raw_worker.INSERT_POSTGRES, [("noop", p) for p in payloads])
        else:  # PyMySQL sends an INSERT's executemany as multi-row INSERTs
            with conn.cursor() as cur:
                cur.executemany(raw_worker.INSERT_MYSQL, [("noop", p) for p in payloads])
            conn.commit()

    def _count(self, status: str) -> int:
        sql = f"SELECT count(*) FROM raw_jobs WHERE status = '{status}'"
        return _count(self.backend, self._target, sql)

    def pending(self) -> int:
        return self._count("pending")

    def finished(self) -> int:
        return self._count("completed")

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        return [PY, "-m", "benchmarks.peers.raw_worker", self.backend, self._target]

    def command(self, concurrency: int | None = None) -> str:
        return f"python -m benchmarks.peers.raw_worker {self.backend} <database>"

    def versions(self) -> str:
        if self.backend == "sqlite":
            return f"sqlite3 {sqlite3.sqlite_version}"
        return f"{self.DRIVERS[self.backend]} {version(self.DRIVERS[self.backend])}"


# -- Huey ------------------------------------------------------------------------------


class HueySystem(System):
    name = "huey-sqlite"
    store = "SQLite"
    bulk_note = "`noop.map(...)`: one commit per job (no bulk insert)"

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        from benchmarks.peers import app_huey

        with _sqlite_file(self.ctx.folder, "huey") as path:
            self._path = path
            self.env = {"BENCH_HUEY_FILE": str(path)}
            self._huey, self._noop, self._probe = app_huey.make(str(path))
            try:
                yield
            finally:
                self._huey.storage.close()

    def enqueue_each(self, n: int) -> None:
        for _ in range(n):
            self._noop()

    def enqueue_bulk(self, n: int) -> None:
        self._noop.map([()] * n)

    def enqueue_probe(self, path: str) -> None:
        self._probe(path)

    def pending(self) -> int:
        return _sqlite_count(self._path, "SELECT count(*) FROM task")

    def finished(self) -> int:
        return _sqlite_count(self._path, "SELECT count(*) FROM kv")

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        argv = [PY, "-m", "huey.bin.huey_consumer", "benchmarks.peers.app_huey.huey"]
        return argv if concurrency is None else [*argv, "-w", str(concurrency), "-k", "thread"]

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
    def fresh(self) -> Iterator[None]:
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

    def enqueue_each(self, n: int) -> None:
        from benchmarks.peers.app_rq import noop

        for _ in range(n):
            self._queue.enqueue(noop)

    def enqueue_bulk(self, n: int) -> None:
        from benchmarks.peers.app_rq import noop

        self._queue.enqueue_many([self._queue.prepare_data(noop) for _ in range(n)])

    def enqueue_probe(self, path: str) -> None:
        from benchmarks.peers.app_rq import probe

        self._queue.enqueue(probe, path)

    def pending(self) -> int:
        return len(self._queue)

    def finished(self) -> int:
        from rq.registry import FinishedJobRegistry

        return FinishedJobRegistry(queue=self._queue).count

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        assert self.ctx.redis_url is not None
        return [
            PY,
            "-m",
            "rq.cli",
            "worker",
            "--worker-class",
            "rq.worker.SimpleWorker",
            "--url",
            self.ctx.redis_url,
            "--quiet",
            "default",
        ]

    def command(self, concurrency: int | None = None) -> str:
        return "rq worker --worker-class rq.worker.SimpleWorker --url <redis> --quiet default"

    def versions(self) -> str:
        return f"rq {version('rq')}"


class CelerySystem(System):
    name = "celery"
    store = "Redis"
    needs = "redis"
    bulk_note = "`group(noop.s() ...).apply_async()`"

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        import redis

        assert self.ctx.redis_url is not None
        self.env = {"BENCH_REDIS_URL": self.ctx.redis_url}
        os.environ["BENCH_REDIS_URL"] = self.ctx.redis_url
        from benchmarks.peers import app_celery

        self._app = app_celery
        self._broker = redis.Redis.from_url(f"{self.ctx.redis_url}/0")
        self._results = redis.Redis.from_url(f"{self.ctx.redis_url}/1")
        self._broker.flushall()
        try:
            yield
        finally:
            self._broker.flushall()
            self._broker.close()
            self._results.close()

    def enqueue_each(self, n: int) -> None:
        for _ in range(n):
            self._app.noop.delay()

    def enqueue_bulk(self, n: int) -> None:
        from celery import group  # type: ignore[import-untyped]

        group(self._app.noop.s() for _ in range(n)).apply_async()

    def enqueue_probe(self, path: str) -> None:
        self._app.probe.delay(path)

    def pending(self) -> int:
        return int(self._broker.llen("celery"))

    def finished(self) -> int:
        return int(self._results.dbsize())

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        argv = [PY, "-m", "celery", "-A", "benchmarks.peers.app_celery", "worker"]
        # Threads, as flask_sqlqueue's and Huey's workers: one process at every concurrency.
        pool = ["--pool", "solo"] if concurrency is None else ["--pool", "threads"]
        if concurrency is not None:
            pool += ["--concurrency", str(concurrency)]
        return [*argv, *pool, "--loglevel", "WARNING"]

    def versions(self) -> str:
        return f"celery {version('celery')}, kombu {version('kombu')}, redis-py {version('redis')}"


# -- PostgreSQL peers ------------------------------------------------------------------


class ProcrastinateSystem(System):
    name = "procrastinate"
    store = "PostgreSQL"
    needs = "postgres"
    bulk_note = "`noop.batch_defer(...)`"

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
        from benchmarks.peers import app_procrastinate

        with postgres_database(self.ctx.postgres, "procrastinate") as dsn:
            self._dsn = dsn
            self.env = {"BENCH_PG_DSN": dsn}
            self._app, self._noop, self._probe = app_procrastinate.make(dsn)
            with self._app.open():
                self._app.schema_manager.apply_schema()
                yield

    def enqueue_each(self, n: int) -> None:
        for _ in range(n):
            self._noop.defer()

    def enqueue_bulk(self, n: int) -> None:
        self._noop.batch_defer(*[{} for _ in range(n)])

    def enqueue_probe(self, path: str) -> None:
        self._probe.defer(path=path)

    def pending(self) -> int:
        return _pg_count(self._dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")

    def finished(self) -> int:
        return _pg_count(
            self._dsn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        app = "benchmarks.peers.app_procrastinate.app"
        argv = [PY, "-m", "procrastinate", "--app", app, "worker"]
        return argv if concurrency is None else [*argv, "--concurrency", str(concurrency)]

    def versions(self) -> str:
        return f"procrastinate {version('procrastinate')}"


class PgQueuerSystem(System):
    name = "pgqueuer"
    store = "PostgreSQL"
    needs = "postgres"
    bulk_note = "`Queries.enqueue([...])`, one statement"
    concurrency_note = (
        "`--batch-size N`: jobs taken per dequeue, each run as an asyncio task "
        "(its `--max-concurrent-tasks` must be at least twice the batch)"
    )

    @contextlib.contextmanager
    def fresh(self) -> Iterator[None]:
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
        async def go() -> None:
            for _ in range(n):
                await self._queries.enqueue("noop", None)

        self._loop.run_until_complete(go())

    def enqueue_bulk(self, n: int) -> None:
        self._loop.run_until_complete(self._queries.enqueue(["noop"] * n, [None] * n, [0] * n))

    def enqueue_probe(self, path: str) -> None:
        self._loop.run_until_complete(self._queries.enqueue("probe", path.encode()))

    def pending(self) -> int:
        return _pg_count(self._dsn, "SELECT count(*) FROM pgqueuer WHERE status = 'queued'")

    def finished(self) -> int:
        return _pg_count(self._dsn, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")

    def worker_argv(self, concurrency: int | None = None) -> list[str]:
        argv = [PY, "-m", "benchmarks.peers.app_pgqueuer"]
        return argv if concurrency is None else [*argv, "--batch-size", str(concurrency)]

    def command(self, concurrency: int | None = None) -> str:
        flag = "" if concurrency is None else f" --batch-size {concurrency}"
        return (
            f"python -m benchmarks.peers.app_pgqueuer{flag} "
            f"(= pgq run{flag} benchmarks.peers.app_pgqueuer:main)"
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


def check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchError(message)

"""PgQueuer as its users run it: ``pgq run benchmarks.peers.app_pgqueuer:main``.

``BENCH_PG_DSN`` names the database; the connection uses asyncpg when it is installed
(PgQueuer's documented driver), else psycopg. A ``write`` job's payload is the JSON of
its two values, as bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pgqueuer import PgQueuer
from pgqueuer.models import Job

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp


async def connect(dsn: str) -> tuple[Any, Any]:
    """A PgQueuer driver and the connection under it (to close)."""
    try:
        import asyncpg  # type: ignore[import-untyped]
    except ImportError:
        import psycopg
        from pgqueuer.db import PsycopgDriver

        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return PsycopgDriver(conn), conn
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(dsn)
    return AsyncpgDriver(conn), conn


def payload(i: int, email: str) -> bytes:
    """A ``write`` job's payload."""
    return json.dumps({"i": i, "email": email}).encode()


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` takes (an async context manager since pgqueuer 1.x)."""
    driver, conn = await connect(os.environ["BENCH_PG_DSN"])
    pgq = PgQueuer(driver)

    @pgq.entrypoint("write")
    async def write(job: Job) -> None:
        """The benchmark's job: one line appended to the output file."""
        assert job.payload is not None
        values = json.loads(job.payload)
        workload.write(values["i"], values["email"])

    @pgq.entrypoint("probe")
    async def probe(job: Job) -> None:
        assert job.payload is not None
        stamp(job.payload.decode())

    try:
        yield pgq
    finally:
        await conn.close()


def run_worker(argv: list[str] | None = None) -> None:
    """What ``pgq run [--batch-size N] [--log-level L] benchmarks.peers.app_pgqueuer:main``
    does, with the CLI's other defaults.

    The ``pgq`` command of pgqueuer 1.6.0 exits at start-up with the typer release it
    installs (its ``--log-level`` parser hands ``setup_fancy_logger`` a ``str``), so the
    worker calls what the command calls: its logger set up at the level given (the CLI's
    default INFO), then the same supervisor through PgQueuer's Python API, on uvloop as
    the CLI does.
    """
    import argparse
    import asyncio

    from pgqueuer import run
    from pgqueuer.core.logconfig import LogLevel
    from pgqueuer.core.logconfig import setup_fancy_logger

    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers.app_pgqueuer")
    parser.add_argument("--batch-size", type=int, default=10, help="as `pgq run`'s (10)")
    parser.add_argument("--log-level", default="INFO", help="as `pgq run`'s (INFO)")
    args = parser.parse_args(argv)
    setup_fancy_logger(LogLevel[args.log_level.upper()])
    worker = run("benchmarks.peers.app_pgqueuer:main", batch_size=args.batch_size)
    try:
        import uvloop
    except ImportError:
        asyncio.run(worker)
    else:
        uvloop.run(worker)


if __name__ == "__main__":
    run_worker()

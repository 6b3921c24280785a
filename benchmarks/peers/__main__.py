"""``python -m benchmarks.peers``: see the package docstring."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from . import common
from . import harness
from .common import DEFAULT_MYSQL
from .common import DEFAULT_POSTGRES
from .common import BenchError
from .common import mysql_connect
from .common import redis_server
from .common import temp_dir
from .systems import Context
from .systems import System
from .systems import all_systems

Workload = Callable[[System, harness.Sizes, harness.Results, Path, int | None], None]
# The enqueue runs no worker: once per run, whatever the concurrencies.
ONCE: dict[str, Workload] = {"enqueue": harness.enqueue_each}
PER_CONCURRENCY: dict[str, Workload] = {
    "bulk+drain1": harness.bulk_then_drain,
    "drain2": harness.drain_two,
    "latency": harness.latency,
}


def concurrency_list(text: str) -> list[int]:
    """``1,4`` → ``[1, 4]``: each at least 1, in the order given, no repeats."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more integers, each at least 1")
    return list(dict.fromkeys(values))


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    parser.add_argument("--jobs", type=int, help="jobs to bulk-enqueue and drain (20000)")
    parser.add_argument("--enqueue-jobs", type=int, help="one-commit enqueues (2000)")
    parser.add_argument("--samples", type=int, help="pickup-latency samples (100)")
    parser.add_argument(
        "--drain-cap", type=float, help="seconds a drain may take before its rate is taken (30)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs; the tables show medians")
    parser.add_argument("--only", help="comma-separated system names")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="an admin URL (libpq form)")
    parser.add_argument(
        "--mysql", default=DEFAULT_MYSQL, help=f"a MariaDB admin URL ({DEFAULT_MYSQL})"
    )
    parser.add_argument(
        "--concurrency",
        type=concurrency_list,
        default=[1, 4],
        help="worker concurrencies, a comma list (1,4): the same for every system with the "
        "setting (flask_sqlqueue --concurrency, Huey -w -k thread, Procrastinate "
        "--concurrency, PgQueuer --batch-size, Celery --pool threads --concurrency)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    quick = {"jobs": 1000, "enqueue_jobs": 200, "samples": 15, "drain_cap": 10.0}
    full = {"jobs": 20000, "enqueue_jobs": 2000, "samples": 100, "drain_cap": 30.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("jobs", "enqueue_jobs", "samples", "runs"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    return args


def postgres_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def mysql_version(url: str) -> str:
    conn = mysql_connect(url, connect_timeout=5)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT VERSION()")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


def server_version(name: str, url: str, read: Callable[[str], str]) -> tuple[str, str | None]:
    """The server's version, and why it is unusable (or None)."""
    try:
        return read(url), None
    except Exception as exc:
        return "not reachable", f"{name} at {url} is not reachable ({exc.__class__.__name__})"


def redis_version(redis_url: str | None) -> str:
    if not redis_url:
        return "not started"
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    command = "python -m benchmarks.peers " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(temp_dir("sqlqueue-peers-"))
        ctx = Context(folder, args.postgres, args.mysql, None)
        systems = all_systems(ctx)
        if args.only:
            wanted = [name.strip() for name in args.only.split(",") if name.strip()]
            known = {s.name for s in systems}
            unknown = [name for name in wanted if name not in known]
            if unknown:
                print(f"unknown system(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
                return 2
            systems = [s for s in systems if s.name in wanted]
        if any(s.needs == "redis" for s in systems):
            try:
                ctx.redis_url = stack.enter_context(redis_server(folder))
            except BenchError as exc:
                print(f"skipping the Redis systems: {exc}", file=sys.stderr)
        pg_version, pg_problem = server_version("PostgreSQL", args.postgres, postgres_version)
        my_version, my_problem = server_version("MariaDB", args.mysql, mysql_version)
        problems = {"postgres": pg_problem, "mysql": my_problem}
        if not ctx.redis_url:
            problems["redis"] = "no redis-server"
        skipped: list[str] = []
        usable: list[System] = []
        for system in systems:
            problem = problems.get(system.needs)
            if problem:
                skipped.append(f"{system.name}: {problem}")
                print(f"skipping {system.name}: {problem}", file=sys.stderr)
            else:
                usable.append(system)
        results = harness.Results()
        sizes = harness.Sizes(args.enqueue_jobs, args.jobs, args.samples, args.drain_cap)
        header = ["## flask_sqlqueue and its peers", "", f"`{command}`", ""]
        header += harness.machine(pg_version, my_version, redis_version(ctx.redis_url))
        for run in range(1, args.runs + 1):
            for system in usable:
                levels = args.concurrency if system.concurrent else [None]
                steps = [(w, m, None) for w, m in ONCE.items()] + [
                    (w, m, c) for c in levels for w, m in PER_CONCURRENCY.items()
                ]
                for workload, measure, concurrency in steps:
                    if workload == "latency" and not system.latency:
                        continue
                    step = harness.at(workload, concurrency)
                    log_dir = folder / f"logs-{system.name}-{step}-{run}"
                    log_dir.mkdir()
                    error = common.step(
                        f"run {run} {system.name:22} {step:14}",
                        partial(measure, system, sizes, results, log_dir, concurrency),
                    )
                    if error is not None:
                        results.errors[(system.name, step)].append(f"run {run}: {error}")
        header.append(common.closing_line(started))
        if skipped:
            header += ["", "Skipped: " + "; ".join(skipped)]
        text = harness.report(results, usable, sizes, args.runs, args.concurrency, header)
    common.publish(text, args.output)
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())

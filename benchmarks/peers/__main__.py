"""``python -m benchmarks.peers``: see the package docstring."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import harness
from .common import DEFAULT_POSTGRES
from .common import BenchError
from .common import redis_server
from .common import temp_dir
from .systems import Context
from .systems import System
from .systems import all_systems

WORKLOADS: dict[str, Callable[[System, harness.Sizes, harness.Results, Path], None]] = {
    "enqueue": harness.enqueue_each,
    "bulk+drain1": harness.bulk_then_drain,
    "drain2": harness.drain_two,
    "latency": harness.latency,
}


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
        "--sqlqueue-concurrency",
        type=int,
        default=4,
        help="`flask queue work --concurrency` (4, as in the README's examples)",
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


def server_versions(postgres: str, redis_url: str | None) -> tuple[str, str, str | None]:
    """PostgreSQL's and Redis's versions, and why PostgreSQL is unusable (or None)."""
    pg_version, problem = "not reachable", None
    try:
        import psycopg

        with psycopg.connect(postgres, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            pg_version = str(row[0]) if row else "?"
    except Exception as exc:
        problem = f"PostgreSQL at {postgres} is not reachable ({exc.__class__.__name__})"
    redis_version = "not started"
    if redis_url:
        import redis

        client = redis.Redis.from_url(redis_url)
        redis_version = str(client.info("server")["redis_version"])
        client.close()
    return pg_version, redis_version, problem


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    command = "python -m benchmarks.peers " + shlex.join(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(temp_dir("sqlqueue-peers-"))
        ctx = Context(folder, args.postgres, None, args.sqlqueue_concurrency)
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
        pg_version, redis_version, pg_problem = server_versions(args.postgres, ctx.redis_url)
        skipped: list[str] = []
        usable: list[System] = []
        for system in systems:
            if system.needs == "postgres" and pg_problem:
                skipped.append(f"{system.name}: {pg_problem}")
            elif system.needs == "redis" and not ctx.redis_url:
                skipped.append(f"{system.name}: no redis-server")
            else:
                usable.append(system)
        results = harness.Results()
        sizes = harness.Sizes(args.enqueue_jobs, args.jobs, args.samples, args.drain_cap)
        header = ["## flask_sqlqueue and its peers", "", f"`{command}`", ""]
        header += harness.machine(pg_version, redis_version)
        for run in range(1, args.runs + 1):
            for system in usable:
                for workload, measure in WORKLOADS.items():
                    if workload == "latency" and not system.latency:
                        continue
                    log_dir = folder / f"logs-{system.name}-{workload}-{run}"
                    log_dir.mkdir()
                    began = time.monotonic()
                    try:
                        measure(system, sizes, results, log_dir)
                        outcome = "ok"
                    except Exception as exc:
                        detail = str(exc) if isinstance(exc, BenchError) else repr(exc)
                        results.errors[(system.name, workload)].append(f"run {run}: {detail}")
                        outcome = f"ERROR {detail}"
                        if not isinstance(exc, BenchError):
                            traceback.print_exc(file=sys.stderr)
                    print(
                        f"run {run} {system.name:22} {workload:12} "
                        f"{time.monotonic() - began:6.1f} s  {outcome}",
                        file=sys.stderr,
                        flush=True,
                    )
        elapsed = time.monotonic() - started
        load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
        header.append(f"- wall time {elapsed / 60:.1f} min; load average at the end {load}")
        if skipped:
            header += ["", "Skipped: " + "; ".join(skipped)]
        text = harness.report(results, usable, sizes, args.runs, header)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())

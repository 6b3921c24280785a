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
from .report import report
from .systems import DEFAULTS
from .systems import Context
from .systems import Setting
from .systems import System
from .systems import all_systems

Measure = Callable[[System, Setting, harness.Sizes, harness.Results, Path], None]
#: What each section measures at each of its settings, in this order.
MEASURES: dict[str, Measure] = {
    "fill+drain1": partial(harness.fill_and_drain, 1),
    "fill+drain2": partial(harness.fill_and_drain, 2),
    "latency": harness.latency,
}
SECTIONS = {"defaults": ["defaults"], "matched": ["matched"], "all": ["defaults", "matched"]}


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
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers",
        description=sys.modules[__package__].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--section", choices=sorted(SECTIONS), default="all", help="which section(s) (all)"
    )
    parser.add_argument("--jobs", type=int, help="jobs per fill and drain (10000)")
    parser.add_argument("--samples", type=int, help="pickup-latency samples (100)")
    parser.add_argument("--drain-cap", type=float, help="seconds from spawn a drain may take (300)")
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
        help="the matched section's worker concurrencies, a comma list (1,4)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--output", type=Path, help="also write the report to this file")
    args = parser.parse_args(argv)
    quick = {"jobs": 500, "samples": 15, "drain_cap": 30.0}
    full = {"jobs": 10_000, "samples": 100, "drain_cap": 300.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for key in ("jobs", "samples", "runs"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be at least 1")
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


def redis_version(redis_url: str | None) -> str | None:
    """The version of the Redis started for RQ and Celery (None if none was)."""
    if not redis_url:
        return None
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def settings_of(system: System, section: str, concurrencies: list[int]) -> list[Setting]:
    """The settings a section measures ``system`` at: its defaults; or the matched ones
    at each concurrency, once for a system without the setting."""
    if section == "defaults":
        return [DEFAULTS]
    levels: list[int | None] = [*concurrencies] if system.concurrent else [None]
    return [Setting(matched=True, concurrency=c) for c in levels]


def chosen(systems: list[System], only: str | None) -> list[System]:
    """The systems ``--only`` names (all without it); a name unknown is an error."""
    if not only:
        return systems
    wanted = [name.strip() for name in only.split(",") if name.strip()]
    known = {s.name for s in systems}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise BenchError(f"unknown system(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return [s for s in systems if s.name in wanted]


def measure_all(
    args: argparse.Namespace, systems: list[System], folder: Path, results: harness.Results
) -> None:
    """Every run, section, system, setting and measurement, in that order; an error is
    recorded against its system and step, and gives no figure."""
    sizes = harness.Sizes(args.jobs, args.samples, args.drain_cap)
    for run in range(1, args.runs + 1):
        for section in SECTIONS[args.section]:
            for system in systems:
                for setting in settings_of(system, section, args.concurrency):
                    for name, measure in MEASURES.items():
                        step = f"{setting.key} {name}"
                        log_dir = folder / f"logs-{system.name}-{step.replace(' ', '-')}-{run}"
                        log_dir.mkdir()
                        error = common.step(
                            f"run {run} {system.name:22} {step:28}",
                            partial(measure, system, setting, sizes, results, log_dir),
                        )
                        if error is not None:
                            results.errors[(system.name, step)].append(f"run {run}: {error}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(temp_dir("sqlqueue-peers-"))
        ctx = Context(folder, args.postgres, args.mysql, None)
        try:
            systems = chosen(all_systems(ctx), args.only)
        except BenchError as exc:
            print(exc)
            return 2
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
        header = [
            "# flask_sqlqueue and its peers",
            "",
            f"`python -m benchmarks.peers {shlex.join(argv)}`",
            "",
        ]
        header += common.machine(pg_version, my_version, redis_version(ctx.redis_url))
        header.append(common.compile_checkout())
        results = harness.Results()
        measure_all(args, usable, folder, results)
        header.append(common.closing_line(started))
        if skipped:
            header += ["", "Skipped: " + "; ".join(skipped)]
        sizes = harness.Sizes(args.jobs, args.samples, args.drain_cap)
        sections = SECTIONS[args.section]
        text = report(results, usable, sizes, args.runs, sections, args.concurrency, header)
    common.publish(text, args.output)
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())

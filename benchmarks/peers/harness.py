"""The workloads, run the same way on every system, and the report."""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from .common import BenchError
from .common import percentile
from .common import running
from .probe import read_stamp
from .systems import System

# Seconds between counts while a queue drains: 0.5% of the time so far, within bounds, so
# the end is known to within 0.5% and counting costs the machine little on long drains.
POLL_SHARE, POLL_MIN, POLL_MAX = 0.005, 0.005, 0.25
STALL = 15.0  # seconds without a newly finished job that make a drain an error


@dataclass
class Sizes:
    enqueue: int
    jobs: int
    samples: int
    drain_cap: float


@dataclass
class Results:
    """Every figure of every run, and every error, by (system, metric)."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, system: str, metric: str, value: float) -> None:
        self.values[(system, metric)].append(value)

    def median(self, system: str, metric: str) -> float | None:
        found = self.values.get((system, metric))
        return statistics.median(found) if found else None


def _wait_count(read: Callable[[], int], target: int, timeout: float, what: str) -> int:
    deadline = time.monotonic() + timeout
    while True:
        count = read()
        if count == target:
            return count
        if count > target:
            raise BenchError(f"{what}: {count} counted, expected {target} (duplicates?)")
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: {count} counted after {timeout:g} s, expected {target}")
        time.sleep(0.02)


def enqueue_each(system: System, sizes: Sizes, results: Results, log_dir: Path) -> None:
    """One commit per job, as a web request does; the first (warm-up) call not timed."""
    with system.fresh():
        system.enqueue_each(1)
        started = time.perf_counter()
        system.enqueue_each(sizes.enqueue)
        elapsed = time.perf_counter() - started
        _wait_count(system.pending, sizes.enqueue + 1, 5, "jobs waiting after the enqueue")
    results.add(system.name, "enqueue", sizes.enqueue / elapsed)


def bulk_then_drain(system: System, sizes: Sizes, results: Results, log_dir: Path) -> None:
    """Bulk-enqueue the queue (timed), then drain it with one worker process."""
    with system.fresh():
        started = time.perf_counter()
        system.enqueue_bulk(sizes.jobs)
        elapsed = time.perf_counter() - started
        _wait_count(system.pending, sizes.jobs, 5, "jobs waiting after the bulk enqueue")
        results.add(system.name, "bulk", sizes.jobs / elapsed)
        if system.bulk_note:
            results.notes[f"bulk:{system.name}"].add(system.bulk_note)
        drain(system, 1, sizes, results, log_dir)


def drain_two(system: System, sizes: Sizes, results: Results, log_dir: Path) -> None:
    with system.fresh():
        system.enqueue_bulk(sizes.jobs)
        _wait_count(system.pending, sizes.jobs, 5, "jobs waiting after the fill")
        drain(system, 2, sizes, results, log_dir)


def drain(system: System, processes: int, sizes: Sizes, results: Results, log_dir: Path) -> None:
    """Start the workers on the pre-filled queue; the rate runs from the first count seen
    above zero to the count reaching the total, so process start-up is not in it."""
    total = sizes.jobs
    metric = f"drain{processes}"
    with running(system.worker_argv(), system.worker_env(), processes, log_dir) as workers:
        launched = time.monotonic()
        first_at, first_count, zero_at = 0.0, 0, launched
        changed_at, last = launched, 0
        polls = 0
        while True:
            count = system.finished()
            now = time.monotonic()
            if count > total:
                raise BenchError(f"{count} jobs finished of {total} enqueued (duplicates?)")
            if not first_at:
                if count > 0:
                    first_at, first_count = now, count
                else:
                    zero_at = now
            if count == total:
                break
            if count != last:
                changed_at, last = now, count
            elif first_at and now - changed_at > STALL:
                raise BenchError(
                    f"stalled: {count} of {total} jobs finished, none in the last {STALL:g} s"
                )
            if first_at and now - first_at > sizes.drain_cap:
                break
            if not first_at and now - launched > 120:
                raise BenchError("no job finished within 120 s of starting the workers")
            polls += 1
            if polls % 20 == 0:
                workers.check_alive()
            since = now - (first_at or launched)
            time.sleep(min(POLL_MAX, max(POLL_MIN, POLL_SHARE * since)))
        rss = workers.peak_rss_mb()
    final = system.finished()
    if final < count or final > total:
        raise BenchError(f"after the workers stopped {final} jobs are finished (saw {count})")
    if final < total and final + system.pending() > total:
        raise BenchError(f"{final} finished and {system.pending()} waiting of {total} jobs")
    if count == first_count == total:
        # All done between two counts: all we know is a lower bound on the rate.
        results.notes[f"bound:{system.name}:{metric}"].add("lower bound")
        first_at, first_count = zero_at, 0
    elif count == first_count:
        raise BenchError(f"only {count} jobs finished; too few to time")
    if count < total:
        results.notes[f"capped:{system.name}:{metric}"].add(f"{count} of {total}")
    if processes == 1:
        results.add(system.name, "rss", rss)
    results.add(system.name, metric, (count - first_count) / (now - first_at))


def latency(system: System, sizes: Sizes, results: Results, log_dir: Path) -> None:
    """An idle worker; one probe job at a time; from ``enqueue`` returning to the job's
    start, as the job itself records it. Each probe waits until the previous job is
    counted finished in the store, then 50 ms more, so the worker is idle again."""
    with system.fresh(), running(system.worker_argv(), system.worker_env(), 1, log_dir) as workers:
        workers.wait_idle()
        folder = log_dir / "probes"
        folder.mkdir(exist_ok=True)
        samples: list[float] = []
        for index in range(sizes.samples + 1):
            path = str(folder / f"{system.name}-{index}-{time.time_ns()}")
            system.enqueue_probe(path)
            enqueued = time.time()
            deadline = time.monotonic() + 60
            while (started := read_stamp(path)) is None:
                if time.monotonic() > deadline:
                    raise BenchError(f"probe {index} did not start within 60 s")
                workers.check_alive()
                time.sleep(0.0005)
            if index:  # the first one is the warm-up
                samples.append((started - enqueued) * 1000)
            _wait_count(system.finished, index + 1, 30, "probes finished")
            time.sleep(0.05)
    results.add(system.name, "p50", percentile(samples, 50))
    results.add(system.name, "p95", percentile(samples, 95))
    results.add(system.name, "p99", percentile(samples, 99))


# -- the report ----------------------------------------------------------------------------

SQ_SQLITE, SQ_PG = "flask_sqlqueue-sqlite", "flask_sqlqueue-pg"


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "—"
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "—"
    return f"{value / base:.2f}x"


def machine(postgres_version: str, redis_version: str) -> list[str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"- CPU: {os.cpu_count()} cores, {model}; load average at the start {load}",
        f"- Python {platform.python_version()} ({platform.system()} {platform.release()})",
        f"- SQLite {sqlite3.sqlite_version}; PostgreSQL {postgres_version}; "
        f"Redis {redis_version} (loopback, no persistence)",
    ]


def report(
    results: Results,
    systems: list[System],
    sizes: Sizes,
    runs: int,
    header: list[str],
) -> str:
    names = [s.name for s in systems]
    by_name = {s.name: s for s in systems}
    med = results.median
    out: list[str] = [*header, ""]

    def ratios(metric: str, name: str) -> list[str]:
        return [
            _ratio(med(name, metric), med(SQ_SQLITE, metric)),
            _ratio(med(name, metric), med(SQ_PG, metric)),
        ]

    def table(title: str, note: str, columns: list[str], rows: list[list[str]]) -> None:
        out.extend([f"### {title}", "", note, ""] if note else [f"### {title}", ""])
        out.append("| " + " | ".join(columns) + " |")
        aligns = ["---" if c in ("system", "store", "how") else "---:" for c in columns]
        out.append("|" + "|".join(aligns) + "|")
        out.extend("| " + " | ".join(row) + " |" for row in rows)
        out.append("")

    ratio_cols = ["÷ fsq-sqlite", "÷ fsq-pg"]
    table(
        f"Enqueue, one commit per job ({sizes.enqueue:,} jobs, jobs/s)",
        "Each call commits before it returns, as in a web request.",
        ["system", "store", "jobs/s", *ratio_cols],
        [[n, by_name[n].store, _fmt(med(n, "enqueue")), *ratios("enqueue", n)] for n in names],
    )
    table(
        f"Bulk enqueue ({sizes.jobs:,} jobs, jobs/s)",
        "",
        ["system", "store", "jobs/s", *ratio_cols, "how"],
        [
            [
                n,
                by_name[n].store,
                _fmt(med(n, "bulk")),
                *ratios("bulk", n),
                "; ".join(sorted(results.notes.get(f"bulk:{n}", set()))),
            ]
            for n in names
        ],
    )

    def drain_cell(name: str, metric: str) -> str:
        cell = _fmt(med(name, metric))
        if cell == "—":
            return cell
        if results.notes.get(f"bound:{name}:{metric}"):
            cell = f"≥ {cell}"
        return f"{cell} *" if results.notes.get(f"capped:{name}:{metric}") else cell

    table(
        f"Drain a pre-filled queue of {sizes.jobs:,} no-op jobs (jobs/s)",
        "From the first finished job to the last, counted in the system's own store; "
        f"`*`: not drained within {sizes.drain_cap:g} s, rate over the jobs it finished; "
        "`≥`: drained between two counts, too fast to time at this size.",
        [
            "system",
            "store",
            "1 process",
            "2 processes",
            "2 ÷ 1",
            "1 proc ÷ fsq-sqlite",
            "1 proc ÷ fsq-pg",
        ],
        [
            [
                n,
                by_name[n].store,
                drain_cell(n, "drain1"),
                drain_cell(n, "drain2"),
                _ratio(med(n, "drain2"), med(n, "drain1")),
                *ratios("drain1", n),
            ]
            for n in names
        ],
    )
    table(
        f"Pickup latency, idle worker ({sizes.samples} jobs one at a time, ms)",
        "From `enqueue` returning to the job's first line, as the job records it.",
        ["system", "store", "p50", "p95", "p99", "p50 ÷ fsq-sqlite", "p50 ÷ fsq-pg"],
        [
            [
                n,
                by_name[n].store,
                _fmt(med(n, "p50"), 1),
                _fmt(med(n, "p95"), 1),
                _fmt(med(n, "p99"), 1),
                *ratios("p50", n),
            ]
            for n in names
            if by_name[n].latency
        ],
    )
    table(
        "Peak RSS of a worker process (MiB)",
        "VmHWM of the process (and any children it forked) after draining the queue.",
        ["system", "store", "MiB", *ratio_cols],
        [[n, by_name[n].store, _fmt(med(n, "rss"), 1), *ratios("rss", n)] for n in names],
    )

    targets: list[tuple[str, str, float | None, Callable[[float], bool], str]] = []

    def of(a: str, metric_a: str, b: str, metric_b: str) -> float | None:
        x, y = med(a, metric_a), med(b, metric_b)
        return x / y if x is not None and y else None

    targets = [
        (
            "SQLite drain, 1 process ÷ raw-sqlite",
            "≥ 0.5",
            of(SQ_SQLITE, "drain1", "raw-sqlite", "drain1"),
            lambda v: v >= 0.5,
            "x",
        ),
        (
            "SQLite one-commit enqueue ÷ raw-sqlite",
            "≥ 0.9",
            of(SQ_SQLITE, "enqueue", "raw-sqlite", "enqueue"),
            lambda v: v >= 0.9,
            "x",
        ),
        ("SQLite pickup p50", "< 5 ms", med(SQ_SQLITE, "p50"), lambda v: v < 5, " ms"),
        (
            "PostgreSQL drain, 1 process ÷ raw-psycopg",
            "≥ 0.4",
            of(SQ_PG, "drain1", "raw-psycopg", "drain1"),
            lambda v: v >= 0.4,
            "x",
        ),
        ("PostgreSQL pickup p50", "< 5 ms", med(SQ_PG, "p50"), lambda v: v < 5, " ms"),
        (
            "PostgreSQL drain, 2 processes ÷ 1",
            "≥ 1.5",
            of(SQ_PG, "drain2", SQ_PG, "drain1"),
            lambda v: v >= 1.5,
            "x",
        ),
        ("Worker peak RSS (SQLite)", "< 60 MiB", med(SQ_SQLITE, "rss"), lambda v: v < 60, " MiB"),
        ("Worker peak RSS (PostgreSQL)", "< 60 MiB", med(SQ_PG, "rss"), lambda v: v < 60, " MiB"),
    ]
    out.extend(["### flask_sqlqueue against the targets of issue 7", ""])
    out.append("| target | goal | measured | met |")
    out.append("|---|---|---:|---|")
    for label, goal, value, ok, unit in targets:
        if value is None:
            out.append(f"| {label} | {goal} | — | not measured |")
        else:
            shown = f"{value:.2f}{unit}" if unit == "x" else f"{value:.1f}{unit}"
            out.append(f"| {label} | {goal} | {shown} | {'yes' if ok(value) else '**no**'} |")
    out.append("")

    out.extend(["### How each system ran", ""])
    out.append("| system | worker command | versions |")
    out.append("|---|---|---|")
    for system in systems:
        out.append(f"| {system.name} | `{system.command()}` | {system.versions()} |")
    out.append("")
    out.append(
        f"Medians of {runs} run(s). Every figure is checked against a count in the system's "
        "own store (rows completed, result keys, finished registries, log rows); a run "
        "whose count is wrong is listed below as an error and gives no figure."
    )
    out.append("")
    errors = [
        f"- {name} / {metric}: {message}"
        for (name, metric), messages in sorted(results.errors.items())
        for message in messages
    ]
    out.extend(["### Errors", "", *(errors or ["none"]), ""])
    return "\n".join(out)

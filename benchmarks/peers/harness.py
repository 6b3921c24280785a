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
from typing import Protocol

from .common import BenchError
from .common import Workers
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

    def key(self, system: str, metric: str, concurrency: int | None) -> str:
        """The metric's key at ``concurrency``; a system measured without one has a single
        figure, which stands at every concurrency."""
        keyed = at(metric, concurrency)
        return keyed if (system, keyed) in self.values else metric

    def median(self, system: str, metric: str, concurrency: int | None = None) -> float | None:
        found = self.values.get((system, self.key(system, metric, concurrency)))
        return statistics.median(found) if found else None


def at(metric: str, concurrency: int | None) -> str:
    """The key of a figure measured at a worker concurrency: ``drain1@4``."""
    return metric if concurrency is None else f"{metric}@{concurrency}"


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


def enqueue_each(
    system: System, sizes: Sizes, results: Results, log_dir: Path, concurrency: int | None
) -> None:
    """One commit per job, as a web request does; the first (warm-up) call not timed. No
    worker runs, so there is one figure whatever the concurrency."""
    with system.fresh():
        system.enqueue_each(1)
        started = time.perf_counter()
        system.enqueue_each(sizes.enqueue)
        elapsed = time.perf_counter() - started
        _wait_count(system.pending, sizes.enqueue + 1, 5, "jobs waiting after the enqueue")
    results.add(system.name, "enqueue", sizes.enqueue / elapsed)


def bulk_then_drain(
    system: System, sizes: Sizes, results: Results, log_dir: Path, concurrency: int | None
) -> None:
    """Bulk-enqueue the queue (timed: one figure from every concurrency's fill), then drain
    it with one worker process."""
    with system.fresh():
        started = time.perf_counter()
        system.enqueue_bulk(sizes.jobs)
        elapsed = time.perf_counter() - started
        _wait_count(system.pending, sizes.jobs, 5, "jobs waiting after the bulk enqueue")
        results.add(system.name, "bulk", sizes.jobs / elapsed)
        if system.bulk_note:
            results.notes[f"bulk:{system.name}"].add(system.bulk_note)
        drain(system, 1, sizes, results, log_dir, concurrency)


def drain_two(
    system: System, sizes: Sizes, results: Results, log_dir: Path, concurrency: int | None
) -> None:
    with system.fresh():
        fill(system, sizes.jobs)
        drain(system, 2, sizes, results, log_dir, concurrency)


def fill(system: System, jobs: int) -> None:
    """Bulk-enqueue ``jobs`` jobs into the fresh store, and wait until it counts them."""
    system.enqueue_bulk(jobs)
    _wait_count(system.pending, jobs, 5, "jobs waiting after the fill")


class Watch(Protocol):
    """Readings of its own taken while a drain's workers run (benchmarks/scaling.py)."""

    def poll(self, count: int, workers: Workers) -> None:
        """After every count of finished jobs."""

    def done(self, count: int, workers: Workers) -> None:
        """After the last count, before the workers are stopped."""


def drain(
    system: System,
    processes: int,
    sizes: Sizes,
    results: Results,
    log_dir: Path,
    concurrency: int | None = None,
    watch: Watch | None = None,
) -> None:
    """Start the workers on the pre-filled queue; the rate runs from the first count seen
    above zero to the count reaching the total, so process start-up is not in it."""
    total = sizes.jobs
    metric = at(f"drain{processes}", concurrency)
    argv = system.worker_argv(concurrency)
    with running(argv, system.worker_env(), processes, log_dir) as workers:
        launched = time.monotonic()
        first_at, first_count, zero_at = 0.0, 0, launched
        changed_at, last = launched, 0
        polls = 0
        while True:
            count = system.finished()
            now = time.monotonic()
            if count > total:
                raise BenchError(f"{count} jobs finished of {total} enqueued (duplicates?)")
            if watch is not None:
                watch.poll(count, workers)
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
        if watch is not None:
            watch.done(count, workers)
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
        results.add(system.name, at("rss", concurrency), rss)
    results.add(system.name, metric, (count - first_count) / (now - first_at))


def latency(
    system: System, sizes: Sizes, results: Results, log_dir: Path, concurrency: int | None
) -> None:
    """An idle worker; one probe job at a time; from ``enqueue`` returning to the job's
    start, as the job itself records it. Each probe waits until the previous job is
    counted finished in the store, then 50 ms more, so the worker is idle again."""
    argv = system.worker_argv(concurrency)
    with system.fresh(), running(argv, system.worker_env(), 1, log_dir) as workers:
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
    for p in (50, 95, 99):
        results.add(system.name, at(f"p{p}", concurrency), percentile(samples, p))


# -- the report ----------------------------------------------------------------------------


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


def machine(
    postgres_version: str, mysql_version: str, redis_version: str | None = None
) -> list[str]:
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
        f"- SQLite {sqlite3.sqlite_version}; PostgreSQL {postgres_version}; MariaDB {mysql_version}"
        + ("" if redis_version is None else f"; Redis {redis_version} (loopback, no persistence)"),
    ]


@dataclass(frozen=True)
class Axis:
    """One line of the summary: a metric, its unit, and which way is better."""

    metric: str
    label: str
    digits: int = 0
    lower_is_better: bool = False
    per_concurrency: bool = True  # False: measured without a worker running


AXES = (
    Axis("drain1", "drain, 1 process (jobs/s)"),
    Axis("drain2", "drain, 2 processes (jobs/s)"),
    Axis("enqueue", "enqueue, one commit per job (jobs/s)", per_concurrency=False),
    Axis("bulk", "bulk enqueue (jobs/s)", per_concurrency=False),
    Axis("rss", "worker peak RSS (MiB)", 1, lower_is_better=True),
    Axis("p50", "pickup latency p50 (ms)", 1, lower_is_better=True),
)


@dataclass(frozen=True)
class Target:
    """A goal of issue 7: a figure of flask_sqlqueue's, or its ratio to ``over``."""

    label: str
    metric: str
    store: str
    bound: float
    at_least: bool  # met when ≥ bound; else when < bound
    over: str = ""  # "raw": ÷ the store's raw ceiling; a metric: ÷ flask_sqlqueue's own
    unit: str = "x"

    @property
    def goal(self) -> str:
        unit = "" if self.unit == "x" else self.unit
        return f"{'≥' if self.at_least else '<'} {self.bound:g}{unit}"


TARGETS = (
    Target("SQLite drain, 1 process ÷ raw-sqlite", "drain1", "SQLite", 0.5, True, "raw"),
    Target("SQLite one-commit enqueue ÷ raw-sqlite", "enqueue", "SQLite", 0.9, True, "raw"),
    Target("SQLite pickup p50", "p50", "SQLite", 5, False, unit=" ms"),
    Target("PostgreSQL drain, 1 process ÷ raw-psycopg", "drain1", "PostgreSQL", 0.4, True, "raw"),
    Target("PostgreSQL pickup p50", "p50", "PostgreSQL", 5, False, unit=" ms"),
    Target("PostgreSQL drain, 2 processes ÷ 1", "drain2", "PostgreSQL", 1.5, True, "drain1"),
    Target("Worker peak RSS (SQLite)", "rss", "SQLite", 60, False, unit=" MiB"),
    Target("Worker peak RSS (PostgreSQL)", "rss", "PostgreSQL", 60, False, unit=" MiB"),
)


class _Report:
    """The report's tables, read from the medians of ``results``."""

    def __init__(self, results: Results, systems: list[System], concurrencies: list[int]) -> None:
        self.results = results
        self.systems = systems
        self.concurrencies = concurrencies
        self.out: list[str] = []

    def med(self, name: str | None, metric: str, concurrency: int | None = None) -> float | None:
        return None if name is None else self.results.median(name, metric, concurrency)

    def of_kind(self, kind: str, store: str) -> str | None:
        """The flask_sqlqueue system ("sqlqueue") or the ceiling ("ceiling") on ``store``."""
        return next((s.name for s in self.systems if s.kind == kind and s.store == store), None)

    def ratios(self, system: System, metric: str, concurrency: int | None) -> list[str]:
        """The figure ÷ its store's raw ceiling, and ÷ flask_sqlqueue on its store."""
        value = self.med(system.name, metric, concurrency)
        return [
            _ratio(value, self.med(self.of_kind(kind, system.store), metric, concurrency))
            for kind in ("ceiling", "sqlqueue")
        ]

    def table(self, title: str, note: str, columns: list[str], rows: list[list[str]]) -> None:
        self.out.extend([f"### {title}", "", note, ""] if note else [f"### {title}", ""])
        self.out.append("| " + " | ".join(columns) + " |")
        left = ("system", "store", "how", "axis", "best peer, same store", "best peer, any store")
        self.out.append("|" + "|".join("---" if c in left else "---:" for c in columns) + "|")
        self.out.extend("| " + " | ".join(row) + " |" for row in rows)
        self.out.append("")

    def best_peer(self, axis: Axis, concurrency: int | None, store: str | None) -> str:
        found = [
            (value, s.name)
            for s in self.systems
            if s.kind == "peer" and store in (None, s.store)
            if (value := self.med(s.name, axis.metric, concurrency)) is not None
        ]
        if not found:
            return ""
        return (min if axis.lower_is_better else max)(found)[1]

    def summary(self) -> None:
        rows = []
        for axis in AXES:
            levels: list[int | None] = [*self.concurrencies] if axis.per_concurrency else [None]
            for sq in (s for s in self.systems if s.kind == "sqlqueue"):
                for c in levels:
                    value = self.med(sq.name, axis.metric, c)
                    row = [
                        axis.label,
                        sq.store,
                        "—" if c is None else str(c),
                        _fmt(value, axis.digits),
                    ]
                    for store in (sq.store, None):
                        peer = self.best_peer(axis, c, store)
                        other = self.med(peer or None, axis.metric, c)
                        shown = f"{_fmt(other, axis.digits)} {peer}" if peer else "—"
                        row += [shown, _ratio(value, other)]
                    raw = self.med(self.of_kind("ceiling", sq.store), axis.metric, c)
                    rows.append([*row, _fmt(raw, axis.digits), _ratio(value, raw)])
        self.table(
            "Summary: flask_sqlqueue, the best peer, the raw ceiling",
            "Every ratio is flask_sqlqueue's figure ÷ the other's, so above 1 is better for "
            "rates and below 1 is better for RSS and latency. The enqueues run no worker, "
            "so they have no concurrency. No peer runs on MariaDB.",
            [
                "axis",
                "store",
                "concurrency",
                "flask_sqlqueue",
                "best peer, same store",
                "÷",
                "best peer, any store",
                "÷",
                "raw ceiling",
                "÷",
            ],
            rows,
        )

    def drain_cell(self, name: str, metric: str, concurrency: int | None) -> str:
        notes = self.results.notes
        cell = _fmt(self.med(name, metric, concurrency))
        if cell == "—":
            return cell
        key = self.results.key(name, metric, concurrency)
        if notes.get(f"bound:{name}:{key}"):
            cell = f"≥ {cell}"
        return f"{cell} *" if notes.get(f"capped:{name}:{key}") else cell

    def drain_row(self, s: System, c: int) -> list[str]:
        (raw1, fsq1), (raw2, fsq2) = self.ratios(s, "drain1", c), self.ratios(s, "drain2", c)
        return [
            s.name,
            s.store,
            self.drain_cell(s.name, "drain1", c),
            self.drain_cell(s.name, "drain2", c),
            _ratio(self.med(s.name, "drain2", c), self.med(s.name, "drain1", c)),
            *(raw1, raw2, fsq1, fsq2),
        ]

    def at_concurrency(self, c: int, sizes: Sizes) -> None:
        once = ", ".join(s.name for s in self.systems if not s.concurrent)
        same = (
            f" {once}: no concurrency setting, the same figures at every concurrency."
            if once
            else ""
        )
        med = self.med
        polls = (
            " On MariaDB an idle flask_sqlqueue worker on the producer's host is woken by a "
            "same-host socket (MariaDB has no NOTIFY); one on another host would poll, every "
            "`--poll-interval` (1 s by default)."
            if any(s.kind == "sqlqueue" and s.store == "MariaDB" for s in self.systems)
            else ""
        )
        self.table(
            f"Drain a pre-filled queue of {sizes.jobs:,} no-op jobs at concurrency {c} (jobs/s)",
            "From the first finished job to the last, counted in the system's own store; "
            f"`*`: not drained within {sizes.drain_cap:g} s, rate over the jobs it finished; "
            "`≥`: drained between two counts, too fast to time at this size; "
            "÷ raw and ÷ fsq: over the raw ceiling and flask_sqlqueue on the same store." + same,
            [
                "system",
                "store",
                "1 process",
                "2 processes",
                "2 ÷ 1",
                "1 proc ÷ raw",
                "2 proc ÷ raw",
                "1 proc ÷ fsq",
                "2 proc ÷ fsq",
            ],
            [self.drain_row(s, c) for s in self.systems],
        )
        self.table(
            f"Pickup latency, idle worker at concurrency {c} "
            f"({sizes.samples} jobs one at a time, ms)",
            "From `enqueue` returning to the job's first line, as the job records it." + polls,
            ["system", "store", "p50", "p95", "p99", "p50 ÷ fsq"],
            [
                [
                    s.name,
                    s.store,
                    *(_fmt(med(s.name, f"p{p}", c), 1) for p in (50, 95, 99)),
                    self.ratios(s, "p50", c)[1],
                ]
                for s in self.systems
                if s.latency
            ],
        )
        self.table(
            f"Peak RSS of a worker process at concurrency {c} (MiB)",
            "VmHWM of the process (and any children it forked) after draining the queue.",
            ["system", "store", "MiB", "÷ raw", "÷ fsq"],
            [
                [s.name, s.store, _fmt(med(s.name, "rss", c), 1), *self.ratios(s, "rss", c)]
                for s in self.systems
            ],
        )

    def enqueues(self, sizes: Sizes) -> None:
        notes = self.results.notes
        self.table(
            f"Enqueue, one commit per job ({sizes.enqueue:,} jobs, jobs/s)",
            "Each call commits before it returns, as in a web request. ÷ raw and ÷ fsq: over "
            "the raw ceiling and flask_sqlqueue on the same store.",
            ["system", "store", "jobs/s", "÷ raw", "÷ fsq"],
            [
                [
                    s.name,
                    s.store,
                    _fmt(self.med(s.name, "enqueue")),
                    *self.ratios(s, "enqueue", None),
                ]
                for s in self.systems
            ],
        )
        self.table(
            f"Bulk enqueue ({sizes.jobs:,} jobs, jobs/s)",
            "The median of every fill before a one-process drain, at each concurrency.",
            ["system", "store", "jobs/s", "÷ raw", "÷ fsq", "how"],
            [
                [
                    s.name,
                    s.store,
                    _fmt(self.med(s.name, "bulk")),
                    *self.ratios(s, "bulk", None),
                    "; ".join(sorted(notes.get(f"bulk:{s.name}", set()))),
                ]
                for s in self.systems
            ],
        )

    def targets(self) -> None:
        self.out.extend(["### flask_sqlqueue against the targets of issue 7", ""])
        self.out.append(
            "| target | goal | " + " | ".join(f"concurrency {c}" for c in self.concurrencies) + " |"
        )
        self.out.append("|---|---|" + "---:|" * len(self.concurrencies))
        for target in TARGETS:
            cells = []
            for c in self.concurrencies:
                sq = self.of_kind("sqlqueue", target.store)
                value = self.med(sq, target.metric, c)
                if target.over:
                    over = self.of_kind("ceiling", target.store) if target.over == "raw" else sq
                    base = self.med(over, target.metric if target.over == "raw" else target.over, c)
                    value = value / base if value is not None and base else None
                if value is None:
                    cells.append("—")
                    continue
                shown = f"{value:.2f}x" if target.unit == "x" else f"{value:.1f}{target.unit}"
                met = value >= target.bound if target.at_least else value < target.bound
                cells.append(f"{shown} {'yes' if met else '**no**'}")
            self.out.append(f"| {target.label} | {target.goal} | " + " | ".join(cells) + " |")
        self.out.append("")

    def commands(self) -> None:
        self.out.extend(["### How each system ran", ""])
        self.out.append("| system | concurrency | worker command | versions |")
        self.out.append("|---|---|---|---|")
        for s in self.systems:
            if s.concurrent:
                for c in self.concurrencies:
                    self.out.append(f"| {s.name} | {c} | `{s.command(c)}` | {s.versions()} |")
            else:
                self.out.append(
                    f"| {s.name} | {s.concurrency_note} | `{s.command()}` | {s.versions()} |"
                )
        notes = [
            f"- {s.name}: {s.concurrency_note}"
            for s in self.systems
            if s.concurrent and s.concurrency_note
        ]
        self.out.extend(["", *notes, ""] if notes else [""])


def report(
    results: Results,
    systems: list[System],
    sizes: Sizes,
    runs: int,
    concurrencies: list[int],
    header: list[str],
) -> str:
    r = _Report(results, systems, concurrencies)
    r.out.extend([*header, ""])
    r.summary()
    r.enqueues(sizes)
    for c in concurrencies:
        r.at_concurrency(c, sizes)
    r.targets()
    r.commands()
    r.out.append(
        f"Medians of {runs} run(s). Every figure is checked against a count in the system's "
        "own store (rows completed, result keys, finished registries, log rows); a run "
        "whose count is wrong is listed below as an error and gives no figure."
    )
    r.out.append("")
    errors = [
        f"- {name} / {metric}: {message}"
        for (name, metric), messages in sorted(results.errors.items())
        for message in messages
    ]
    r.out.extend(["### Errors", "", *(errors or ["none"]), ""])
    return "\n".join(r.out)

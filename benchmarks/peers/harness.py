"""The measurements, run the same way on every system (report.py turns them into tables).

Each measurement takes a fresh store and output file at one :class:`Setting`: the system's
defaults, or the matched settings at a concurrency. A fill is one commit per job at the
defaults (timed: the enqueue figure) and the bulk enqueue at the matched settings (timed:
the bulk figure). Finished jobs are the lines of the output file, for every system.
"""

from __future__ import annotations

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
from .probe import stamps
from .systems import Setting
from .systems import System

# Seconds between counts while a queue drains: 0.5% of the time since the spawn, within
# bounds, so the end is known to within 0.5% and counting costs the machine little.
POLL_SHARE, POLL_MIN, POLL_MAX = 0.005, 0.005, 0.25
STALL = 15.0  # seconds without a newly finished job that make a drain an error
FIRST_JOB_TIMEOUT = 120.0  # seconds from spawn without a finished job that are an error
PROBE_GAP = 0.05  # seconds after a probe started before the next is enqueued


@dataclass
class Sizes:
    jobs: int
    samples: int
    drain_cap: float  # seconds from spawn after which a drain's rate is taken as it stands


@dataclass
class Results:
    """Every figure of every run, and every error, by system, metric and setting."""

    values: dict[tuple[str, str, str], list[float]] = field(
        default_factory=lambda: defaultdict(list)
    )
    errors: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    # (system, metric, setting key) → "capped: 800 of 1,000", "lower bound"
    marks: dict[tuple[str, str, str], set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, system: str, metric: str, setting: Setting, value: float) -> None:
        self.values[(system, metric, setting.key)].append(value)

    def mark(self, system: str, metric: str, setting: Setting, note: str) -> None:
        self.marks[(system, metric, setting.key)].add(note)

    def key(self, system: str, metric: str, setting: Setting) -> str:
        """The setting's key; a system matched without a concurrency setting has a single
        figure, which stands at every concurrency."""
        if (system, metric, setting.key) in self.values or not setting.matched:
            return setting.key
        return Setting(matched=True).key

    def median(self, system: str | None, metric: str, setting: Setting) -> float | None:
        if system is None:
            return None
        found = self.values.get((system, metric, self.key(system, metric, setting)))
        return statistics.median(found) if found else None

    def marks_of(self, system: str, metric: str, setting: Setting) -> set[str]:
        return self.marks.get((system, metric, self.key(system, metric, setting)), set())


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


def fill(system: System, jobs: int, results: Results | None = None, *, bulk: bool) -> None:
    """Enqueue ``jobs`` jobs into the fresh store, one commit each or in bulk, and wait
    until the store counts them waiting; the rate goes into ``results`` (``enqueue`` or
    ``bulk``) if given."""
    started = time.perf_counter()
    (system.enqueue_bulk if bulk else system.enqueue_each)(jobs)
    elapsed = time.perf_counter() - started
    _wait_count(system.pending, jobs, 10, "jobs waiting after the fill")
    if results is not None:
        results.add(system.name, "bulk" if bulk else "enqueue", system.setting, jobs / elapsed)


def fill_and_drain(
    processes: int, system: System, setting: Setting, sizes: Sizes, results: Results, log: Path
) -> None:
    """A fresh store filled the setting's way (timed), then drained by ``processes``
    worker processes."""
    with system.fresh(setting):
        fill(system, sizes.jobs, results, bulk=setting.matched)
        drain(system, processes, sizes, results, log)


class Watch(Protocol):
    """Readings of its own taken while a drain's workers run (benchmarks/scaling.py)."""

    def poll(self, count: int, workers: Workers) -> None:
        """After every count of finished jobs."""

    def done(self, count: int, workers: Workers) -> None:
        """After the last count, before the workers are stopped."""


@dataclass
class Drained:
    """What a drain's counts saw, in monotonic seconds."""

    spawned: float
    count: int = 0  # the last count
    at: float = 0.0  # when it was read
    first_count: int = 0  # the first count above zero
    first_at: float = 0.0
    zero_at: float = 0.0  # the last count of zero
    capped: bool = False


def _count_until_done(
    system: System, workers: Workers, total: int, cap: float, watch: Watch | None
) -> Drained:
    """Count the output file until every job has run (or ``cap`` seconds from spawn)."""
    seen = Drained(workers.spawned, zero_at=workers.spawned)
    changed_at, last, polls = workers.spawned, 0, 0
    while True:
        count, now = system.finished(), time.monotonic()
        if count > total:
            raise BenchError(f"{count} jobs finished of {total} enqueued (duplicates?)")
        if watch is not None:
            watch.poll(count, workers)
        seen.count, seen.at = count, now
        since = now - seen.spawned
        if not seen.first_at:
            if count > 0:
                seen.first_at, seen.first_count = now, count
            else:
                seen.zero_at = now
        if count == total:
            return seen
        if count != last:
            changed_at, last = now, count
        elif seen.first_at and now - changed_at > STALL:
            raise BenchError(
                f"stalled: {count} of {total} jobs finished, none in the last {STALL:g} s"
            )
        if not seen.first_at and since > min(cap, FIRST_JOB_TIMEOUT):
            raise BenchError(f"no job finished within {since:.0f} s of spawning the workers")
        if since > cap:
            seen.capped = True
            return seen
        polls += 1
        if polls % 20 == 0:
            workers.check_alive()
        time.sleep(min(POLL_MAX, max(POLL_MIN, POLL_SHARE * since)))


def drain(
    system: System,
    processes: int,
    sizes: Sizes,
    results: Results,
    log_dir: Path,
    watch: Watch | None = None,
) -> None:
    """Spawn ``processes`` workers together on the pre-filled queue and count its jobs
    done. Figures: ``drain{p}``, jobs ÷ seconds from the spawn to the last line;
    ``steady{p}``, from the first line seen to the last; ``first{p}``, seconds from the
    spawn to the first line; with one process ``rss``, the worker tree's peak RSS."""
    total, setting = sizes.jobs, system.setting
    argv = system.worker_argv(setting)
    with running(argv, system.worker_env(), processes, log_dir) as workers:
        seen = _count_until_done(system, workers, total, sizes.drain_cap, watch)
        if watch is not None:
            watch.done(seen.count, workers)
        rss = workers.peak_rss_mb()
    system.check_output(complete=not seen.capped)  # after the stop: every line is in
    first_at, first_count = seen.first_at, seen.first_count
    if seen.count == first_count == total:
        # All done between two counts: all we know of the steady rate is a lower bound.
        results.mark(system.name, f"steady{processes}", setting, "lower bound")
        first_at, first_count = seen.zero_at, 0
    elif seen.count == first_count:
        raise BenchError(f"only {seen.count} jobs finished; too few to time")
    if seen.capped:
        for metric in (f"drain{processes}", f"steady{processes}"):
            results.mark(system.name, metric, setting, f"{seen.count:,} of {total:,}")
    if processes == 1:
        results.add(system.name, "rss", setting, rss)
    name = system.name
    results.add(name, f"drain{processes}", setting, seen.count / (seen.at - seen.spawned))
    steady = (seen.count - first_count) / (seen.at - first_at)
    results.add(name, f"steady{processes}", setting, steady)
    results.add(name, f"first{processes}", setting, seen.first_at - seen.spawned)


def _wait_stamp(path: str, workers: Workers, index: int) -> float:
    deadline = time.monotonic() + 60
    while (started := read_stamp(path)) is None:
        if time.monotonic() > deadline:
            raise BenchError(f"probe {index} did not start within 60 s")
        workers.check_alive()
        time.sleep(0.0005)
    return started


def latency(system: System, setting: Setting, sizes: Sizes, results: Results, log: Path) -> None:
    """An idle worker; one probe job at a time; from just before the enqueue call to the
    job's start, as the job itself records it. Each probe is enqueued ``PROBE_GAP``
    after the previous one started, so the worker has finished it and waits again; the
    first is a warm-up. Every probe must have run exactly once."""
    folder = log / "probes"
    folder.mkdir()
    paths = [str(folder / f"probe-{index}") for index in range(sizes.samples + 1)]
    samples: list[float] = []
    with system.fresh(setting):
        argv = system.worker_argv(setting)
        with running(argv, system.worker_env(), 1, log) as workers:
            workers.wait_idle()
            for index, path in enumerate(paths):
                before = time.time()
                system.enqueue_probe(path)
                started = _wait_stamp(path, workers, index)
                if index:
                    samples.append((started - before) * 1000)
                time.sleep(PROBE_GAP)
    runs = [stamps(path) for path in paths]
    if any(n != 1 for n in runs):
        wrong = {index: n for index, n in enumerate(runs) if n != 1}
        raise BenchError(f"probes that did not run exactly once (probe: runs): {wrong}")
    for p in (50, 95, 99):
        results.add(system.name, f"p{p}", setting, percentile(samples, p))

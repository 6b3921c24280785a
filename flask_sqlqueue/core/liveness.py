"""Telling a lost worker from a live one on clocks that a wall-clock step cannot move.

A worker's heartbeat stamps its row with the queue's time (``Store.now()``) and, where
the machine has one, with its boot clock. A rescuer judges each worker by the best clock
the two of them share:

- **The same boot of the same machine** (every SQLite worker; server workers on the
  rescuer's host): Linux's ``CLOCK_BOOTTIME``, named by ``/proc/sys/kernel/random/boot_id``.
  Every process of one boot reads the same clock, and no step of the wall clock, NTP
  correction or suspend makes it jump: a worker is lost when its last heartbeat is more
  than ``stale_after`` seconds behind on it.
- **Another machine, or no boot clock** (other operating systems): the queue's time. On
  PostgreSQL and MariaDB it is the database's clock in every process, read once a
  minute and carried forward by a steady clock in between (``Store.now()``), so a step of
  the rescuer's, a worker's or a producer's wall clock moves none of the timestamps. A
  running worker, before it rescues anything judged this way, also watches the
  heartbeats itself (:class:`HeartbeatWatch`): it takes back the jobs of a worker only
  once it has seen that worker's heartbeat unchanged for ``stale_after`` seconds on its
  own steady clock. That holds even if the database server's own clock steps, or on a
  machine without a boot clock, where SQLite's queue time is the host's wall clock.

``flask queue rescue`` runs once and cannot watch: it judges by the clocks alone.

A rescuer of the worker's own boot also reads the worker's :class:`BeatFiles`, stamped
by a thread that never waits for the database: a worker whose heartbeat write waits
behind a busy database is not lost while its file is fresh.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from .models import workers

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def steady() -> float:
    """Seconds on a clock that never steps: the boot clock (which also counts time
    suspended) where there is one, else ``time.monotonic()``."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


@dataclass(frozen=True, slots=True)
class BootClock:
    """The clock every process of one boot of one machine shares (Linux's boot clock)."""

    #: This boot's id: equal in every process of the boot, different after a reboot
    #: and on every other machine.
    id: str

    @classmethod
    def detect(cls) -> BootClock | None:
        """This machine's boot clock; ``None`` where there is none (not Linux)."""
        if _BOOTTIME is None:
            return None
        try:
            boot_id = BOOT_ID_PATH.read_text().strip()
            time.clock_gettime(_BOOTTIME)
        except OSError:
            return None
        return cls(boot_id) if boot_id else None

    def now_us(self) -> int:
        """Microseconds since this machine booted."""
        assert _BOOTTIME is not None
        return time.clock_gettime_ns(_BOOTTIME) // 1000

    def cutoff(self, stale_after: float) -> BootCutoff:
        """The reading before which a heartbeat of this boot is ``stale_after`` old."""
        return BootCutoff(self.id, self.now_us() - round(stale_after * 1_000_000))

    def stamp(self) -> dict[str, Any]:
        """A heartbeat's boot columns."""
        return {"boot_id": self.id, "boot_clock_us": self.now_us()}


@dataclass(frozen=True, slots=True)
class BootCutoff:
    """A rescuer's boot, and the boot-clock reading before which its workers are lost."""

    boot_id: str
    before_us: int


def same_boot(boot_id: str | None) -> sa.ColumnElement[bool]:
    """Worker rows of boot ``boot_id``, judged by the boot clock. Never NULL, so it can
    be negated."""
    if boot_id is None:
        return sa.false()
    return sa.and_(workers.c.boot_id.is_not(None), workers.c.boot_id == boot_id)


def elsewhere(boot_id: str | None) -> sa.ColumnElement[bool]:
    """Worker rows judged by the queue's time: another boot than ``boot_id``, or none
    recorded. Never NULL."""
    if boot_id is None:
        return sa.true()
    return sa.or_(workers.c.boot_id.is_(None), workers.c.boot_id != boot_id)


def heartbeat_fresh(stale_before: Any, boot: BootCutoff | None) -> sa.ColumnElement[bool]:
    """Worker rows whose last heartbeat is recent, each judged by the clock it shares
    with the rescuer (see the module docstring). Never NULL, so it can be negated."""
    boot_id = None if boot is None else boot.boot_id
    by_time = sa.and_(elsewhere(boot_id), workers.c.last_heartbeat_at >= stale_before)
    if boot is None:
        return by_time
    by_boot = sa.and_(
        same_boot(boot_id),
        workers.c.boot_clock_us.is_not(None),
        workers.c.boot_clock_us >= boot.before_us,
    )
    return sa.or_(by_boot, by_time)


class HeartbeatWatch:
    """What one rescuer has seen of the heartbeats it cannot judge by the boot clock.

    Each look records, per worker, its last heartbeat time as a mark; a heartbeat always
    writes a new one. A worker is silent once its mark has not changed for the given
    seconds of this process's steady clock: no clock anywhere else enters the decision.
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Any, float]] = {}

    def look(self, marks: Iterable[tuple[str, Any]], now: float | None = None) -> None:
        """Record the current marks (``(worker id, mark)``) of every watched worker."""
        now = steady() if now is None else now
        current = dict(marks)
        seen = self._seen
        self._seen = {
            worker: seen[worker] if worker in seen and seen[worker][0] == mark else (mark, now)
            for worker, mark in current.items()
        }

    def silent(self, seconds: float, now: float | None = None) -> frozenset[str]:
        """The workers whose mark this watch has seen unchanged for ``seconds``."""
        now = steady() if now is None else now
        return frozenset(w for w, (_, since) in self._seen.items() if now - since >= seconds)


class BeatFiles:
    """Heartbeats that never wait for the database: a file per worker, in a folder of
    the database's on this host (``core/wakeup.beats_dir``), holding its boot and a
    boot-clock reading.

    A worker's heartbeat is a write; on a busy database (SQLite's one writer lock under
    a heavy load) it may wait behind the claims and outcomes of the very jobs it vouches
    for, long enough to look stale. A thread of the worker's that does nothing else
    also stamps its file; a rescuer of the same boot takes a worker whose row looks
    stale for lost only if its file is stale too. A paused, killed or frozen worker
    stamps nothing: the file changes none of those verdicts.
    """

    def __init__(self, folder: Path, boot: BootClock) -> None:
        self.folder = folder
        self.boot = boot

    def path(self, worker_id: str) -> Path:
        return self.folder / ("beat-" + re.sub(r"[^A-Za-z0-9._-]", "_", worker_id))

    def beat(self, worker_id: str) -> None:
        """Stamp ``worker_id``'s file now (a whole new file: a reader never sees half)."""
        path = self.path(worker_id)
        self.folder.parent.mkdir(mode=0o700, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        scratch = path.with_name(path.name + ".new")
        scratch.write_text(f"{self.boot.id} {self.boot.now_us()}\n")
        os.replace(scratch, path)

    def fresh(self, worker_ids: Iterable[str], stale_after: float) -> set[str]:
        """Those of ``worker_ids`` whose file was stamped on this boot within
        ``stale_after`` seconds."""
        before = self.boot.cutoff(stale_after).before_us
        found = set()
        for worker_id in worker_ids:
            try:
                boot_id, reading = self.path(worker_id).read_text().split()
                if boot_id == self.boot.id and int(reading) >= before:
                    found.add(worker_id)
            except (OSError, ValueError):
                continue  # none, or not one of ours: the row alone decides
        return found

    def remove(self, worker_id: str) -> None:
        with contextlib.suppress(OSError):
            self.path(worker_id).unlink()

    def prune(self, live: Iterable[str], older_than: float = 60.0) -> None:
        """Remove the files of workers not among ``live`` (gone, or declared lost: one
        that comes back beats under a new id) untouched for ``older_than`` seconds."""
        keep = {self.path(worker_id).name for worker_id in live}
        cutoff = time.time() - older_than
        with contextlib.suppress(OSError):
            for path in self.folder.glob("beat-*"):
                with contextlib.suppress(OSError):
                    if path.name not in keep and path.stat().st_mtime < cutoff:
                        path.unlink()

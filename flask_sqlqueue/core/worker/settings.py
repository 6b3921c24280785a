"""How a worker runs: :class:`WorkerOptions`, read by every part of the worker."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

from ...config import default
from ...exceptions import ConfigurationError
from ..isolation import resident_memory


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs. Every field has the CLI flag of the same name, whose default
    is the field's (``stale_after``'s is ``SQLQUEUE_STALE_AFTER``'s)."""

    #: Queues to serve; empty means every queue.
    queues: tuple[str, ...] = ()
    #: Job threads in this process.
    concurrency: int = 1
    #: Seconds between polls when idle (an enqueue in this process wakes it at once).
    poll_interval: float = 1.0
    #: Seconds without a heartbeat after which a worker's running jobs are rescued.
    stale_after: float = default("SQLQUEUE_STALE_AFTER")
    #: Seconds to let running jobs finish after a stop is asked for.
    grace: float = 30.0
    #: Run every job in a child process, this many at once (0: jobs run on threads).
    #: Needs a worker given a ``loader``; ``concurrency`` then follows it.
    processes: int = 0
    #: At most this many jobs claimed ahead of the free threads while recent jobs are
    #: short (core/worker/dispatch.py); 0 claims only for free threads.
    claim_ahead: int = 256
    #: A child process exits after running this many attempts and is replaced (0: never),
    #: so a task that leaks memory cannot grow a child forever. Its successor starts
    #: while it runs its last attempt.
    max_jobs_per_child: int = 0
    #: A child process whose resident memory is over this many MiB after an attempt is
    #: replaced (0: never); read from ``/proc``, so only where there is one (Linux).
    max_memory_per_child: int = 0
    #: Idle child processes kept started beyond the running ones (0: none), so that a
    #: child killed during an attempt (or recycled) leaves no slot waiting for a fresh
    #: interpreter: the next job takes a spare that has loaded the app already.
    spare_children: int = 0

    def __post_init__(self) -> None:
        if type(self.processes) is not int or self.processes < 0:
            raise ConfigurationError(f"processes must be 0 or more, got {self.processes!r}.")
        if self.processes:
            if self.concurrency not in (1, self.processes):
                raise ConfigurationError(
                    "Give processes or concurrency, not both: with processes=N the worker "
                    "runs N jobs at once, each in a child process."
                )
            object.__setattr__(self, "concurrency", self.processes)
        if type(self.max_jobs_per_child) is not int or self.max_jobs_per_child < 0:
            raise ConfigurationError(
                f"max_jobs_per_child must be 0 or more, got {self.max_jobs_per_child!r}."
            )
        if type(self.max_memory_per_child) is not int or self.max_memory_per_child < 0:
            raise ConfigurationError(
                f"max_memory_per_child must be 0 or more MiB, got {self.max_memory_per_child!r}."
            )
        if type(self.spare_children) is not int or self.spare_children < 0:
            raise ConfigurationError(
                f"spare_children must be 0 or more, got {self.spare_children!r}."
            )
        if self.max_memory_per_child and resident_memory(os.getpid()) is None:
            raise ConfigurationError(
                "max_memory_per_child reads a child's resident memory from /proc/<pid>/status, "
                f"which this system ({sys.platform}) does not have; use max_jobs_per_child."
            )
        if type(self.claim_ahead) is not int or self.claim_ahead < 0:
            raise ConfigurationError(f"claim_ahead must be 0 or more, got {self.claim_ahead!r}.")
        if type(self.concurrency) is not int or self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be 1 or more, got {self.concurrency!r}.")
        for name in ("poll_interval", "stale_after", "grace"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be zero or more seconds, got {value!r}.")
        if self.poll_interval <= 0:
            raise ConfigurationError("poll_interval must be more than zero seconds.")

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, min(self.stale_after / 4, 15.0))

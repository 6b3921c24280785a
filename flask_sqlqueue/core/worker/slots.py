"""The slots of a worker's concurrency: which claimed jobs it holds, from the claim until
the outcome is recorded."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Slots:
    """The jobs a worker claimed and is not done with, each filling one of its
    ``concurrency`` slots.

    A job whose task returned is *held* while its success waits for the next claim's
    transaction (the group commit): it still fills its slot, so the worker never holds
    more running jobs than it has threads, but its task is over, so a claim's linger does
    not wait for it and the shutdown does not hand it back.
    """

    def __init__(self) -> None:
        # Guards _running and _held: the dispatcher claims and frees, job threads finish
        # and hold, the heartbeat reads. Nothing but dict and set updates happens under
        # it. Outcomes take it inside their own lock (hold), never the other way round.
        self._lock = threading.Lock()
        self._running: dict[int, str] = {}  # job id -> claim token
        self._held: set[int] = set()

    def claimed(self, token: str, ids: Iterable[int], *, recorded: Iterable[int] = ()) -> None:
        """Fill a slot for each job claimed with ``token``, and free the slots of the held
        jobs in ``recorded``, whose successes the claim's transaction recorded."""
        with self._lock:
            self._free(recorded)
            for job_id in ids:
                self._running[job_id] = token

    def hold(self, job_id: int) -> None:
        """Keep the slot of ``job_id``, whose task returned, until :meth:`release`."""
        with self._lock:
            self._held.add(job_id)

    def finished(self, job_id: int) -> None:
        """The attempt of ``job_id`` is over: free its slot, unless it is held."""
        with self._lock:
            if job_id not in self._held:
                self._running.pop(job_id, None)

    def release(self, ids: Iterable[int]) -> None:
        """Free the slots of held jobs whose successes are recorded."""
        with self._lock:
            self._free(ids)

    def _free(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            self._held.discard(job_id)
            self._running.pop(job_id, None)

    def count(self) -> int:
        """Slots filled, held ones included."""
        with self._lock:
            return len(self._running)

    def over(self, ids: Iterable[int]) -> bool:
        """Whether the task of every job in ``ids`` is over (held, or its slot freed)."""
        with self._lock:
            return all(i in self._held or i not in self._running for i in ids)

    def unfinished(self) -> dict[int, str]:
        """The jobs whose tasks still run, with their claim tokens."""
        with self._lock:
            return {i: t for i, t in self._running.items() if i not in self._held}

    def ids(self) -> list[int]:
        """Every job filling a slot, in id order."""
        with self._lock:
            return sorted(self._running)

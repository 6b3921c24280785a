"""The jobs a worker holds, from the claim until the outcome is recorded: which wait in
its buffer, which run, how long they take."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

#: Weight of the newest attempt in :meth:`Slots.typical`: about the last ten count.
_SMOOTHING = 0.1


class Slots:
    """The jobs a worker claimed and is not done with.

    A claimed job first *waits* in the worker's buffer (jobs claimed ahead, beyond the
    free threads: core/worker/dispatch.py), then *runs* on a job thread from
    :meth:`start`. A job whose task returned is *held* while its success waits for the
    next claim's transaction (the group commit): its task is over, so a claim's linger
    does not wait for it and the shutdown does not hand it back, but it is still counted
    until its outcome is recorded.
    """

    def __init__(self) -> None:
        # Guards every field below: the dispatcher claims, frees and takes back, job
        # threads start, finish and hold, the heartbeat reads. Nothing but dict and set
        # updates happens under it. Outcomes take it inside their own lock (hold), never
        # the other way round.
        self._lock = threading.Lock()
        self._claimed: dict[int, str] = {}  # job id -> claim token
        self._waiting: set[int] = set()  # claimed, not started
        # Running: job id -> (claim token, time.monotonic() at its start).
        self._started: dict[int, tuple[str, float]] = {}
        self._held: set[int] = set()
        self._typical: float | None = None
        # Every job held since the last heartbeat that went through (see :meth:`beat`).
        self._since_beat: set[int] = set()

    def claimed(self, token: str, ids: Iterable[int], *, recorded: Iterable[int] = ()) -> None:
        """Count the jobs claimed with ``token`` as waiting, and free the held jobs in
        ``recorded``, whose successes the claim's transaction recorded.

        A job may be claimed again while the thread of its last attempt is still
        finishing (a failure makes it pending before the thread is done): every call
        about an attempt names its token, so the old attempt's end leaves the new one be.
        """
        with self._lock:
            self._free(recorded)
            for job_id in ids:
                self._claimed[job_id] = token
                self._waiting.add(job_id)
                self._since_beat.add(job_id)

    def start(self, job_id: int, token: str) -> bool:
        """A job thread starts the attempt of ``job_id`` claimed with ``token``;
        ``False`` (and it must not run) once :meth:`take_back` took it back."""
        with self._lock:
            # The token too: a job taken back may be claimed again before a job thread
            # reaches the old attempt.
            if job_id not in self._waiting or self._claimed.get(job_id) != token:
                return False
            self._waiting.discard(job_id)
            self._started[job_id] = (token, time.monotonic())
            return True

    def hold(self, job_id: int, token: str) -> None:
        """Keep the attempt of ``job_id`` claimed with ``token``, whose task returned,
        counted until :meth:`release`."""
        with self._lock:
            if self._claimed.get(job_id) == token:
                self._held.add(job_id)
            self._ended(job_id, token)

    def finished(self, job_id: int, token: str) -> None:
        """The attempt of ``job_id`` claimed with ``token`` is over: forget it, unless
        it is held (or the job was claimed again since)."""
        with self._lock:
            self._ended(job_id, token)
            if job_id not in self._held and self._claimed.get(job_id) == token:
                del self._claimed[job_id]

    def _ended(self, job_id: int, token: str) -> None:
        began = self._started.get(job_id)
        if began is not None and began[0] == token:
            del self._started[job_id]
            took = time.monotonic() - began[1]
            old = self._typical
            self._typical = took if old is None else old + _SMOOTHING * (took - old)

    def release(self, ids: Iterable[int]) -> None:
        """Forget held jobs whose successes are recorded."""
        with self._lock:
            self._free(ids)

    def _free(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            self._held.discard(job_id)
            self._claimed.pop(job_id, None)

    def take_back(self) -> dict[int, str]:
        """Forget the jobs still waiting and return them with their claim tokens, for
        the caller to hand back; none of them starts after this."""
        with self._lock:
            back = {i: self._claimed.pop(i) for i in sorted(self._waiting) if i in self._claimed}
            self._waiting.clear()
            return back

    def restore(self, back: dict[int, str]) -> None:
        """Count the jobs of :meth:`take_back` as waiting again (their hand-back failed)."""
        with self._lock:
            self._claimed.update(back)
            self._waiting.update(back)

    def count(self) -> int:
        """Jobs held in any way: waiting, running, or their success held."""
        with self._lock:
            return len(self._claimed)

    def waiting(self) -> int:
        """Jobs claimed and not started yet."""
        with self._lock:
            return len(self._waiting)

    def busy(self) -> int:
        """Job threads taken: jobs running, and those whose success is held."""
        with self._lock:
            return len(self._claimed) - len(self._waiting)

    def over(self, ids: Iterable[int]) -> bool:
        """Whether the task of every job in ``ids`` is over (held, or forgotten)."""
        with self._lock:
            return all(i in self._held or i not in self._claimed for i in ids)

    def stalled(self, after: float, threads: int) -> bool:
        """Whether jobs wait while all ``threads`` run jobs that have run for more than
        ``after`` seconds: the buffer's jobs would wait behind long ones."""
        with self._lock:
            if not self._waiting or len(self._started) < threads:
                return False
            oldest_allowed = time.monotonic() - after
            return all(began < oldest_allowed for _, began in self._started.values())

    def longest(self) -> float:
        """Seconds the longest-running job has run (0 when none runs)."""
        with self._lock:
            if not self._started:
                return 0.0
            return time.monotonic() - min(began for _, began in self._started.values())

    def typical(self) -> float | None:
        """A smoothed duration of the recent attempts, from a thread's start to the
        task's end; ``None`` before the first."""
        with self._lock:
            return self._typical

    def unfinished(self) -> dict[int, str]:
        """The jobs whose tasks still run or wait, with their claim tokens."""
        with self._lock:
            return {i: t for i, t in self._claimed.items() if i not in self._held}

    def since_beat(self) -> list[int]:
        """Every job held since the last :meth:`beat`, some maybe done by now: a worker
        declared dead meanwhile lost no job but these."""
        with self._lock:
            return sorted(self._since_beat)

    def beat(self) -> None:
        """A heartbeat was written: from here on, only the jobs held now and those
        claimed later count in :meth:`since_beat`."""
        with self._lock:
            self._since_beat = set(self._claimed)

    def ids(self) -> list[int]:
        """Every job held in any way, in id order."""
        with self._lock:
            return sorted(self._claimed)

    def waiting_ids(self) -> list[int]:
        """The jobs claimed and not started, in id order."""
        with self._lock:
            return sorted(self._waiting)

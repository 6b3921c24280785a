"""The retry preview: when a job's remaining attempts would run if each one failed.

``flask queue show`` and the admin's job page show it. The worker decides each delay
when an attempt fails, from the same backoff (:func:`.failures.own_delay` or
:class:`.failures.Backoff`), so the preview is what it will do, except where a task
raises ``Retry(delay)`` with its own delay, or a cancellation ends the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .failures import Backoff
from .failures import BackoffFunc
from .failures import own_delay
from .jobs import Job
from .models import JobStatus


@dataclass(frozen=True, slots=True)
class PlannedAttempt:
    """An attempt still to come: ``due`` where its time is known (a pending job's next
    attempt), else how long after the previous attempt fails, ``(least, most)`` seconds
    (the spread is the backoff's jitter)."""

    number: int
    due: datetime | None = None
    wait: tuple[float, float] | None = None


def retry_plan(job: Job, backoff: Backoff, own: BackoffFunc | None) -> list[PlannedAttempt]:
    """The attempts ``job`` has left, in order; none for a job that has ended.

    :param backoff: the queue's backoff (its base, cap and jitter settings).
    :param own: the task's own ``backoff=``, if it has one; where it fails or gives no
        usable delay the queue's is shown, as the worker then uses it.
    """
    if job.status == JobStatus.PENDING:
        first = PlannedAttempt(job.attempts + 1, due=job.run_at)
    elif job.status == JobStatus.RUNNING:
        first = None  # the running attempt is job.attempts; the next follows its failure
    else:
        return []
    planned = [first] if first is not None else []
    start = job.attempts + (2 if first is not None else 1)
    for number in range(start, job.max_attempts + 1):
        planned.append(PlannedAttempt(number, wait=_wait_after(number - 1, backoff, own)))
    return planned


def _wait_after(failed: int, backoff: Backoff, own: BackoffFunc | None) -> tuple[float, float]:
    if own is not None:
        try:
            seconds = own_delay(own, failed)
        except Exception:  # the worker logs it and falls back to the queue's backoff
            pass
        else:
            return seconds, seconds
    return backoff.bounds(failed)

"""The queue's blinker signals (public as :mod:`flask_sqlqueue.signals`).

Every signal is sent with the Flask app as sender (where the queue knows it) and
keyword arguments; a receiver that raises is logged and skipped, never allowed to
break the worker or the outcome it reports (which is committed before the signal).
"""

from __future__ import annotations

import logging
from typing import Any

from blinker import NamedSignal
from blinker import Namespace

log = logging.getLogger("flask_sqlqueue.signals")

_signals = Namespace()

job_enqueued = _signals.signal(
    "sqlqueue.job-enqueued",
    doc="A job was written (``job``: the :class:`Job`). With ``session=`` a SQLAlchemy "
    "Session, sent once the session commits. Not sent when an idempotency key returned "
    "an existing job.",
)
job_started = _signals.signal(
    "sqlqueue.job-started",
    doc="An attempt starts (``job``: the running job's context, as ``current_job`` sees "
    "it). Sent in the worker thread, inside the job's app context, before the task runs.",
)
job_succeeded = _signals.signal(
    "sqlqueue.job-succeeded",
    doc="An attempt returned and the job is completed (``job``, ``result``, ``duration`` "
    "in seconds).",
)
job_failed = _signals.signal(
    "sqlqueue.job-failed",
    doc="An attempt raised (``job``, ``error``: the exception). Followed by "
    "``job_retried`` or ``job_dead``.",
)
job_retried = _signals.signal(
    "sqlqueue.job-retried",
    doc="A failed attempt will be retried (``job``, ``error``, ``retry_at``).",
)
job_dead = _signals.signal(
    "sqlqueue.job-dead",
    doc="A failed attempt left the job dead (``job``, ``error``).",
)
job_cancelled = _signals.signal(
    "sqlqueue.job-cancelled",
    doc="A running job stopped for a cancellation (``job``).",
)
job_rescued = _signals.signal(
    "sqlqueue.job-rescued",
    doc="A lost worker's job was taken back (``job``: the :class:`Job` after the rescue, "
    "``lost_worker``: the lost worker's id).",
)

ALL = (
    job_enqueued,
    job_started,
    job_succeeded,
    job_failed,
    job_retried,
    job_dead,
    job_cancelled,
    job_rescued,
)


def send(signal: NamedSignal, sender: Any, **data: Any) -> None:
    """Call each receiver of ``signal``; one that raises is logged and the rest still run."""
    if not signal.receivers:
        return
    for receiver in signal.receivers_for(sender):
        try:
            receiver(sender, **data)
        except Exception:
            log.exception("a receiver of signal %s failed: %r", signal.name, receiver)

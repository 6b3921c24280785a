"""The queue's signals, for hooks and metrics (blinker, as Flask's own signals use).

::

    from flask_sqlqueue import signals

    @signals.job_dead.connect
    def alert(app, job, error, **extra):
        app.logger.error("job %s (%s) is dead: %r", job.id, job.task, error)

For Sentry, :class:`flask_sqlqueue.sentry.SQLQueueIntegration` reports each failed
attempt with its stack trace and the job's tags (docs/sentry.md).

Receivers get the app as sender and keyword arguments (take ``**extra`` so new ones do
not break them). A receiver that raises is logged and skipped: it cannot break the
worker or lose a job, since every outcome is committed before its signal is sent.
"""

from __future__ import annotations

from .core.signals import ALL as ALL
from .core.signals import job_cancelled as job_cancelled
from .core.signals import job_dead as job_dead
from .core.signals import job_enqueued as job_enqueued
from .core.signals import job_failed as job_failed
from .core.signals import job_rescued as job_rescued
from .core.signals import job_retried as job_retried
from .core.signals import job_started as job_started
from .core.signals import job_succeeded as job_succeeded

__all__ = [
    "ALL",
    "job_cancelled",
    "job_dead",
    "job_enqueued",
    "job_failed",
    "job_rescued",
    "job_retried",
    "job_started",
    "job_succeeded",
]

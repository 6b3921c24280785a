"""Job fields on the app's own log records while a task runs.

Installed by the first :class:`~flask_sqlqueue.core.worker.Worker` (no set-up needed):
a ``logging`` record factory gives every record these attributes, read from
``current_job`` (``None`` outside a task)::

    sqlqueue_job_id, sqlqueue_task, sqlqueue_attempt, sqlqueue_idempotency_key

so a format such as ``"%(levelname)s [job %(sqlqueue_job_id)s] %(name)s: %(message)s"``
shows which job wrote each line. The queue's own loggers (``flask_sqlqueue.*``) set the
same attributes themselves on the lines that are about a job, and are left alone here.
For a handler that also receives those other lines, give its formatter
``defaults=LOG_DEFAULTS``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .context import _current

FIELDS = ("sqlqueue_job_id", "sqlqueue_task", "sqlqueue_attempt", "sqlqueue_idempotency_key")
#: ``logging.Formatter(fmt, defaults=LOG_DEFAULTS)``: every field present on every record.
LOG_DEFAULTS: dict[str, Any] = dict.fromkeys(FIELDS)

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Wrap the current log record factory once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(name: str, *args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(name, *args, **kwargs)
            # The queue's own lines carry these as ``extra``, which must not collide.
            if name != "flask_sqlqueue" and not name.startswith("flask_sqlqueue."):
                job = _current.get()
                if job is None:
                    record.__dict__.update(LOG_DEFAULTS)
                else:
                    record.sqlqueue_job_id = job.id
                    record.sqlqueue_task = job.task
                    record.sqlqueue_attempt = job.attempts
                    record.sqlqueue_idempotency_key = job.idempotency_key
            return record

        logging.setLogRecordFactory(factory)
        _installed = True

"""Job fields on the app's own log records while a task runs.

Installed by the first :class:`~flask_sqlqueue.core.worker.Worker` (no set-up needed):
a ``logging`` record factory gives every record these attributes, read from
``current_job`` (``None`` outside a task)::

    sqlqueue_job_id, sqlqueue_task, sqlqueue_attempt, sqlqueue_idempotency_key

so a format such as ``"%(levelname)s [job %(sqlqueue_job_id)s] %(name)s: %(message)s"``
shows which job wrote each line. The queue's own loggers (``flask_sqlqueue.*``) set the
same attributes themselves on the lines that are about a job, with ``sqlqueue_queue``,
and on the line that ends an attempt ``sqlqueue_outcome`` and ``sqlqueue_duration``;
they are left alone here. For a handler that also receives those other lines, give its
formatter ``defaults=LOG_DEFAULTS``.

:class:`JsonFormatter` writes each record as one JSON object per line, those fields
included (``flask queue work --log-format json``).
"""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC
from datetime import datetime
from typing import Any

from .context import _current

FIELDS = ("sqlqueue_job_id", "sqlqueue_task", "sqlqueue_attempt", "sqlqueue_idempotency_key")
#: Only on the queue's own lines: about a job, and about how its attempt ended.
OWN_FIELDS = ("sqlqueue_queue", "sqlqueue_outcome", "sqlqueue_duration")
#: ``logging.Formatter(fmt, defaults=LOG_DEFAULTS)``: every field present on every record.
LOG_DEFAULTS: dict[str, Any] = dict.fromkeys(FIELDS + OWN_FIELDS)
#: The worker's lines as text, when the app has not configured logging.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the job fields the record carries (without their ``sqlqueue_`` prefix:
    ``job_id``, ``task``, ``attempt``, ``idempotency_key``, ``queue``, ``outcome``,
    ``duration``; absent ones left out), and ``exc`` with the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS + OWN_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name.removeprefix("sqlqueue_")] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: int, *, json_lines: bool = False) -> None:
    """Log as ``flask queue work`` does: the queue's loggers at ``level``; and where the
    app has not configured logging (the root logger has no handler), each record on
    standard error, as text or as JSON lines, from ``level`` up."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    logging.getLogger("flask_sqlqueue").setLevel(level)


def writes_json() -> bool:
    """Whether the root logger writes JSON lines (a worker's child processes do the same)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


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

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

Where :func:`configure` adds the handler, the lines a thread writes inside
:func:`lines_together` (the worker's completions of one group commit) reach the stream
together as it ends, a write per :data:`ATOMIC_WRITE` bytes of whole lines rather than
one a line: most of what a line cost was its write.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
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

#: Guards this module's process-wide state: the record factory, the line handlers.
_lock = threading.Lock()

#: Each field and its name in a JSON line.
_JSON_NAMES = tuple((name, name.removeprefix("sqlqueue_")) for name in FIELDS + OWN_FIELDS)
#: ``json.dumps(line, ensure_ascii=False, default=str)`` without making an encoder a line.
_encode = json.JSONEncoder(ensure_ascii=False, default=str).encode


class TextFormatter(logging.Formatter):
    """:class:`logging.Formatter`, its ``asctime`` unchanged; without a ``datefmt`` the
    date and time of a second are made once, not once a line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._second: tuple[int, str] = (-1, "")  # replaced whole: threads share it

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt:
            return super().formatTime(record, datefmt)
        second, text = self._second
        # converter (localtime) truncates to the second, as int() does a time after 1970.
        if int(record.created) != second:
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (int(record.created), text)
        msec = self.default_msec_format
        return msec % (text, record.msecs) if msec else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the job fields the record carries (without their ``sqlqueue_`` prefix:
    ``job_id``, ``task``, ``attempt``, ``idempotency_key``, ``queue``, ``outcome``,
    ``duration``; absent ones left out), and ``exc`` with the traceback of an exception."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._second: tuple[float, str] = (math.nan, "")  # replaced whole: threads share it

    def utc_time(self, created: float) -> str:
        """``datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")``,
        the date and time of a second made once, not once a line."""
        if created < 0:
            return datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        # To the microsecond as datetime rounds: half to even, a whole second carried.
        fraction, whole = math.modf(created)
        micro = round(fraction * 1e6)
        if micro >= 1_000_000:
            whole, micro = whole + 1, micro - 1_000_000
        second, text = self._second
        if whole != second:
            text = datetime.fromtimestamp(whole, UTC).isoformat(timespec="seconds")
            text = text.removesuffix("+00:00")
            self._second = (whole, text)
        return f"{text}.{micro // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, short in _JSON_NAMES:
            value = getattr(record, name, None)
            if value is not None:
                line[short] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _encode(line)


class _Held:
    """The lines a thread keeps inside :func:`lines_together`, and the last one's record
    (for :meth:`logging.Handler.handleError`)."""

    __slots__ = ("lines", "record")

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.record: logging.LogRecord | None = None


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """:class:`logging.StreamHandler` (standard error), whose lines of a thread inside
    :func:`lines_together` are written together as it ends (see :func:`pieces`)."""

    def __init__(self) -> None:
        super().__init__()
        #: By thread id; read and changed under the handler's lock (emit is called in it).
        self._held: dict[int, _Held] = {}
        global _line_handlers
        with _lock:  # replaced whole: lines_together reads it without the lock
            alive = tuple(ref for ref in _line_handlers if ref() is not None)
            _line_handlers = (*alive, weakref.ref(self))

    def emit(self, record: logging.LogRecord) -> None:
        held = self._held.get(threading.get_ident())
        if held is None:
            super().emit(record)
            return
        try:
            held.lines.append(self.format(record) + self.terminator)
            held.record = record
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def hold_lines(self) -> bool:
        """Keep this thread's lines until :meth:`write_held`; ``False`` if it already does."""
        with self.lock:  # type: ignore[union-attr]
            if threading.get_ident() in self._held:
                return False
            self._held[threading.get_ident()] = _Held()
            return True

    def write_held(self) -> None:
        """Write the lines this thread kept, together, and keep no more. (Not
        ``release``: that is :class:`logging.Handler`'s, of its lock.)"""
        with self.lock:  # type: ignore[union-attr]
            held = self._held.pop(threading.get_ident(), None)
            if held is not None:
                self._write(held)

    def close(self) -> None:
        # logging.shutdown at exit: no line kept by a thread still inside is lost.
        with self.lock:  # type: ignore[union-attr]
            for held in self._held.values():
                self._write(held)
                held.lines.clear()
            super().close()

    def _write(self, held: _Held) -> None:
        if held.record is None or not held.lines:
            return
        try:
            for piece in pieces(held.lines):
                self.stream.write(piece)
            self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(held.record)


#: Held lines are written in pieces of whole lines, each at most this many bytes: a pipe
#: (standard error under systemd or Docker) takes a write of up to PIPE_BUF bytes whole,
#: never mixed with another process's (a worker's children write there too) nor cut
#: short by a signal (which an unbuffered stream, ``PYTHONUNBUFFERED``, would not redo).
ATOMIC_WRITE: int = getattr(select, "PIPE_BUF", 512)


def pieces(lines: list[str]) -> Iterator[str]:
    """``lines`` (each ending in a newline) joined in order, in pieces of whole lines of
    at most :data:`ATOMIC_WRITE` bytes in UTF-8 (a longer line is a piece of its own;
    a character standard error cannot encode counted as its ``backslashreplace``)."""
    piece: list[str] = []
    size = 0
    for line in lines:
        # isascii() costs nothing (the string knows); the others are rare.
        length = len(line) if line.isascii() else len(line.encode("utf-8", "backslashreplace"))
        if piece and size + length > ATOMIC_WRITE:
            yield "".join(piece)
            piece, size = [], 0
        piece.append(line)
        size += length
    if piece:
        yield "".join(piece)


#: Every :class:`LineHandler` (:func:`configure`'s; none where the app configured logging).
_line_handlers: tuple[weakref.ref[LineHandler], ...] = ()


def _line_handlers_alive() -> list[LineHandler]:
    return [handler for ref in _line_handlers if (handler := ref()) is not None]


def _forget_held() -> None:
    # A thread of a forked child may get the id of a parent's thread that held lines.
    for handler in _line_handlers_alive():
        handler._held.clear()


os.register_at_fork(after_in_child=_forget_held)


@contextmanager
def lines_together() -> Iterator[None]:
    """The lines this thread writes inside reach the stream of each :class:`LineHandler`
    together as it ends (other handlers get each record as it is logged). For a
    short loop of lines, with no other code inside: none is written before the end."""
    holding = [handler for handler in _line_handlers_alive() if handler.hold_lines()]
    try:
        yield
    finally:
        for handler in holding:
            handler.write_held()


def configure(level: int, *, json_lines: bool = False) -> None:
    """Log as ``flask queue work`` does: the queue's loggers at ``level``; and where the
    app has not configured logging (the root logger has no handler), each record on
    standard error, as text or as JSON lines, from ``level`` up."""
    root = logging.getLogger()
    if not root.handlers:
        handler = LineHandler()
        handler.setFormatter(JsonFormatter() if json_lines else TextFormatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(level)
    logging.getLogger("flask_sqlqueue").setLevel(level)


def writes_json() -> bool:
    """Whether the root logger writes JSON lines (a worker's child processes do the same)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


_installed = False


def install() -> None:
    """Wrap the current log record factory once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(name: str | None, *args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(name, *args, **kwargs)
            # The queue's own lines carry these as ``extra``, which must not collide.
            # logging.makeLogRecord (a socket receiver's, a test's) names no logger.
            own = name is not None and (
                name == "flask_sqlqueue" or name.startswith("flask_sqlqueue.")
            )
            if not own:
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

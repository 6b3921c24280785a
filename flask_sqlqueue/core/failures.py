"""What a failed attempt leaves behind: its error record, the job's bounded ``errors``
history, and the delay before the next attempt (:class:`Backoff`, or a task's own).

Pure values, no statements: the worker's transitions (core/transitions.py) and the
rescue of lost workers (core/roster.py) write what these functions shape, and the
retry preview (core/retry_preview.py) reads the same backoff the worker uses.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from traceback import TracebackException
from typing import Any
from typing import NotRequired
from typing import TypedDict

from ..bounds import LATEST_RUN_AT
from ..bounds import longest_delay
from ..config import default
from .models import utcnow
from .payload import decode_value
from .payload import dumps_trusted

#: What a task may set as its own backoff: attempt number (1-based) -> delay.
BackoffFunc = Callable[[int], "float | timedelta"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the next attempt after attempt ``k`` failed:
    ``min(cap, base * 2**k) + uniform(0, jitter)`` seconds."""

    base: float = default("SQLQUEUE_BACKOFF_BASE")
    cap: float = default("SQLQUEUE_BACKOFF_CAP")
    jitter: float = default("SQLQUEUE_BACKOFF_JITTER")

    def delay(self, attempt: int, rng: random.Random) -> float:
        least, most = self.bounds(attempt)
        return least + (rng.uniform(0, most - least) if most > least else 0.0)

    def bounds(self, attempt: int) -> tuple[float, float]:
        """The least and the most :meth:`delay` gives after attempt ``attempt`` failed."""
        least = min(self.cap, self.base * 2.0 ** min(attempt, 64))
        return least, least + self.jitter


def own_delay(backoff: BackoffFunc, attempt: int) -> float:
    """A task's own ``backoff`` after attempt ``attempt`` failed, in seconds.

    :raises ValueError: it gave a delay that is not a finite number of seconds, 0 or more,
        or one that would make the next attempt due after
        :data:`~flask_sqlqueue.bounds.LATEST_RUN_AT`, as ``Retry`` refuses it (and
        whatever ``backoff`` itself raises).
    """
    delay = backoff(attempt)
    try:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    shown = cut_text(repr(delay), 80)
    if not seconds >= 0:  # NaN too
        raise ValueError(f"backoff returned {shown}, not a number of seconds, 0 or more")
    if seconds > longest_delay(utcnow()):  # infinity too
        raise ValueError(
            f"backoff returned {shown}, which would make the next attempt due after "
            f"{LATEST_RUN_AT:%Y-%m-%d} (UTC), the latest time the queue stores"
        )
    return seconds


#: Characters of an error's type kept in its record.
MAX_ERROR_TYPE = 255
#: Characters of an error message kept (in ``last_error`` and the history): its start.
MAX_ERROR_MESSAGE = 2_000
#: Characters of a traceback kept: its end, where the exception is raised.
MAX_TRACEBACK = 20_000
#: Failed attempts kept in a job's ``errors`` history: the newest; older ones are dropped.
MAX_ERRORS_KEPT = 20
#: UTF-8 bytes a job's ``errors`` history may take (less where the database stores less):
#: the newest records that fit are kept, so a failure's write always fits.
MAX_ERROR_HISTORY = 1_000_000
# What is left of a message when one record alone is too large for the database.
_SHORT_MESSAGE = 200


class ErrorRecord(TypedDict):
    """One failed attempt in a job's ``errors`` history (a JSON list of them)."""

    attempt: int
    #: The exception's type, or ``WorkerLost``, ``Quarantined``, ``Expired``...
    type: str
    message: str
    traceback: str
    #: The worker that ran the attempt.
    worker: str | None
    #: When it failed, as ISO 8601 text.
    at: str
    #: Set on a rescue's record once its worker reported in again (core/roster.py).
    came_back: NotRequired[bool]


def error_record(
    attempt: int, kind: str, message: str, traceback: str, worker_id: str | None, now: datetime
) -> ErrorRecord:
    """One failed attempt as the history stores it, each text cut to its limit."""
    return {
        "attempt": attempt,
        "type": storable_text(cut_text(kind, MAX_ERROR_TYPE)),
        "message": storable_text(cut_text(message, MAX_ERROR_MESSAGE)),
        "traceback": storable_text(cut_text(traceback, MAX_TRACEBACK, keep_end=True)),
        "worker": worker_id,
        "at": now.isoformat(),
    }


def format_error(exc: BaseException) -> str:
    """``exc``'s traceback as it is stored: each part cut to :data:`MAX_ERROR_MESSAGE`
    (so a long message shows once, cut, after the frames) and the whole to
    :data:`MAX_TRACEBACK`, keeping its end."""
    parts = TracebackException.from_exception(exc).format()
    text = "".join(
        part if len(part) <= MAX_ERROR_MESSAGE else cut_text(part, MAX_ERROR_MESSAGE) + "\n"
        for part in parts
    )
    return cut_text(text, MAX_TRACEBACK, keep_end=True)


def cut_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` if it has at most ``limit`` characters, else its start (or end) with a
    note saying it was cut; never longer than ``limit``, so cutting twice changes nothing."""
    if len(text) <= limit:
        return text
    if keep_end:
        note = f"[cut: {len(text):,} characters in all; the end follows]\n"
        return note + text[len(text) - max(0, limit - len(note)) :]
    note = f" [cut: {len(text):,} characters in all]"
    return text[: max(0, limit - len(note))] + note


def storable_text(text: str) -> str:
    """``text`` with what some database cannot store written as escapes: NUL (PostgreSQL's
    text refuses it) and lone surrogates (no driver can encode them as UTF-8). A task's
    error message may hold either; left as is, its failure could not be recorded at all."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def summary(record: ErrorRecord) -> str:
    """A job's ``last_error`` for ``record``: ``"Type: message"``, or the type alone."""
    return f"{record['type']}: {record['message']}" if record["message"] else record["type"]


def appended(
    history: str | None, record: ErrorRecord, fits: Callable[[str], bool] | None = None
) -> str:
    """The history with ``record`` added, bounded: at most :data:`MAX_ERRORS_KEPT`
    records and :data:`MAX_ERROR_HISTORY` bytes, and within what ``fits``."""
    # A history edited into nonsense is replaced, never allowed to block.
    items = records(history) or []
    items.append(record)
    del items[:-MAX_ERRORS_KEPT]
    while True:
        text = dumps_trusted(items)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size <= MAX_ERROR_HISTORY and (fits is None or fits(text)):
            return text
        if len(items) > 1:
            items.pop(0)  # the oldest goes first
        elif items[0]["traceback"]:
            # One record alone is too large here (a server that stores very little).
            items[0] = {**record, "traceback": ""}
        else:
            short = cut_text(record["message"], _SHORT_MESSAGE)
            items[0] = {**record, "traceback": "", "message": short}
            return dumps_trusted(items)


def records(history: str | None) -> list[Any] | None:
    """The records of an ``errors`` history; ``None`` if it is not a JSON list."""
    try:
        items = decode_value(history) or []
    except ValueError:
        return None
    return items if isinstance(items, list) else None

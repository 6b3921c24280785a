"""Group commit: many threads hand items to one thread that writes them in batches.

The writer never waits to fill a batch. It takes whatever is waiting the moment it is
free, so a lone item is written at once (no added latency), while under load items pile
up during each commit and the next commit takes them all: the batch size follows the
load, and the cost of a commit (an fsync on SQLite) is shared by the whole batch.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger("flask_sqlqueue.worker")

_STOP = object()


class GroupCommit(Generic[T]):
    """Calls ``flush(batch)`` on a thread of its own for the items :meth:`put` hands it.

    :param flush: writes one batch; it must handle its own errors (one that escapes is
        logged, and the batch is not retried).
    :param max_batch: the most items one ``flush`` gets.
    :param max_waiting: :meth:`put` blocks while this many items wait (back-pressure on
        the threads producing them while the database is slow).
    """

    def __init__(
        self,
        flush: Callable[[list[T]], None],
        *,
        max_batch: int = 256,
        max_waiting: int = 1024,
        name: str = "sqlqueue-recorder",
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._waiting: queue.Queue[object] = queue.Queue(maxsize=max_waiting)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> GroupCommit[T]:
        self._thread.start()
        return self

    def put(self, item: T) -> None:
        self._waiting.put(item)

    def close(self, timeout: float | None = None) -> None:
        """Write everything handed over so far, then stop the thread."""
        self._waiting.put(_STOP)
        self._thread.join(timeout)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self._waiting.get()
            batch: list[T] = []
            while True:
                if item is _STOP:
                    stop = True
                    break
                batch.append(item)  # type: ignore[arg-type]
                if len(batch) >= self._max_batch:
                    break
                try:
                    item = self._waiting.get_nowait()
                except queue.Empty:
                    break
            if batch:
                try:
                    self._flush(batch)
                except Exception:
                    log.exception("recording %d outcome(s) failed", len(batch))

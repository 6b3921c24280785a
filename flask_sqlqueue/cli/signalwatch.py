"""SIGTERM and SIGINT for ``flask queue work``, acted on by a thread of their own.

A Python signal handler runs on the main thread between two of its bytecodes, wherever
that thread is: inside ``Event.wait`` holding the event's lock, say, or inside a log
handler's write. A handler that sets that event (``Worker.stop``) or logs waits for a
lock its own thread holds, and the worker hangs for good with its jobs running and its
heartbeat fresh. So the handler here does nothing at all: the interpreter writes the
signal's number to a pipe (``signal.set_wakeup_fd``) before any Python code runs, and a
watcher thread, which holds no lock the main thread could be holding, reads it and acts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from collections.abc import Iterable
from types import FrameType
from types import TracebackType

#: What the watcher is told to end with: no signal has the number 0.
_END = b"\0"

log = logging.getLogger("flask_sqlqueue.worker")


def _nothing(_signum: int, _frame: FrameType | None) -> None:
    """The Python-level handler: what the signal asks for is done by the watcher."""


class SignalWatch:
    """While entered, ``act(signum)`` runs on a thread of its own for each of ``signals``
    the process receives, in the order received. Enter it on the main thread."""

    def __init__(
        self,
        act: Callable[[int], None],
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self._act = act
        self._signals = tuple(signals)
        self._read = self._write = -1
        self._thread: threading.Thread | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._previous_fd = -1

    def __enter__(self) -> SignalWatch:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # set_wakeup_fd's requirement
        self._thread = threading.Thread(target=self._watch, name="sqlqueue-signals", daemon=True)
        self._thread.start()
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._previous = {sig: signal.signal(sig, _nothing) for sig in self._signals}
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._previous_fd)
        os.write(self._write, _END)
        if self._thread is not None:
            self._thread.join()
        os.close(self._write)
        os.close(self._read)

    def _watch(self) -> None:
        wanted = {int(sig) for sig in self._signals}
        while True:
            # Every signal with a Python handler is written here, wanted or not.
            for number in os.read(self._read, 64):
                if number == 0:
                    return
                if number in wanted:
                    try:
                        self._act(number)
                    except Exception:  # the next signal must still be acted on
                        log.exception("acting on signal %d failed", number)

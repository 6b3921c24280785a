"""The pickup-latency probe every system's worker runs: write the time the job started."""

from __future__ import annotations

import os
import time


def stamp(path: str) -> None:
    """Append ``time.time()`` at the job's start to ``path``, one line in one ``write``:
    a probe that ran twice leaves two lines, which the harness counts."""
    started = time.time()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{started!r}\n".encode())
    finally:
        os.close(fd)


def _lines(path: str) -> list[str]:
    """The complete lines of ``path`` (none if it is not there yet)."""
    try:
        with open(path) as handle:
            text = handle.read()
    except FileNotFoundError:
        return []
    return text.splitlines()[: text.count("\n")]


def read_stamp(path: str) -> float | None:
    """The probe's start time, once it has written it."""
    lines = _lines(path)
    return float(lines[0]) if lines else None


def stamps(path: str) -> int:
    """How many times the probe ran."""
    return len(_lines(path))

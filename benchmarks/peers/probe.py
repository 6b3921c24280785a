"""The pickup-latency probe every peer's worker runs: write the time the job started."""

from __future__ import annotations

import os
import time


def stamp(path: str) -> None:
    """Record ``time.time()`` at the job's start in ``path`` (atomically, via rename)."""
    started = time.time()
    partial = f"{path}.part"
    with open(partial, "w") as handle:
        handle.write(repr(started))
    os.replace(partial, path)


def read_stamp(path: str) -> float | None:
    try:
        with open(path) as handle:
            return float(handle.read())
    except FileNotFoundError:
        return None

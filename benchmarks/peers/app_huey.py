"""Huey's SqliteHuey as its users run it: ``huey_consumer benchmarks.peers.app_huey.huey``.

``BENCH_HUEY_FILE`` names the SQLite file. ``fsync=True`` is ``PRAGMA synchronous=FULL``
(as flask_sqlqueue's default), and ``store_none=True`` records every finished task in the
result store, which is how the harness counts finished jobs.
"""

from __future__ import annotations

import os
from typing import Any

from huey import SqliteHuey  # type: ignore[import-untyped]

from benchmarks.peers.probe import stamp


def make(filename: str) -> tuple[SqliteHuey, Any, Any]:
    huey = SqliteHuey("bench", filename=filename, fsync=True, store_none=True)

    @huey.task(name="noop")  # type: ignore[untyped-decorator]
    def noop() -> None:
        """Does nothing."""

    @huey.task(name="probe")  # type: ignore[untyped-decorator]
    def probe(path: str) -> None:
        stamp(path)

    return huey, noop, probe


if "BENCH_HUEY_FILE" in os.environ:
    huey, noop, probe = make(os.environ["BENCH_HUEY_FILE"])

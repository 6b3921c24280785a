"""Huey's SqliteHuey as its users run it: ``huey_consumer benchmarks.peers.app_huey.huey``.

``BENCH_HUEY_FILE`` names the SQLite file. At the defaults the SqliteHuey gets a name and a
filename only; ``BENCH_HUEY_FSYNC=1`` (the matched settings) adds ``fsync=True``, Huey's
``PRAGMA synchronous=FULL``, flask_sqlqueue's default on SQLite.
"""

from __future__ import annotations

import os
from typing import Any

from huey import SqliteHuey  # type: ignore[import-untyped]

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp


def make(filename: str, fsync: bool) -> tuple[SqliteHuey, Any, Any]:
    options = {"fsync": True} if fsync else {}
    huey = SqliteHuey("bench", filename=filename, **options)

    @huey.task(name="write")  # type: ignore[untyped-decorator]
    def write(i: int, email: str) -> None:
        """The benchmark's job: one line appended to the output file."""
        workload.write(i, email)

    @huey.task(name="probe")  # type: ignore[untyped-decorator]
    def probe(path: str) -> None:
        stamp(path)

    return huey, write, probe


if "BENCH_HUEY_FILE" in os.environ:
    huey, write, probe = make(
        os.environ["BENCH_HUEY_FILE"], os.environ.get("BENCH_HUEY_FSYNC") == "1"
    )

"""Celery on Redis as its users run it: ``celery -A benchmarks.peers.app_celery worker``.

``BENCH_REDIS_URL`` is the server, the broker on its database 0. Nothing else is
configured: no result backend (Celery's default), since the harness counts finished jobs
in the output file.
"""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp

_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
app = Celery("bench", broker=f"{_url}/0")


@app.task(name="write")  # type: ignore[untyped-decorator]
def write(i: int, email: str) -> None:
    """The benchmark's job: one line appended to the output file."""
    workload.write(i, email)


@app.task(name="probe")  # type: ignore[untyped-decorator]
def probe(path: str) -> None:
    stamp(path)

"""Celery on Redis as its users run it: ``celery -A benchmarks.peers.app_celery worker``.

``BENCH_REDIS_URL`` is the server: the broker on database 0, results on database 1 (so
the harness counts finished tasks with ``DBSIZE`` there).
"""

from __future__ import annotations

import os

from celery import Celery  # type: ignore[import-untyped]

from benchmarks.peers.probe import stamp

_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
app = Celery("bench", broker=f"{_url}/0", backend=f"{_url}/1")
app.conf.update(
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
)


@app.task(name="noop")  # type: ignore[untyped-decorator]
def noop() -> None:
    """Does nothing."""


@app.task(name="probe")  # type: ignore[untyped-decorator]
def probe(path: str) -> None:
    stamp(path)

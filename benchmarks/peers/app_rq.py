"""RQ's task functions (``rq worker -w rq.worker.SimpleWorker`` imports them by path)."""

from __future__ import annotations

from benchmarks.peers.probe import stamp


def noop() -> None:
    """Does nothing."""


def probe(path: str) -> None:
    stamp(path)

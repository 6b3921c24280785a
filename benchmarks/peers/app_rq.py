"""RQ's task functions (``rq worker`` imports them by path)."""

from __future__ import annotations

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp


def write(i: int, email: str) -> None:
    """The benchmark's job: one line appended to the output file."""
    workload.write(i, email)


def probe(path: str) -> None:
    stamp(path)

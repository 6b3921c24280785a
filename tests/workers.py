"""A real worker on a thread, for tests: always stopped and joined, its errors raised."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from flask_sqlqueue.core.worker import Worker
from tests.waiting import WAIT


def _start(worker: Worker, *, burst: bool, errors: list[BaseException]) -> threading.Thread:
    def target() -> None:
        try:
            worker.run(burst=burst)
        except BaseException as exc:  # raised in the test's thread, below
            errors.append(exc)

    name = "sqlqueue-test-burst" if burst else "sqlqueue-test-runner"
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


@contextmanager
def running(worker: Worker, *, burst: bool = False) -> Iterator[Worker]:
    """``worker.run()`` on a thread for the block; stopped and joined when it ends, and
    whatever the worker raised is raised here."""
    errors: list[BaseException] = []
    thread = _start(worker, burst=burst, errors=errors)
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


def run_burst(worker: Worker, timeout: float = WAIT) -> None:
    """``worker.run(burst=True)``, failing the test instead of hanging if it never returns."""
    errors: list[BaseException] = []
    thread = _start(worker, burst=True, errors=errors)
    thread.join(timeout)
    if thread.is_alive():
        worker.stop()
        thread.join(WAIT)
        pytest.fail(f"a burst run did not finish within {timeout:.0f}s")
    if errors:
        raise errors[0]

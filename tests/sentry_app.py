"""The app of tests/test_sentry.py: a task that fails, run by a worker's threads and by
the children of an in-process worker."""

from __future__ import annotations

from typing import Any

from flask import Flask

from flask_sqlqueue import Retry
from flask_sqlqueue import SQLQueue
from tests.sample_app import queue_app

queue = SQLQueue()


def check_quantity(quantity: int) -> None:
    if quantity < 0:
        raise ValueError(f"quantity must be positive, got {quantity}")


@queue.task(max_attempts=2)
def reserve_stock(quantity: int) -> None:
    """Fails on a negative quantity, one frame below the task."""
    check_quantity(quantity)


@queue.task(max_attempts=2)
def wait_for_supplier() -> None:
    """Asks for another attempt each time, until its attempts are spent."""
    raise Retry(0, "the supplier has not answered")


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

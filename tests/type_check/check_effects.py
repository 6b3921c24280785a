"""Only type-checked (mypy), never run: ``current_job.effect`` gives a ``bool``."""

from __future__ import annotations

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job

queue = SQLQueue()


@queue.task
def send_receipt(order_id: int) -> bool:
    with current_job.effect(f"receipt:{order_id}") as first:
        sent: bool = first
    with current_job.effect() as again:
        label: str = again  # type: ignore[assignment]
    return sent and bool(label)

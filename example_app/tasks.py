"""The example app's background tasks, and the queue they are registered on.

Task names default to ``"<module>.<function>"``, so these are
``example_app.tasks.handle_payment_event``, ``example_app.tasks.build_report`` and
``example_app.tasks.call_flaky_api`` in ``flask queue list`` and ``flask queue show``.

The "side effects" here append lines to files in the instance folder, standing in for
what a real app would do: update its own database, send an email, call a partner.
"""

from __future__ import annotations

import random
import time
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any

from flask import current_app

from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job

queue = SQLQueue()

#: Payment event types this app knows how to handle; anything else is dead-lettered.
HANDLED_EVENTS = frozenset({"payment.succeeded", "payment.failed", "payment.refunded"})

REPORT_FORMATS = ("json", "csv")


class PartnerUnavailable(Exception):
    """The partner API timed out or answered 503: worth trying again later."""


def _record(filename: str, line: str) -> None:
    """Append one line to a file in the instance folder: the visible side effect."""
    folder = Path(current_app.instance_path)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / filename, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@queue.task(queue="webhooks", priority=10)
def handle_payment_event(event: dict[str, Any]) -> dict[str, Any]:
    """Apply a payment provider's webhook event, enqueued with its id as idempotency key.

    An event type the app has no handler for goes straight to the dead-letter state
    (``PermanentFailure``): retrying would not help, but the event is kept, visible in
    ``flask queue list --status dead``, and can be replayed once a handler exists.
    """
    event_type = event.get("type")
    if event_type not in HANDLED_EVENTS:
        raise PermanentFailure(f"no handler for payment event type {event_type!r}")
    amount = (event.get("data") or {}).get("amount")
    # Marking an order paid twice would be wrong: the reservation makes it happen at
    # most once per event, even if this job runs again after a worker crash.
    applied = current_job.reserve_effect(f"payment-event:{event['id']}")
    if applied:
        _record("payments.log", f"{event['id']} {event_type} amount={amount}")
    return {"event_id": event["id"], "type": event_type, "applied": applied}


@queue.task(queue="reports")
def build_report(report_id: int, fmt: str = "json") -> dict[str, Any]:
    """Build a (made-up) sales report; the result is stored on the job as JSON."""
    if fmt not in REPORT_FORMATS:
        raise PermanentFailure(f"unknown report format {fmt!r}; use one of {REPORT_FORMATS}")
    time.sleep(float(current_app.config.get("EXAMPLE_REPORT_SECONDS", 0.5)))  # "heavy" work
    rows = [
        {"day": f"2024-06-{day:02d}", "orders": (report_id * 7 + day * 3) % 17 + 1}
        for day in range(1, 8)
    ]
    summary: dict[str, Any] = {
        "report_id": report_id,
        "format": fmt,
        "total_orders": sum(row["orders"] for row in rows),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if fmt == "csv":
        lines = ["day,orders", *(f"{row['day']},{row['orders']}" for row in rows)]
        summary["csv"] = "\n".join(lines) + "\n"
    else:
        summary["rows"] = rows
    return summary


@queue.task(queue="external", max_attempts=3)
def call_flaky_api(order_id: int) -> dict[str, Any]:
    """Fetch a shipping quote from an unreliable partner API, then email it to the customer.

    The fetch fails at random (``EXAMPLE_FLAKY_FAILURE_RATE``, 50% by default): the job
    is retried with backoff and goes dead after three failed attempts. The fetch has no
    side effect, so repeating it is harmless. The email does: it is guarded by
    ``reserve_effect``, so the customer gets it at most once per order.
    """
    rate = float(current_app.config.get("EXAMPLE_FLAKY_FAILURE_RATE", 0.5))
    if random.random() < rate:
        raise PartnerUnavailable(
            f"partner API timed out for order {order_id} (attempt {current_job.attempts})"
        )
    quote_cents = 450 + order_id % 7 * 100
    # The reservation is committed before the email goes out. If the worker died between
    # the two, a retry would skip the email and it would never be sent: at most once, not
    # exactly once. Where the remote API takes an idempotency key, pass one as well.
    sent = current_job.reserve_effect(f"quote-email:order-{order_id}")
    if sent:
        _record("outbox.log", f"order {order_id}: shipping quote {quote_cents} cents")
    return {"order_id": order_id, "quote_cents": quote_cents, "email_sent": sent}

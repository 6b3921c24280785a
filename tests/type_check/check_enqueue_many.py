"""Only type-checked (mypy), never run: enqueue_many's accepted shapes and return type."""

from __future__ import annotations

from flask_sqlqueue import Job
from flask_sqlqueue import SQLQueue
from flask_sqlqueue.core.options import Call

queue = SQLQueue()


@queue.task
def send_report(email: str, report_id: int) -> None: ...


jobs: list[Job] = send_report.enqueue_many([(["a@example.com", 1], {}), Call(["b", 2])])
keyed: list[Job] = send_report.using(priority=5).enqueue_many(
    Call(kwargs={"email": "c", "report_id": n}, idempotency_key=f"r-{n}") for n in range(3)
)
by_name: list[Job] = queue.enqueue_many("reports.send", [([1], {})], queue="reports")
loose: list[Job] = queue.enqueue_many("elsewhere.task", [([1], {})], unregistered=True)

send_report.enqueue_many(["a@example.com"])  # type: ignore[list-item]

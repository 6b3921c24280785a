"""Only type-checked (mypy), never run: the options declared once (core/options.py,
core/tasks.py) still catch a misspelled or misplaced option at each call site. Under
``warn_unused_ignores`` an ignore that mypy did not need is an error, so each line
below proves mypy refuses it."""

from __future__ import annotations

from flask_sqlqueue import Job
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import Unique

queue = SQLQueue()


@queue.task(
    queue="reports", tags=["r"], unique=Unique(), version=2, upcast={1: lambda a, k: (a, k)}
)
def send_report(email: str, report_id: int) -> None: ...


ok: Job = send_report.using(queue="mail", idempotency_key="k", unique=Unique()).enqueue("a", 1)
by_name: Job = queue.enqueue("reports.send", [1], queue="mail", unregistered=True, version=2)
many: list[Job] = queue.enqueue_many("reports.send", [([1], {})], tags=["t"], encoded=True)

send_report.using(queu="mail")  # type: ignore[call-arg]
send_report.using(priority="high")  # type: ignore[arg-type]
send_report.using(concurrency_key="k")  # type: ignore[call-arg]
queue.enqueue("reports.send", [1], delya=5)  # type: ignore[call-arg]
queue.enqueue_many("reports.send", [], idempotency_key="k")  # type: ignore[call-arg]
queue.enqueue_many("reports.send", [], batch_id=1)  # type: ignore[call-arg]
queue.task(retries=3)  # type: ignore[call-overload]
queue.periodic("* * * * *", retries=3)  # type: ignore[call-arg]

"""Only type-checked (mypy), never run: proves task signatures carry through."""

from __future__ import annotations

from flask_sqlqueue import Job
from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task
def send_report(email: str, report_id: int) -> dict[str, int]:
    return {"id": report_id}


@queue.task(queue="reports", max_attempts=5, priority=0)
def ping() -> str:
    return "pong"


job: Job = send_report.enqueue("a@example.com", 42)
job2: Job = send_report.using(priority=5, delay=10).enqueue(email="a@example.com", report_id=1)
after: Job = ping.using(depends_on=[job, job2.id]).enqueue()
direct: dict[str, int] = send_report("a@example.com", 1)
pong: str = ping()

send_report.enqueue("a@example.com", "42")  # type: ignore[arg-type]
send_report.enqueue("a@example.com")  # type: ignore[call-arg]
ping.using(queue="x").enqueue(1)  # type: ignore[call-arg]
ping.using(depends_on=["7"])  # type: ignore[list-item]

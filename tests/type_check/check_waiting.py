"""Only type-checked (mypy), never run: the asyncio producers keep the task's signature
(and ``queue.enqueue``'s), and waiting gives a Job back."""

from __future__ import annotations

from flask_sqlqueue import Job
from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task
def send_report(email: str, report_id: int) -> None: ...


def waits(job: Job) -> Job:
    return job.wait(timeout=30, poll_interval=5.0)


async def produces() -> Job:
    job: Job = await send_report.aenqueue("a@example.com", 42)
    job = await send_report.using(priority=5).aenqueue("b@example.com", report_id=43)
    job = await queue.aenqueue("reports.send", args=["c@example.com", 44], queue="reports")
    return await job.async_wait(timeout=30)


async def misuses(job: Job) -> None:
    await send_report.aenqueue("a@example.com", "42")  # type: ignore[arg-type]
    await queue.aenqueue("reports.send", priority="high")  # type: ignore[arg-type]
    job.wait(timeout="30")  # type: ignore[arg-type]

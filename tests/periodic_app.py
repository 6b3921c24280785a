"""An app with periodic tasks, in-process and as ``flask --app tests.periodic_app`` workers.

Kept apart from ``sample_app``: every worker of an app runs its schedules, and the
other tests count the jobs their workers make.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.sample_app import queue_app

queue = SQLQueue()


@queue.periodic("* * * * *", name="every_minute")
def every_minute() -> str | None:
    return current_job.idempotency_key


@queue.periodic(
    "*/15 * * * *",
    timezone="Europe/Paris",
    name="quarter_paris",
    queue="cron",
    args=[3],
    kwargs={"label": "q"},
)
def quarter_paris(n: int, label: str) -> str:
    return f"{label}{n}"


@queue.periodic("0 * * * *", name="hourly_backfill", backfill=True, backfill_limit=3)
def hourly_backfill() -> None:
    pass


@queue.periodic(
    "0 6 * * *", name="daily_backfill", backfill=True, backfill_window=timedelta(days=2)
)
def daily_backfill() -> None:
    pass


def create_app(config: dict[str, Any] | None = None) -> Flask:
    uri = os.environ.get("PERIODIC_DATABASE_URI")
    return queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": uri, **(config or {})})

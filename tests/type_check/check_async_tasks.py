"""Only type-checked (mypy), never run: an ``async def`` task keeps its signature, and
calling it directly gives its coroutine, as the plain function does."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from flask_sqlqueue import Job
from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task(max_attempts=3)
async def fetch_rates(currency: str) -> dict[str, float]:
    return {currency: 1.0}


job: Job = fetch_rates.enqueue("EUR")
coro: Coroutine[Any, Any, dict[str, float]] = fetch_rates("EUR")


async def caller() -> dict[str, float]:
    return await fetch_rates("EUR")


fetch_rates.enqueue(1)  # type: ignore[arg-type]

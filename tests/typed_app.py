"""The app of tests/test_typed_arguments.py: tasks whose parameters are typed, run
in-process, in eager mode and in the child processes of an in-process worker.

Its annotations are strings (``from __future__ import annotations``), read by the codec
with ``typing.get_type_hints``. Each task returns the ``repr`` of what it was called with,
so a test compares the values and their types exactly.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from dataclasses import field
from datetime import date
from datetime import datetime
from datetime import time
from decimal import Decimal
from typing import Any
from typing import Optional
from uuid import UUID

from flask import Flask

from flask_sqlqueue import SQLQueue
from tests.sample_app import queue_app

queue = SQLQueue()


class Tier(enum.Enum):
    FREE = "free"
    PRO = "pro"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal
    quantity: int = 1


@dataclass
class Order:
    id: UUID
    placed: datetime
    lines: list[Line]
    tier: Tier
    note: str | None = None
    tags: list[str] = field(default_factory=list)


@queue.task
def everything(
    when: datetime,
    day: date,
    at: time,
    ident: UUID,
    amount: Decimal,
    tier: Tier,
    level: Level,
    order: Order,
    maybe: datetime | None = None,
    plain: Any = None,
) -> str:
    return repr([when, day, at, ident, amount, tier, level, order, maybe, plain])


@queue.task
def containers(
    orders: list[Order],
    days: tuple[date, ...],
    prices: dict[str, Decimal],
    pair: tuple[UUID, int],
    nested: dict[str, list[Optional[Decimal]]],  # noqa: UP045 (this spelling is tested)
    *more: UUID,
    **extra: Tier,
) -> str:
    return repr([orders, days, prices, pair, nested, more, extra])


@queue.task(isolate=True)
def in_child(order: Order, when: datetime) -> dict[str, Any]:
    return {"repr": repr([order, when]), "pid": os.getpid()}


@queue.task(concurrency=1, concurrency_key=lambda day, tier=None: day.isoformat())
def daily(day: date, tier: Tier = Tier.FREE) -> str:
    """Its concurrency key is made from the ``date`` it will get, not its stored text."""
    return repr([day, tier])


@queue.periodic("0 0 1 1 *", args=[Tier.PRO, date(2024, 1, 1)])
def yearly(tier: Tier, since: date) -> str:
    return repr([tier, since])


@queue.task
def untyped(value: Any) -> Any:
    return value


@queue.task
def ship(parcel: Parcel) -> str:
    """Declared above ``Parcel``: its annotation is resolved at the first enqueue."""
    return repr(parcel)


@dataclass
class Parcel:
    sent: date
    weight: Decimal


def create_app(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__, queue, config)

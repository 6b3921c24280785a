"""The apps of tests/test_versions.py: one task, ``orders.ship``, at three versions of its
signature, each in an app of its own on the same database, as three deploys would have it.

- version 1 (``old``): ``ship(order_id, express)``;
- version 2: ``ship(order_id, speed)``, ``express`` turned into a speed;
- version 3 (``new``): ``ship(order, speed)``, the id moved into a dict; ``when`` typed,
  so an upcast result is decoded by the task's annotations like any stored argument.
"""

from __future__ import annotations

import os
from datetime import date
from typing import Any

from flask import Flask

from flask_sqlqueue import SQLQueue
from tests.sample_app import queue_app

old = SQLQueue()
new = SQLQueue()


@old.task(name="orders.ship")
def ship_v1(order_id: int, express: bool = False) -> str:
    return f"v1 {order_id} {express}"


def v1_to_v2(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    order_id, *rest = args
    express = rest[0] if rest else kwargs.pop("express", False)
    return [order_id], {"speed": "fast" if express else "normal"}


def v2_to_v3(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    (order_id,) = args
    return [{"id": order_id}], {**kwargs, "when": "2030-01-02"}


@new.task(name="orders.ship", version=3, upcast={1: v1_to_v2, 2: v2_to_v3})
def ship(order: dict[str, Any], speed: str, when: date | None = None) -> dict[str, Any]:
    return {"order": order, "speed": speed, "when": repr(when), "pid": os.getpid()}


@new.task(name="orders.refund", version=2, isolate=True, upcast={1: v1_to_v2})
def refund(order_id: int, speed: str) -> dict[str, Any]:
    """Run in a child process: it upcasts in the parent and gets version 2's arguments."""
    return {"order_id": order_id, "speed": speed, "pid": os.getpid()}


@old.task(name="orders.refund")
def refund_v1(order_id: int, express: bool = False) -> None:
    raise AssertionError("version 1 never runs in these tests")


def broken(args: list[Any], kwargs: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    raise KeyError("customer")


@new.task(name="orders.bill", version=2, upcast={1: broken})
def bill(order_id: int, customer: str) -> str:
    return f"{order_id} {customer}"


@old.task(name="orders.bill")
def bill_v1(order_id: int) -> str:
    return str(order_id)


def create_old(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__ + ".old", old, config)


def create_new(config: dict[str, Any] | None = None) -> Flask:
    return queue_app(__name__ + ".new", new, config)

"""Procrastinate as its users run it:
``procrastinate --app benchmarks.peers.app_procrastinate.app worker``.

``BENCH_PG_DSN`` names the database.
"""

from __future__ import annotations

import os
from typing import Any

import procrastinate

from benchmarks.peers.probe import stamp


def make(dsn: str) -> tuple[procrastinate.App, Any, Any]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    def noop() -> None:
        """Does nothing."""

    @app.task(name="probe")
    def probe(path: str) -> None:
        stamp(path)

    return app, noop, probe


if "BENCH_PG_DSN" in os.environ:
    app, noop, probe = make(os.environ["BENCH_PG_DSN"])

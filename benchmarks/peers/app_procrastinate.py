"""Procrastinate as its users run it:
``procrastinate --app benchmarks.peers.app_procrastinate.app worker``.

``BENCH_PG_DSN`` names the database.
"""

from __future__ import annotations

import os
from typing import Any

import procrastinate

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp


def make(dsn: str) -> tuple[procrastinate.App, Any, Any]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="write")
    def write(i: int, email: str) -> None:
        """The benchmark's job: one line appended to the output file."""
        workload.write(i, email)

    @app.task(name="probe")
    def probe(path: str) -> None:
        stamp(path)

    return app, write, probe


if "BENCH_PG_DSN" in os.environ:
    app, write, probe = make(os.environ["BENCH_PG_DSN"])

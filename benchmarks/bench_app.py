"""The app the benchmarks run as real ``flask queue work`` processes.

``FLASK_APP=benchmarks.bench_app:create_app``; ``BENCH_DATABASE_URI`` names the database.
"""

from __future__ import annotations

import os

from flask import Flask

from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task(name="bench.noop")
def noop() -> None:
    """Does nothing: what is measured is the queue."""


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = os.environ["BENCH_DATABASE_URI"]
    queue.init_app(app)
    return app

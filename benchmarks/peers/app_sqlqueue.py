"""flask_sqlqueue as its users run it: ``FLASK_APP=benchmarks.peers.app_sqlqueue:create_app``.

``BENCH_DATABASE_URI`` names the queue's database. ``SQLQUEUE_SQLITE_SYNCHRONOUS`` is
set to its default, ``FULL``, explicitly: every commit is fsynced, as for the peers.
"""

from __future__ import annotations

import os

from flask import Flask

from benchmarks.peers.probe import stamp
from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task(name="bench.noop")
def noop() -> None:
    """Does nothing: what is measured is the queue."""


@queue.task(name="bench.probe")
def probe(path: str) -> None:
    stamp(path)


def create_app(database_uri: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = database_uri or os.environ["BENCH_DATABASE_URI"]
    app.config["SQLQUEUE_SQLITE_SYNCHRONOUS"] = "FULL"
    queue.init_app(app)
    return app

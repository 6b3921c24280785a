"""flask_sqlqueue as its users run it: ``FLASK_APP=benchmarks.peers.app_sqlqueue:create_app``.

``BENCH_DATABASE_URI`` names the queue's database; nothing else is configured, so every
setting is flask_sqlqueue's default (on SQLite ``SQLQUEUE_SQLITE_SYNCHRONOUS`` is
``FULL``: every commit is fsynced).
"""

from __future__ import annotations

import os

from flask import Flask

from benchmarks.peers import workload
from benchmarks.peers.probe import stamp
from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task(name="bench.write")
def write(i: int, email: str) -> None:
    """The benchmark's job: one line appended to the output file."""
    workload.write(i, email)


@queue.task(name="bench.probe")
def probe(path: str) -> None:
    stamp(path)


def create_app(database_uri: str | None = None) -> Flask:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = database_uri or os.environ["BENCH_DATABASE_URI"]
    queue.init_app(app)
    return app

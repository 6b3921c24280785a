"""A small shop back end that hands its slow and unreliable work to flask_sqlqueue.

Run it all at once with ``python -m example_app.demo`` (``make demo``), or by hand::

    flask --app example_app queue db upgrade
    flask --app example_app queue work --concurrency 2     # one terminal
    flask --app example_app run                            # another

The queue lives in ``sqlqueue.db`` in the instance folder (``instance/`` next to this
package). Environment overrides:

``EXAMPLE_INSTANCE_PATH``
    another instance folder (the database and the side-effect logs go there).
``EXAMPLE_DATABASE_URI``
    another database for the queue, e.g. ``postgresql+psycopg://localhost/shop``.
``EXAMPLE_FLAKY_FAILURE_RATE``
    how often the partner API fails, 0 to 1 (default 0.5).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flask import Flask

from .tasks import queue
from .views import bp

__all__ = ["create_app", "queue"]


def create_app(config: Mapping[str, Any] | None = None, instance_path: str | None = None) -> Flask:
    instance_path = instance_path or os.environ.get("EXAMPLE_INSTANCE_PATH") or None
    app = Flask(__name__, instance_path=os.path.abspath(instance_path) if instance_path else None)
    app.config.from_mapping(
        # None: the default, a SQLite file in the instance folder.
        SQLQUEUE_DATABASE_URI=os.environ.get("EXAMPLE_DATABASE_URI") or None,
        # Short retries so a demo shows them: 2-3 s, then 4-5 s, 8-9 s, at most 10-11 s.
        SQLQUEUE_BACKOFF_BASE=1.0,
        SQLQUEUE_BACKOFF_CAP=10.0,
        SQLQUEUE_BACKOFF_JITTER=1.0,
        EXAMPLE_FLAKY_FAILURE_RATE=float(os.environ.get("EXAMPLE_FLAKY_FAILURE_RATE", "0.5")),
        EXAMPLE_REPORT_SECONDS=0.5,
    )
    app.config.update(config or {})
    queue.init_app(app)
    app.register_blueprint(bp)
    return app

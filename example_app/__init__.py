"""A small shop back end that hands its slow and unreliable work to flask_sqlqueue.

Run it all at once with ``python -m example_app.demo`` (``make demo``), or by hand::

    flask --app example_app queue db upgrade
    flask --app example_app queue work --concurrency 2     # one terminal
    flask --app example_app run                            # another

The queue lives in ``sqlqueue.db`` in the instance folder (``instance/`` next to this
package). The queue's admin dashboard is at ``/admin/``, open to every request from this
machine, with no login: that is for the demo only, and every page of it says so. A real
app passes ``authorize=`` a check of its own users (see the README's "Admin dashboard").

Environment overrides:

``EXAMPLE_INSTANCE_PATH``
    another instance folder (the database and the side-effect logs go there).
``EXAMPLE_DATABASE_URI``
    another database for the queue, e.g. ``postgresql+psycopg://localhost/shop``.
``EXAMPLE_FLAKY_FAILURE_RATE``
    how often the partner API fails, 0 to 1 (default 0.5).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

from flask import Flask
from flask import request

from .tasks import queue
from .views import bp

#: Shown on every page of the demo's admin.
DEMO_NOTICE = (
    "Demo: open access (anyone on this machine, no login), do not deploy like this. "
    "A real app passes authorize= a check of its own users."
)

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
        # The admin's forms carry CSRF tokens bound to the session; a real app keeps a
        # fixed secret key out of its code.
        SECRET_KEY=secrets.token_hex(32),
    )
    app.config.update(config or {})
    queue.init_app(app)
    app.register_blueprint(bp)
    app.register_blueprint(
        queue.admin_blueprint(authorize=_from_this_machine, notice=DEMO_NOTICE),
        url_prefix="/admin",
    )
    return app


def _from_this_machine() -> bool:
    # The demo serves on the loopback interface only; this keeps the admin shut should
    # someone run the example app on a public address anyway.
    return request.remote_addr in ("127.0.0.1", "::1")

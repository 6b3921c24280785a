"""``SQLQueue``, the class users import: the extension with its adapters wired in.

Why a façade, and not the extension importing its adapters: the Flask glue
(``extension.py``) is what every adapter needs (the commands, the blueprints, the test
helpers find the app's state through it), so an import the other way, even one inside a
method, makes a circle, and made ``init_app`` import the CLI and ``drain()`` import
pytest's plugin module. Here, above all of them, one class keeps the API of the CONTRACT
(``queue.admin_blueprint()``, ``queue.metrics_blueprint()``, ``queue.drain()``, and the
``flask queue`` commands once ``init_app`` ran) and nothing below knows it exists.

Why ``init_app`` adds the commands, rather than a ``flask.commands`` entry point: Flask
looks up entry-point commands before the app's own, and lists them for every app in
the environment, so the group would shadow an app's own ``queue`` command (which
``init_app`` leaves alone) and appear in apps that never set the queue up;
``app.test_cli_runner()`` runs ``app.cli``, which never loads entry points; and an entry
point exists only once the package is installed, not for a checkout on ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from flask import Blueprint
from flask import Flask

from .cli import queue_cli
from .core.jobs import Job
from .extension import QueueExtension

#: The name of the command group ``init_app`` adds: ``flask queue ...``.
COMMAND = "queue"


class SQLQueue(QueueExtension):
    """A background-job queue stored in a database: SQLite by default.

    ::

        queue = SQLQueue()

        @queue.task
        def ping() -> str: ...

        def create_app() -> Flask:
            app = Flask(__name__)
            queue.init_app(app)
            return app

    Tasks may be declared before :meth:`init_app`; one instance may serve several apps.
    """

    def init_app(self, app: Flask) -> None:
        """Set the queue up on ``app``: config defaults, database engine, and the
        ``flask queue`` commands (unless the app has a ``queue`` command of its own).

        :raises ConfigurationError: the app already has a queue, or a setting is invalid.
        """
        super().init_app(app)
        if COMMAND not in app.cli.commands:
            app.cli.add_command(queue_cli, COMMAND)

    def drain(
        self,
        *,
        include_scheduled: bool = False,
        now: datetime | None = None,
        app: Flask | None = None,
    ) -> list[Job]:
        """Run every job eligible now in this thread, through the real claim, until none
        is left: for tests. With ``include_scheduled`` also the ones due later. See
        :func:`flask_sqlqueue.testing.drain`, which also takes a movable clock.

        :returns: each job that ran, as it is now.
        """
        # Imported here: the test helpers load pytest's plugin hooks when pytest is there.
        from .testing import drain

        self.state(app)  # needs an app; refuses one that another SQLQueue serves
        return drain(app, include_scheduled=include_scheduled, now=now)

    def admin_blueprint(
        self,
        authorize: Callable[[], Any] | None = None,
        *,
        notice: str | None = None,
        authorize_write: Callable[[], Any] | None = None,
        actor: Callable[[], Any] | None = None,
    ) -> Blueprint:
        """The admin dashboard as a blueprint named ``"sqlqueue"``; register it with a
        ``url_prefix``. Its forms need ``app.secret_key`` (CSRF tokens).

        ::

            def authorize():
                if not current_user.is_authenticated:
                    return redirect(url_for("login", next=request.url))
                return current_user.is_admin

            app.register_blueprint(queue.admin_blueprint(authorize=authorize), url_prefix="/queue")

        :param authorize: called with no arguments before every request, assets
            included. ``True`` (exactly) lets the request through; a response object,
            such as a redirect to the login page, is sent as it is; anything else
            (``False``, ``None``, ``1``, a user object) is a 403. Without it, the
            dashboard is closed: every request is a 403 saying how to configure it.
        :param notice: a warning shown in a banner at the top of every page, e.g. that
            this instance is a demo with open access.
        :param authorize_write: the check for changes (a read-only mode, docs/admin.md):
            asked as ``authorize`` is about every POST that ``authorize`` let through;
            ``True`` lets it through, a response is sent as it is, anything else is a
            403 saying the user may look but not act, and the pages show no action
            buttons. Without it, whoever ``authorize`` lets in may act.
        :param actor: returns who is acting, as the audit log names them (e.g.
            ``lambda: current_user.email``); without it, the request's remote address
            (or ``"unknown"``).
        """
        # Imported here: a worker process has no use for the admin's views.
        from .admin import create_blueprint

        return create_blueprint(
            self, authorize, notice=notice, authorize_write=authorize_write, actor=actor
        )

    def metrics_blueprint(self, authorize: Callable[[], Any] | None = None) -> Blueprint:
        """A blueprint serving ``GET /metrics`` for Prometheus: the queue's gauges read
        from the database, and the counters of this process (see
        :mod:`flask_sqlqueue.metrics`; needs the ``prometheus`` extra).

        ::

            app.register_blueprint(
                queue.metrics_blueprint(authorize=lambda: request.remote_addr == "10.0.0.5"),
                url_prefix="/queue",
            )

        :param authorize: as for :meth:`admin_blueprint`: ``True`` lets the request
            through, a response is sent as it is, anything else is a 403, and without
            it every request is a 403 saying how to configure it.
        """
        # Imported here: prometheus_client is an optional dependency.
        from .metrics import create_blueprint

        return create_blueprint(authorize)

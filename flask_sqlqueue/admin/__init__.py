"""The admin blueprint: a dashboard, a job list and job pages, closed by default.

::

    app.register_blueprint(queue.admin_blueprint(authorize=lambda: current_user.is_admin),
                           url_prefix="/queue")

Every request calls ``authorize()`` and is refused with 403 when it returns something
falsy; without ``authorize`` every request is refused. Pages are GETs that change
nothing; every change is a POST carrying a CSRF token bound to the session (which needs
``app.secret_key``). Responses forbid inline script and framing; templates and assets
ship in the package, so it works offline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from flask import Blueprint
from flask import Response
from flask import render_template
from flask import request

from . import csrf
from . import views

if TYPE_CHECKING:
    from ..extension import SQLQueue

NAME = "sqlqueue"

#: Sent with every admin response, pages and assets alike.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

NOT_CONFIGURED = (
    "The queue admin is closed until you say who may use it. Pass a function that "
    "returns True for those users: "
    "queue.admin_blueprint(authorize=lambda: current_user.is_admin)."
)
FORBIDDEN = "You are not allowed to use the queue admin."


def create_blueprint(queue: SQLQueue, authorize: Callable[[], Any] | None = None) -> Blueprint:
    """A blueprint named ``"sqlqueue"`` serving the admin pages of ``queue``.

    :param authorize: called with no arguments on every request (in the request
        context); a falsy result answers 403. ``None`` refuses every request.
    """
    bp = Blueprint(
        NAME,
        __name__,
        template_folder="templates",
        static_folder="static",
        static_url_path="/static",
    )
    prefixes: set[str] = set()

    @bp.record
    def _remember_prefix(state: Any) -> None:
        if state.url_prefix:
            prefixes.add(state.url_prefix.rstrip("/") + "/")

    @bp.before_request
    def _gate() -> Response | None:
        if authorize is None:
            return _refuse(NOT_CONFIGURED)
        if not authorize():
            return _refuse(FORBIDDEN)
        if request.method == "POST":
            csrf.check()
        return None

    # An app-wide hook, so that answers Flask gives before the blueprint is known (a GET
    # on a POST-only action is a 405, an unknown URL under the prefix a 404) carry the
    # headers too.
    @bp.after_app_request
    def _secure(response: Response) -> Response:
        path = request.path.rstrip("/") + "/"
        if request.blueprint == NAME or any(path.startswith(p) for p in prefixes):
            response.headers.update(SECURITY_HEADERS)
            if request.endpoint != f"{NAME}.static":
                response.headers["Cache-Control"] = "no-store"
        return response

    views.register(bp, queue)
    return bp


def _refuse(message: str) -> Response:
    return Response(
        render_template("sqlqueue/error.html", title="Forbidden", message=message, status=403),
        status=403,
    )

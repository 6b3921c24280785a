"""The admin blueprint: a dashboard, a job list and job pages, closed by default.

::

    app.register_blueprint(queue.admin_blueprint(authorize=lambda: current_user.is_admin),
                           url_prefix="/queue")

Every request, assets included, calls ``authorize()``: ``True`` lets it through, a
response (a redirect to the login page, say) is sent as it is, anything else is a 403;
without ``authorize`` every request is refused (see :mod:`flask_sqlqueue.access`).
``authorize_write()``, if given, is asked the same about every change (a read-only
mode), and every change is written to the audit log with the name ``actor()`` gives.
Pages are GETs that change nothing; every change is a POST carrying a CSRF token bound
to the session (which needs ``app.secret_key``). Responses forbid inline script and
framing; templates and assets ship in the package, so it works offline. ``notice=``
puts a banner on every page (the example app's demo says its access is open).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from flask import Blueprint
from flask import Response
from flask import g
from flask import render_template
from flask import request
from werkzeug.wrappers import Response as BaseResponse

from .. import access
from ..core.features.audit import Audit
from . import csrf
from . import views
from .context import Admin
from .context import AdminBlueprint

if TYPE_CHECKING:
    from ..extension import QueueExtension

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

WHAT = "queue admin"


def create_blueprint(
    queue: QueueExtension,
    authorize: access.Authorize | None = None,
    *,
    notice: str | None = None,
    authorize_write: access.Authorize | None = None,
    actor: Callable[[], Any] | None = None,
) -> Blueprint:
    """A blueprint named ``"sqlqueue"`` serving the admin pages of ``queue``.

    :param authorize: called with no arguments on every request (in the request
        context): ``True`` lets it through, a response is sent as it is, anything else
        answers 403. ``None`` refuses every request.
    :param notice: a warning shown in a banner at the top of every page, e.g. that
        this instance is a demo with open access.
    :param authorize_write: asked as ``authorize`` is about every change (POST) that
        ``authorize`` let through; where it does not answer ``True`` the pages show no
        action buttons. ``None``: whoever may read may act.
    :param actor: returns the name the audit log gives whoever acts (a user name,
        say); ``None``: the request's remote address, or ``"unknown"``.
    """

    def acting() -> Audit:
        """Who acts in this request, for the audit log."""
        name = actor() if actor is not None else None
        return Audit(name if name is not None else (request.remote_addr or "unknown"))

    bp = AdminBlueprint(
        NAME,
        __name__,
        Admin(queue, acting),
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
    def _gate() -> BaseResponse | None:
        refused = access.gate(authorize, _refuse, what=WHAT, factory="admin_blueprint")
        if refused is None and request.method == "POST":
            if authorize_write is not None:
                refused = access.gate_write(authorize_write, _refuse, what=WHAT)
            if refused is None:
                csrf.check()
        return refused

    def may_write() -> bool:
        """Whether this request's user may act (asked once per request)."""
        if authorize_write is None:
            return True
        if "sqlqueue_may_write" not in g:
            g.sqlqueue_may_write = authorize_write() is True
        return bool(g.sqlqueue_may_write)

    @bp.context_processor
    def _notice() -> dict[str, Any]:
        return {"sqlqueue_notice": notice, "can_write": may_write()}

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

    views.register(bp)
    return bp


def _refuse(message: str) -> Response:
    return Response(
        render_template("sqlqueue/error.html", title="Forbidden", message=message, status=403),
        status=403,
    )

"""The admin's routes, error pages and template helpers: where each URL and endpoint
name (the name the templates' ``url_for`` uses) meets its view in :mod:`.pages` (GETs)
or :mod:`.actions` (POSTs). Reads go through ``core.queries``, writes through
``core.operations`` (as the CLI's do); nothing here knows which database is underneath.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint
from flask import render_template
from werkzeug.exceptions import HTTPException

from ..core.jobs import unreadable_note
from ..exceptions import InvalidTransition
from ..exceptions import SQLQueueError
from . import actions
from . import csrf
from . import pages
from .formatting import absolute
from .formatting import duration
from .formatting import pretty
from .formatting import relative
from .forms import STATUSES
from .forms import BadRequest
from .forms import well_formed

#: The pages, by URL; each view's name is its endpoint.
PAGES: list[tuple[str, Callable[..., Any]]] = [
    ("/", pages.dashboard),
    ("/metrics", pages.metrics),
    ("/workers", pages.workers_page),
    ("/jobs", pages.jobs),
    ("/jobs/<int:job_id>", pages.job),
    ("/jobs/<int:job_id>/workflow", pages.workflow),
    ("/jobs/retry-dead", pages.confirm_retry_dead),
    ("/schedules", pages.schedules),
    ("/audit", pages.audit_page),
]
#: The actions, by URL; each view's name is its endpoint.
ACTIONS: list[tuple[str, Callable[..., Any]]] = [
    ("/schedules/<path:name>/enable", actions.enable_schedule),
    ("/schedules/<path:name>/disable", actions.disable_schedule),
    ("/schedules/<path:name>/run", actions.run_schedule),
    ("/queues/<name>/pause", actions.pause_queue),
    ("/queues/<name>/resume", actions.resume_queue),
    ("/jobs/<int:job_id>/retry", actions.retry),
    ("/jobs/<int:job_id>/cancel", actions.cancel),
    ("/jobs/<int:job_id>/delete", actions.delete),
    ("/jobs/bulk", actions.bulk),
    ("/jobs/retry-dead", actions.retry_dead),
    ("/jobs/<int:job_id>/run-now", actions.run_now),
    ("/jobs/<int:job_id>/duplicate", actions.duplicate),
    ("/jobs/<int:job_id>/edit", actions.edit),
]


def register(bp: Blueprint) -> None:
    """Add the routes, error pages and template helpers to ``bp``, after its gate (the
    ``before_request`` hooks run in the order they were added)."""
    bp.before_request(well_formed)
    bp.context_processor(_helpers)
    for rule, view in PAGES:
        bp.add_url_rule(rule, view_func=view, methods=["GET"])
    for rule, view in ACTIONS:
        bp.add_url_rule(rule, view_func=view, methods=["POST"])
    bp.register_error_handler(csrf.CSRFError, _csrf_error)
    bp.register_error_handler(BadRequest, _bad_request)
    bp.register_error_handler(InvalidTransition, _conflict)
    bp.register_error_handler(SQLQueueError, _unavailable)
    bp.register_error_handler(404, _not_found)


def _helpers() -> dict[str, Any]:
    return {
        "csrf_token": csrf.token,
        "csrf_field": csrf.field(),
        "can_post": csrf.can_protect(),
        "statuses": STATUSES,
        "absolute": absolute,
        "relative": relative,
        "seconds": duration,
        "pretty": pretty,
        "unreadable_note": unreadable_note,
    }


def error_page(title: str, message: str, status: int) -> tuple[str, int]:
    return (
        render_template("sqlqueue/error.html", title=title, message=message, status=status),
        status,
    )


def _csrf_error(exc: csrf.CSRFError) -> tuple[str, int]:
    title = "Security token problem" if exc.status == 400 else "Admin not configured"
    return error_page(title, str(exc), exc.status)


def _bad_request(exc: BadRequest) -> tuple[str, int]:
    return error_page("Bad request", str(exc), 400)


def _conflict(exc: InvalidTransition) -> tuple[str, int]:
    return error_page("Not possible now", str(exc), 409)


def _unavailable(exc: SQLQueueError) -> tuple[str, int]:
    return error_page("Queue unavailable", str(exc), 503)


def _not_found(exc: HTTPException) -> tuple[str, int]:
    return error_page("Not found", exc.description or "Not found.", 404)

"""Where the admin's views find what their blueprint was made for.

The views are module-level functions (:mod:`.pages`, :mod:`.actions`), shared by every
admin blueprint of every app. Each blueprint :func:`~flask_sqlqueue.admin.create_blueprint`
makes is an :class:`AdminBlueprint` carrying an :class:`Admin`: the extension it serves
and who acts in a request. A view reaches it through the request's blueprint
(:func:`current`), so a test can call a view in a request context of the admin's URLs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn

from flask import Blueprint
from flask import abort
from flask import current_app
from flask import request

from ..core.features.audit import Audit

if TYPE_CHECKING:
    from ..core.jobs import Job
    from ..core.store import Store
    from ..extension import QueueExtension
    from ..extension import QueueState


@dataclass(frozen=True, slots=True)
class Admin:
    """What one admin blueprint serves: the extension, and who acts in a request."""

    queue: QueueExtension
    #: Who acts in the current request, for the audit log.
    acting: Callable[[], Audit]

    def state(self) -> QueueState:
        """The current app's queue, its tables checked (once per process) before any view
        reads or writes them."""
        st = self.queue.state()
        st.ensure_schema()
        return st


class AdminBlueprint(Blueprint):
    """A blueprint that carries its :class:`Admin` for the views."""

    def __init__(self, name: str, import_name: str, admin: Admin, **options: Any) -> None:
        super().__init__(name, import_name, **options)
        self.admin = admin


def current() -> Admin:
    """The :class:`Admin` of the blueprint serving this request (registered under any
    name, nested or not: ``app.blueprints`` holds it under the request's full name)."""
    found = current_app.blueprints.get(request.blueprint or "")
    if not isinstance(found, AdminBlueprint):
        raise RuntimeError("The admin's views serve only requests to an admin blueprint.")
    return found.admin


def state() -> QueueState:
    """This request's queue, its tables checked."""
    return current().state()


def acting() -> Audit:
    """Who acts in this request, for the audit log."""
    return current().acting()


def no_job(job_id: int) -> NoReturn:
    """A 404 for a job id that names no job."""
    abort(404, f"There is no job {job_id}; it may have been deleted or purged.")


def job_or_404(store: Store, job_id: int) -> Job:
    """The job ``job_id`` names, or a 404."""
    found = store.get_job(job_id)
    if found is None:
        no_job(job_id)
    return found

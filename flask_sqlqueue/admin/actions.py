"""The admin's actions: POSTs (the blueprint's gate has checked the CSRF token and the
right to write). Each is shaped as ``core.operations`` is: parse the request's input,
run one operation (written with the audit entry naming who acts, in its transaction),
and answer with one message and a redirect (303) to the page to look at next.
"""

from __future__ import annotations

from flask import flash
from flask import redirect
from flask import request
from flask import url_for
from werkzeug.wrappers import Response as BaseResponse

from ..core import operations
from ..core.features.audit import Audit
from ..core.store import Store
from ..exceptions import UnknownSchedule
from .context import acting
from .context import current
from .context import job_or_404
from .context import state
from .forms import Bulk
from .forms import Edit
from .forms import Filters
from .forms import missing_as_not_found
from .forms import refused_as_bad_request


def done(message: str, to: str, category: str = "success") -> BaseResponse:
    """The answer to an action: ``message`` on the next page, ``to``."""
    flash(message, category)
    return redirect(to, 303)


def _s(n: int) -> str:
    return "s" if n != 1 else ""


# -- schedules ---------------------------------------------------------------------------


def enable_schedule(name: str) -> BaseResponse:
    return _set_schedule_enabled(name, enabled=True)


def disable_schedule(name: str) -> BaseResponse:
    return _set_schedule_enabled(name, enabled=False)


def _set_schedule_enabled(name: str, *, enabled: bool) -> BaseResponse:
    st = state()
    with missing_as_not_found(UnknownSchedule):
        changed = operations.set_schedule_enabled(
            st.store, name, enabled=enabled, registry=st.registry, audit=acting()
        )
    word = "enabled" if enabled else "disabled: no worker enqueues its runs"
    was = "enabled" if enabled else "disabled"
    return _switched(
        changed, f"Schedule {name} is {word}.", f"Schedule {name} was {was} already.", ".schedules"
    )


def run_schedule(name: str) -> BaseResponse:
    state()  # the schema checked before anything is written
    with missing_as_not_found(UnknownSchedule):
        job = current().queue.run_schedule(name, actor=acting().actor)
    return done(f"Schedule {name}: one run enqueued now, as job {job.id}.", url_for(".schedules"))


# -- queues ------------------------------------------------------------------------------


def pause_queue(name: str) -> BaseResponse:
    return _set_paused(name, paused=True)


def resume_queue(name: str) -> BaseResponse:
    return _set_paused(name, paused=False)


def _set_paused(name: str, *, paused: bool) -> BaseResponse:
    st = state()
    with refused_as_bad_request(ValueError, LookupError):
        changed = operations.set_paused(
            st.store, [name], paused=paused, registry=st.registry, audit=acting()
        )
    word = "paused: no worker claims its jobs" if paused else "resumed"
    was = "already paused" if paused else "not paused"
    return _switched(
        bool(changed), f"Queue {name} is {word}.", f"Queue {name} was {was}.", ".dashboard"
    )


def _switched(changed: bool, now: str, already: str, endpoint: str) -> BaseResponse:
    """The answer to switching a schedule or a queue: what it is now, or that it was so
    already (a no-op, not an error)."""
    return done(now if changed else already, url_for(endpoint), "success" if changed else "info")


# -- one job -----------------------------------------------------------------------------


def retry(job_id: int) -> BaseResponse:
    operations.retry(state().store, [job_id], audit=acting())
    return done(
        f"Job {job_id} is pending again, with fresh attempts.", url_for(".job", job_id=job_id)
    )


def cancel(job_id: int) -> BaseResponse:
    cancelled = operations.cancel(state().store, [job_id], audit=acting())
    if cancelled.requested:
        message = (
            f"Job {job_id} is asked to stop; it stops when its task checks "
            "current_job.cancel_requested, or runs to its end if it never does."
        )
    else:
        message = f"Job {job_id} is cancelled."
    return done(message, url_for(".job", job_id=job_id))


def delete(job_id: int) -> BaseResponse:
    operations.delete(state().store, [job_id], audit=acting())
    return done(f"Job {job_id} is deleted.", url_for(".jobs"))


def run_now(job_id: int) -> BaseResponse:
    moved = operations.run_now(state().store, [job_id], audit=acting())
    to = url_for(".job", job_id=job_id)
    if moved:
        return done(f"Job {job_id} is due now.", to)
    return done(f"Job {job_id} was due already.", to, "info")


def duplicate(job_id: int) -> BaseResponse:
    st = state()
    with refused_as_bad_request(TypeError, ValueError):
        made = operations.duplicate(st.store, st.registry, job_id, audit=acting())
    return done(f"Job {made.id} is a copy of job {job_id}.", url_for(".job", job_id=made.id))


def edit(job_id: int) -> BaseResponse:
    st = state()
    found = job_or_404(st.store, job_id)
    form = Edit.parse()
    with refused_as_bad_request(TypeError, ValueError):
        replayed = operations.replay_edited(
            st.store, st.registry, job_id, **form.changes(found), audit=acting()
        )
    return done(
        f"Job {job_id} is {replayed.status} again on queue {replayed.queue}, with fresh attempts.",
        url_for(".job", job_id=job_id),
    )


# -- many jobs ---------------------------------------------------------------------------


def _bulk_retry(store: Store, ids: list[int], audit: Audit) -> int:
    return operations.retry(store, ids, audit=audit)


def _bulk_cancel(store: Store, ids: list[int], audit: Audit) -> int:
    return operations.cancel(store, ids, audit=audit).count


def _bulk_delete(store: Store, ids: list[int], audit: Audit) -> int:
    return operations.delete(store, ids, audit=audit)


#: Each bulk action: its operation (returning how many jobs it changed) and what it did.
BULK = {
    "retry": (_bulk_retry, "retried"),
    "cancel": (_bulk_cancel, "cancelled (running ones asked to stop)"),
    "delete": (_bulk_delete, "deleted"),
}


def bulk() -> BaseResponse:
    form = Bulk.parse(request.form, BULK)
    back = url_for(".jobs", **form.filters.args())
    if not form.ids:
        return done("Select at least one job first.", back, "error")
    audit = acting()
    operation, what = BULK[form.action]
    n = operation(state().store, form.ids, audit)
    return done(f"{n} job{_s(n)} {what}.", back)


def retry_dead() -> BaseResponse:
    filters = Filters.parse(request.form)
    n = operations.retry_dead(
        state().store,
        queue=filters.queue or None,
        task=filters.task or None,
        text=filters.q or None,
        tag=filters.tag or None,
        audit=acting(),
    )
    return done(
        f"{n} dead job{_s(n)} replayed with fresh attempts.",
        url_for(".jobs", **{**filters.args(), "status": "pending"}),
    )

"""The admin's pages and actions. Reads go through ``core.queries``, writes through
``core.lifecycle``; nothing here knows which database is underneath."""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING
from typing import Any

from flask import Blueprint
from flask import abort
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from sqlalchemy.engine import Connection
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from ..core import lifecycle
from ..core import queries
from ..core.models import JobStatus
from ..exceptions import SQLQueueError
from . import csrf

if TYPE_CHECKING:
    from ..extension import SQLQueue
    from ..extension import _State

STATUSES = [status.value for status in JobStatus]
MAX_ID = 2**63 - 1
PER_PAGE = 50
MAX_PER_PAGE = 200
#: Ids replayed per statement when replaying a free-text selection of dead jobs.
CHUNK = 500


class BadRequest(Exception):
    """A malformed query parameter or form field: a 400 page with this message."""


@dataclass(frozen=True, slots=True)
class Filters:
    status: str = ""
    queue: str = ""
    task: str = ""
    q: str = ""

    @classmethod
    def parse(cls, values: Any) -> Filters:
        status = values.get("status", "").strip()
        if status and status not in STATUSES:
            raise BadRequest(f"Unknown status {status!r}; use one of {', '.join(STATUSES)}.")
        return cls(
            status=status,
            queue=values.get("queue", "").strip(),
            task=values.get("task", "").strip(),
            q=values.get("q", "").strip(),
        )

    def query(self, **override: str) -> queries.JobFilter:
        values = {**self.args(), **override}
        return queries.JobFilter(
            status=values.get("status") or None,
            queue=values.get("queue") or None,
            task=values.get("task") or None,
            text=values.get("q") or None,
        )

    def args(self) -> dict[str, Any]:
        """The non-empty filters, as query parameters for ``url_for``."""
        return {
            k: v
            for k, v in (
                ("status", self.status),
                ("queue", self.queue),
                ("task", self.task),
                ("q", self.q),
            )
            if v
        }


def _int_arg(name: str, low: int, high: int) -> int | None:
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, not {raw!r}.")
    return int(raw)


def _ids(values: Sequence[str]) -> list[int]:
    ids = []
    for raw in values:
        if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_ID:
            raise BadRequest(f"{raw!r} is not a job id.")
        ids.append(int(raw))
    return ids


def register(bp: Blueprint, queue: SQLQueue) -> None:
    """Add the routes, error pages and template helpers to ``bp``."""

    def state() -> _State:
        st = queue.state()
        st.ensure_schema()
        return st

    @bp.context_processor
    def _helpers() -> dict[str, Any]:
        return {
            "csrf_token": csrf.token,
            "csrf_field": csrf.FIELD,
            "can_post": csrf.can_protect(),
            "statuses": STATUSES,
            "absolute": absolute,
            "relative": relative,
            "pretty": pretty,
        }

    # -- errors -----------------------------------------------------------------------

    def error_page(title: str, message: str, status: int) -> tuple[str, int]:
        return (
            render_template("sqlqueue/error.html", title=title, message=message, status=status),
            status,
        )

    @bp.errorhandler(csrf.CSRFError)
    def _csrf_error(exc: csrf.CSRFError) -> tuple[str, int]:
        title = "Security token problem" if exc.status == 400 else "Admin not configured"
        return error_page(title, str(exc), exc.status)

    @bp.errorhandler(BadRequest)
    def _bad_request(exc: BadRequest) -> tuple[str, int]:
        return error_page("Bad request", str(exc), 400)

    @bp.errorhandler(lifecycle.InvalidTransition)
    def _conflict(exc: lifecycle.InvalidTransition) -> tuple[str, int]:
        return error_page("Not possible now", str(exc), 409)

    @bp.errorhandler(SQLQueueError)
    def _unavailable(exc: SQLQueueError) -> tuple[str, int]:
        return error_page("Queue unavailable", str(exc), 503)

    @bp.errorhandler(404)
    def _not_found(exc: HTTPException) -> tuple[str, int]:
        return error_page("Not found", exc.description or "Not found.", 404)

    # -- pages ------------------------------------------------------------------------

    @bp.get("/")
    def dashboard() -> str:
        st = state()
        now = st.store.now()
        with st.store.read() as conn:
            by_queue = queries.status(conn, now)
            workers = queries.live_workers(conn)
            running = queries.running_jobs(conn)
            throughput = queries.throughput(conn, now)
        totals = {s: sum(q.counts.get(s, 0) for q in by_queue) for s in STATUSES}
        running_by_worker: dict[str | None, list[Any]] = {}
        for job in running:
            running_by_worker.setdefault(job.worker_id, []).append(job)
        worker_rows = [
            {
                "row": w,
                "queues": w.queues.split(",") if w.queues else [],
                "silent": (now - w.last_heartbeat_at).total_seconds(),
                "stale": (now - w.last_heartbeat_at).total_seconds() > st.settings.stale_after,
                "running": running_by_worker.get(w.id, []),
            }
            for w in workers
        ]
        known = {w.id for w in workers}
        orphans = [j for j in running if j.worker_id not in known]
        return render_template(
            "sqlqueue/dashboard.html",
            now=now,
            by_queue=by_queue,
            totals=totals,
            workers=worker_rows,
            orphans=orphans,
            chart=chart(throughput),
            stale_after=st.settings.stale_after,
        )

    @bp.get("/jobs")
    def jobs() -> str:
        st = state()
        filters = Filters.parse(request.args)
        before = _int_arg("before", 1, MAX_ID)
        per_page = _int_arg("per_page", 1, MAX_PER_PAGE) or PER_PAGE
        with st.store.read() as conn:
            page = queries.search_jobs(conn, filters.query(), before_id=before, limit=per_page + 1)
            dead = (
                queries.count_jobs(conn, filters.query(status=JobStatus.DEAD.value))
                if filters.status in ("", JobStatus.DEAD.value)
                else 0
            )
            queue_names = [q.queue for q in queries.status(conn, st.store.now())]
            tasks = queries.task_names(conn)
        more = len(page) > per_page
        page = page[:per_page]
        older = (
            url_for(".jobs", **filters.args(), before=page[-1].id, **_per_page(per_page))
            if more
            else None
        )
        return render_template(
            "sqlqueue/jobs.html",
            now=st.store.now(),
            jobs=page,
            filters=filters,
            before=before,
            older=older,
            newest=url_for(".jobs", **filters.args(), **_per_page(per_page)) if before else None,
            dead=dead,
            queue_names=queue_names,
            tasks=tasks,
            per_page=per_page,
        )

    @bp.get("/jobs/<int:job_id>")
    def job(job_id: int) -> str:
        st = state()
        found = st.store.get_job(job_id) if job_id <= MAX_ID else None
        if found is None:
            abort(404, f"There is no job {job_id}; it may have been deleted or purged.")
        with st.store.read() as conn:
            effects = queries.job_effects(conn, job_id)
        errors = found.errors if isinstance(found.errors, list) else []
        return render_template(
            "sqlqueue/job.html",
            now=st.store.now(),
            job=found,
            effects=effects,
            errors=[e for e in errors if isinstance(e, dict)],
            raw_errors=None if isinstance(found.errors, list) else found.errors,
        )

    @bp.get("/jobs/retry-dead")
    def confirm_retry_dead() -> str:
        st = state()
        filters = Filters.parse(request.args)
        with st.store.read() as conn:
            count = queries.count_jobs(conn, filters.query(status=JobStatus.DEAD.value))
        back = url_for(".jobs", **{**filters.args(), "status": JobStatus.DEAD.value})
        return render_template("sqlqueue/confirm.html", filters=filters, count=count, back=back)

    # -- actions (POST only; the gate has checked the CSRF token) --------------------------

    def write(fn: Callable[[Connection], int]) -> int:
        st = state()
        n = st.store.run_write(fn)
        st.store.wake()
        return n

    @bp.post("/jobs/<int:job_id>/retry")
    def retry(job_id: int) -> BaseResponse:
        now = state().store.now()
        write(lambda conn: lifecycle.replay(conn, [job_id], now))
        flash(f"Job {job_id} is pending again, with fresh attempts.", "success")
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.post("/jobs/<int:job_id>/cancel")
    def cancel(job_id: int) -> BaseResponse:
        now = state().store.now()
        write(lambda conn: lifecycle.cancel(conn, [job_id], now))
        flash(f"Job {job_id} is cancelled.", "success")
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.post("/jobs/<int:job_id>/delete")
    def delete(job_id: int) -> BaseResponse:
        write(lambda conn: lifecycle.delete(conn, [job_id]))
        flash(f"Job {job_id} is deleted.", "success")
        return redirect(url_for(".jobs"), 303)

    @bp.post("/jobs/bulk")
    def bulk() -> BaseResponse:
        filters = Filters.parse(request.form)
        back = url_for(".jobs", **filters.args())
        ids = _ids(request.form.getlist("ids"))
        action = request.form.get("action", "")
        if not ids:
            flash("Select at least one job first.", "error")
            return redirect(back, 303)
        now = state().store.now()
        actions: dict[str, tuple[Callable[[Connection], int], str]] = {
            "retry": (lambda conn: lifecycle.replay(conn, ids, now), "retried"),
            "cancel": (lambda conn: lifecycle.cancel(conn, ids, now), "cancelled"),
            "delete": (lambda conn: lifecycle.delete(conn, ids), "deleted"),
        }
        if action not in actions:
            raise BadRequest(f"Unknown action {action!r}; use retry, cancel or delete.")
        fn, done = actions[action]
        n = write(fn)
        flash(f"{n} job{'s' if n != 1 else ''} {done}.", "success")
        return redirect(back, 303)

    @bp.post("/jobs/retry-dead")
    def retry_dead() -> BaseResponse:
        filters = Filters.parse(request.form)
        now = state().store.now()

        def replay(conn: Connection) -> int:
            if not filters.q:
                return lifecycle.replay_dead(conn, now, filters.queue or None, filters.task or None)
            ids = queries.job_ids(conn, filters.query(status=JobStatus.DEAD.value))
            return sum(
                lifecycle.replay(conn, ids[i : i + CHUNK], now) for i in range(0, len(ids), CHUNK)
            )

        n = write(replay)
        flash(f"{n} dead job{'s' if n != 1 else ''} replayed with fresh attempts.", "success")
        return redirect(url_for(".jobs", **{**filters.args(), "status": "pending"}), 303)


def _per_page(per_page: int) -> dict[str, Any]:
    return {} if per_page == PER_PAGE else {"per_page": per_page}


# -- template helpers ---------------------------------------------------------------------


def absolute(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime | None, now: datetime) -> str:
    """``"3 min ago"`` or ``"in 20 s"``."""
    if value is None:
        return ""
    seconds = (now - value).total_seconds()
    return f"{duration(abs(seconds))} ago" if seconds >= 0 else f"in {duration(-seconds)}"


def duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return (
                f"{seconds / size:.0f} {unit}"
                if seconds < size * 10
                else (f"{int(seconds // size)} {unit}")
            )
    return f"{seconds:.0f} s"


def pretty(value: Any) -> str:
    """JSON, indented, non-ASCII kept as is (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=repr)


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    completed_y: float
    completed_h: float
    dead_y: float
    dead_h: float
    label: str


def chart(data: queries.Throughput, width: int = 960, height: int = 120) -> dict[str, Any]:
    """Stacked per-minute bars for an inline SVG, computed here so the page needs no JS."""
    totals = [c + d for c, d in zip(data.completed, data.dead, strict=True)]
    top = max([*totals, 1])
    slot = width / max(len(totals), 1)
    bars = []
    for i, start in enumerate(data.starts):
        c_h = height * data.completed[i] / top
        d_h = height * data.dead[i] / top
        bars.append(
            Bar(
                x=round(i * slot + 0.5, 2),
                width=round(max(slot - 1, 1), 2),
                completed_y=round(height - c_h, 2),
                completed_h=round(c_h, 2),
                dead_y=round(height - c_h - d_h, 2),
                dead_h=round(d_h, 2),
                label=(
                    f"{start:%H:%M} UTC: {data.completed[i]} completed, {data.dead[i]} went dead"
                ),
            )
        )
    return {
        "width": width,
        "height": height,
        "bars": bars,
        "top": top,
        "completed": sum(data.completed),
        "dead": sum(data.dead),
        "first": data.starts[0] if data.starts else None,
    }

"""The admin's pages and actions. Reads go through ``core.queries``, writes through
``core.operations`` (as the CLI's do); nothing here knows which database is underneath."""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any

from flask import Blueprint
from flask import abort
from flask import flash
from flask import redirect
from flask import render_template
from flask import request
from flask import url_for
from markupsafe import Markup
from markupsafe import escape
from sqlalchemy.engine import Connection
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as BaseResponse

from ..core import batches
from ..core import dependencies
from ..core import limits
from ..core import operations
from ..core import periodic
from ..core import queries
from ..core import queues
from ..core import retention
from ..core import roster
from ..core.audit import Audit
from ..core.jobs import unreadable_note
from ..core.models import JobStatus
from ..core.retries import retry_plan
from ..core.tags import check_tag
from ..core.tasks import task_timeouts
from ..exceptions import InvalidTransition
from ..exceptions import SQLQueueError
from ..exceptions import UnknownSchedule
from . import csrf
from .workflow import BOX_HEIGHT
from .workflow import BOX_WIDTH
from .workflow import draw

if TYPE_CHECKING:
    from ..core.store import Store
    from ..extension import QueueExtension
    from ..extension import QueueState

STATUSES = [status.value for status in JobStatus]
#: Audit entries a page of the audit log shows, and a job's page at most.
AUDIT_PAGE = 50
JOB_AUDIT = 20
#: Jobs a workflow page shows at most (the walk from the job stops there).
WORKFLOW_MOST = 300
MAX_ID = 2**63 - 1
PER_PAGE = 50
MAX_PER_PAGE = 200


@dataclass(frozen=True, slots=True)
class Span:
    """A span the dashboard's charts can show."""

    length: timedelta
    step: timedelta
    title: str
    per: str
    #: Axis labels at the left edge and the middle.
    start: str
    middle: str
    #: Seconds between auto-refreshes.
    refresh: int


SPANS = {
    "1h": Span(
        timedelta(hours=1),
        timedelta(minutes=1),
        "last hour",
        "per minute",
        "\u221260 min",
        "\u221230 min",
        5,
    ),
    "24h": Span(
        timedelta(days=1),
        timedelta(minutes=10),
        "last day",
        "per 10 minutes",
        "\u221224 h",
        "\u221212 h",
        60,
    ),
}
#: The metrics page's windows, with their names.
WINDOWS: dict[str, tuple[timedelta, str]] = {
    "1h": (timedelta(hours=1), "last hour"),
    "24h": (timedelta(days=1), "last 24 hours"),
    "7d": (timedelta(days=7), "last 7 days"),
}
#: Latest completed jobs per task that the duration percentiles and mean wait come from.
METRICS_SAMPLE = 500


class BadRequest(Exception):
    """A malformed query parameter or form field: a 400 page with this message."""


@dataclass(frozen=True, slots=True)
class Filters:
    status: str = ""
    queue: str = ""
    task: str = ""
    q: str = ""
    tag: str = ""

    @classmethod
    def parse(cls, values: Any) -> Filters:
        status = values.get("status", "").strip()
        if status and status not in STATUSES:
            raise BadRequest(f"Unknown status {status!r}; use one of {', '.join(STATUSES)}.")
        tag = values.get("tag", "").strip()
        if tag:
            try:
                check_tag(tag)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        return cls(
            status=status,
            queue=values.get("queue", "").strip(),
            task=values.get("task", "").strip(),
            q=values.get("q", "").strip(),
            tag=tag,
        )

    def query(self, **override: str) -> queries.JobFilter:
        values = {**self.args(), **override}
        return queries.JobFilter(
            status=values.get("status") or None,
            queue=values.get("queue") or None,
            task=values.get("task") or None,
            text=values.get("q") or None,
            tag=values.get("tag") or None,
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
                ("tag", self.tag),
            )
            if v
        }


def _digits(text: str) -> bool:
    # str.isdigit() is also true of "²", which int() refuses.
    return text.isascii() and text.isdigit()


def _int_arg(name: str, low: int, high: int) -> int | None:
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    if not _digits(raw) or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, not {raw!r}.")
    return int(raw)


def _choice(name: str, choices: dict[str, Any], default: str) -> str:
    raw = request.args.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}, not {raw!r}.")
    return raw


def _ids(values: Sequence[str]) -> list[int]:
    ids = []
    for raw in values:
        if not _digits(raw.strip()) or not 1 <= int(raw) <= MAX_ID:
            raise BadRequest(f"{raw!r} is not a job id.")
        ids.append(int(raw))
    return ids


def register(bp: Blueprint, queue: QueueExtension, acting: Callable[[], Audit]) -> None:
    """Add the routes, error pages and template helpers to ``bp``.

    :param acting: who acts in the current request, for the audit log.
    """

    def state() -> QueueState:
        st = queue.state()
        st.ensure_schema()
        return st

    @bp.before_request
    def _well_formed() -> None:
        # Every value a page or action may put in a query, checked once for all of them:
        # PostgreSQL refuses NUL in text, so one would fail its statement with a 500.
        given = [*request.args.items(multi=True), *(request.view_args or {}).items()]
        if request.method == "POST":
            given += request.form.items(multi=True)
        for name, value in given:
            if isinstance(value, str) and "\x00" in value:
                raise BadRequest(
                    f"{name} holds a NUL character (%00), which no queue, task, key or "
                    "error can contain; remove it from the address or the form."
                )
        job_id = (request.view_args or {}).get("job_id")
        if isinstance(job_id, int) and job_id > MAX_ID:
            abort(404, f"There is no job {job_id}: job ids stop at {MAX_ID}.")

    @bp.context_processor
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

    @bp.errorhandler(InvalidTransition)
    def _conflict(exc: InvalidTransition) -> tuple[str, int]:
        return error_page("Not possible now", str(exc), 409)

    @bp.errorhandler(SQLQueueError)
    def _unavailable(exc: SQLQueueError) -> tuple[str, int]:
        return error_page("Queue unavailable", str(exc), 503)

    @bp.errorhandler(404)
    def _not_found(exc: HTTPException) -> tuple[str, int]:
        return error_page("Not found", exc.description or "Not found.", 404)

    # -- pages ------------------------------------------------------------------------

    def worker_rows(
        st: QueueState, conn: Connection, now: datetime, running: list[Any]
    ) -> list[dict[str, Any]]:
        fresh = roster.heartbeat_fresh(st.store, st.settings.stale_after, now)
        running_by_worker: dict[str | None, list[Any]] = {}
        for job in running:
            running_by_worker.setdefault(job.worker_id, []).append(job)
        return [
            {
                "row": w,
                "queues": w.queues.split(",") if w.queues else [],
                "stale": not w.fresh,
                "running": running_by_worker.get(w.id, []),
                "ahead": queries.claimed_ahead(w),
            }
            for w in queries.live_workers(conn, fresh)
        ]

    @bp.get("/")
    def dashboard() -> str:
        st = state()
        span = _choice("span", SPANS, "1h")
        now = st.store.now()
        with reading(st) as conn:
            by_queue = queries.queue_counts(conn, now)
            running = queries.running_jobs(conn)
            workers = worker_rows(st, conn, now, running)
            data = queries.activity(conn, now, span=SPANS[span].length, step=SPANS[span].step)
            paused = queues.paused_queues(conn)
            buckets = limits.describe(conn, queue.registry, now)
            fresh = roster.heartbeat_fresh(st.store, st.settings.stale_after, now)
            unserved = queries.coverage(conn, fresh).warnings(queue.registry)
        schedules = periodic.describe(st.store, queue.registry, now)
        totals = {s: sum(q.counts.get(s, 0) for q in by_queue) for s in STATUSES}
        # A total made of a capped count is a lower bound too.
        capped = {s for q in by_queue for s in q.capped}
        known = {w["row"].id for w in workers}
        orphans = [j for j in running if j.worker_id not in known]
        return render_template(
            "sqlqueue/dashboard.html",
            now=now,
            by_queue=by_queue,
            totals=totals,
            capped=capped,
            caps=queries.COUNT_CAPS,
            workers=workers,
            orphans=orphans,
            span=span,
            spans=SPANS,
            chosen=SPANS[span],
            activity=activity_chart(data),
            depth=depth_chart(data),
            stale_after=st.settings.stale_after,
            paused=paused,
            # Paused queues without jobs get a row too, so they can be resumed here.
            queue_names=sorted({q.queue for q in by_queue} | set(paused)),
            limits=buckets,
            schedules=schedules,
            retention=retention.describe(retention.RetentionPolicy.from_settings(st.settings)),
            timeouts=task_timeouts(queue.registry),
            unserved=unserved,
        )

    @bp.get("/metrics")
    def metrics() -> str:
        st = state()
        window = _choice("window", WINDOWS, "24h")
        now = st.store.now()
        since = now - WINDOWS[window][0]
        with reading(st) as conn:
            rows = queries.task_metrics(conn, since, sample=METRICS_SAMPLE)
        return render_template(
            "sqlqueue/metrics.html",
            now=now,
            since=since,
            window=window,
            windows=WINDOWS,
            rows=rows,
            sample=METRICS_SAMPLE,
            seconds=seconds,
        )

    @bp.get("/workers")
    def workers_page() -> str:
        st = state()
        now = st.store.now()
        since = now - roster.GONE_WORKERS_KEPT
        with reading(st) as conn:
            live = worker_rows(st, conn, now, queries.running_jobs(conn))
            gone = queries.gone_workers(conn, since)
        return render_template(
            "sqlqueue/workers.html",
            now=now,
            workers=live,
            gone=[{"row": w, "queues": w.queues.split(",") if w.queues else []} for w in gone],
            kept=roster.GONE_WORKERS_KEPT,
            stale_after=st.settings.stale_after,
        )

    @bp.get("/jobs")
    def jobs() -> str:
        st = state()
        filters = Filters.parse(request.args)
        before = _int_arg("before", 1, MAX_ID)
        per_page = _int_arg("per_page", 1, MAX_PER_PAGE) or PER_PAGE
        with reading(st) as conn:
            queue_names = queries.distinct_values(conn, "queue")
            tasks = queries.distinct_values(conn, "task")
            # A queue or task no job has (a typo in the task box) matches nothing; asking
            # anyway would walk every job, newest first, looking for one.
            unknown = any(
                value and value not in known and len(known) < queries.MAX_DISTINCT
                for value, known in ((filters.queue, queue_names), (filters.task, tasks))
            )
            page = (
                []
                if unknown
                else queries.search_jobs(
                    conn, filters.query(), before_id=before, limit=per_page + 1
                )
            )
            # With free text, counting would read every dead job's error a second time;
            # the confirmation page counts before anything is replayed.
            dead: int | None = (
                0
                if unknown or filters.status not in ("", JobStatus.DEAD.value)
                else None
                if filters.q
                else queries.count_jobs(conn, filters.query(status=JobStatus.DEAD.value))
            )
            dead_ids = [j.id for j in page[:per_page] if j.status == JobStatus.DEAD]
            effects = queries.effects_by_job(conn, dead_ids)
        quarantined = {
            j.id for j in page if queries.quarantined(j.status, j.crashes, st.settings.max_crashes)
        }
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
            effects=effects,
            quarantined=quarantined,
        )

    @bp.get("/jobs/<int:job_id>")
    def job(job_id: int) -> str:
        st = state()
        found = st.store.get_job(job_id)
        if found is None:
            abort(404, f"There is no job {job_id}; it may have been deleted or purged.")
        with reading(st) as conn:
            effects = queries.job_effects(conn, job_id)
            edges = dependencies.job_edges(conn, job_id)
        history = operations.audit_entries(st.store, limit=JOB_AUDIT, job_id=job_id)
        batch = None if found.batch_id is None else batches.get_batch(st.store, found.batch_id)
        errors = found.errors if isinstance(found.errors, list) else []
        registered = st.registry.get(found.task)
        own = registered.backoff if registered is not None else None
        return render_template(
            "sqlqueue/job.html",
            now=st.store.now(),
            job=found,
            planned=retry_plan(found, st.store.backoff, own),
            registered=registered,
            upcast=None if registered is None else registered.upcast_preview(found),
            edges=edges,
            batch=None if batch is None else batch.summary(job_id),
            effects=effects,
            replay_note=queries.replay_note(effects),
            max_crashes=st.settings.max_crashes,
            quarantined=queries.quarantined(found.status, found.crashes, st.settings.max_crashes),
            errors=[e for e in errors if isinstance(e, dict)],
            raw_errors=None if isinstance(found.errors, list) else found.errors,
            history=history,
            history_most=JOB_AUDIT,
        )

    @bp.get("/jobs/<int:job_id>/workflow")
    def workflow(job_id: int) -> str:
        st = state()
        with reading(st) as conn:
            flow = dependencies.workflow(conn, job_id, most=WORKFLOW_MOST)
        if flow.jobs[job_id] is None:
            abort(404, f"There is no job {job_id}; it may have been deleted or purged.")
        counts: dict[str, int] = {}
        for member in flow.jobs.values():
            status = member[1] if member is not None else "gone"
            counts[status] = counts.get(status, 0) + 1
        return render_template(
            "sqlqueue/workflow.html",
            job_id=job_id,
            flow=flow,
            picture=draw(flow),
            box=(BOX_WIDTH, BOX_HEIGHT),
            counts=counts,
            most=WORKFLOW_MOST,
        )

    @bp.get("/jobs/retry-dead")
    def confirm_retry_dead() -> str:
        st = state()
        filters = Filters.parse(request.args)
        with reading(st) as conn:
            count = queries.count_jobs(conn, filters.query(status=JobStatus.DEAD.value))
        back = url_for(".jobs", **{**filters.args(), "status": JobStatus.DEAD.value})
        return render_template("sqlqueue/confirm.html", filters=filters, count=count, back=back)

    @bp.get("/schedules")
    def schedules() -> str:
        st = state()
        now = st.store.now()
        return render_template(
            "sqlqueue/schedules.html",
            now=now,
            schedules=periodic.describe(st.store, queue.registry, now),
        )

    # -- actions (POST only; the gate has checked the CSRF token) --------------------------

    @bp.post("/schedules/<path:name>/enable")
    def enable_schedule(name: str) -> BaseResponse:
        return set_schedule_enabled(name, enabled=True)

    @bp.post("/schedules/<path:name>/disable")
    def disable_schedule(name: str) -> BaseResponse:
        return set_schedule_enabled(name, enabled=False)

    def set_schedule_enabled(name: str, *, enabled: bool) -> BaseResponse:
        st = state()
        try:
            changed = operations.set_schedule_enabled(
                st.store, name, enabled=enabled, registry=st.registry, audit=acting()
            )
        except UnknownSchedule as exc:
            abort(404, str(exc))
        word = "enabled" if enabled else "disabled: no worker enqueues its runs"
        if changed:
            flash(f"Schedule {name} is {word}.", "success")
        else:
            flash(f"Schedule {name} was {'enabled' if enabled else 'disabled'} already.", "info")
        return redirect(url_for(".schedules"), 303)

    @bp.post("/schedules/<path:name>/run")
    def run_schedule(name: str) -> BaseResponse:
        state()  # the schema checked before anything is written
        try:
            job = queue.run_schedule(name, actor=acting().actor)
        except UnknownSchedule as exc:
            abort(404, str(exc))
        flash(f"Schedule {name}: one run enqueued now, as job {job.id}.", "success")
        return redirect(url_for(".schedules"), 303)

    @bp.post("/queues/<name>/pause")
    def pause_queue(name: str) -> BaseResponse:
        return set_paused(name, paused=True)

    @bp.post("/queues/<name>/resume")
    def resume_queue(name: str) -> BaseResponse:
        return set_paused(name, paused=False)

    def set_paused(name: str, *, paused: bool) -> BaseResponse:
        st = state()
        try:
            changed = operations.set_paused(
                st.store, [name], paused=paused, registry=st.registry, audit=acting()
            )
        except (ValueError, LookupError) as exc:
            raise BadRequest(str(exc)) from None
        if changed:
            done = "paused: no worker claims its jobs" if paused else "resumed"
            flash(f"Queue {name} is {done}.", "success")
        else:
            flash(f"Queue {name} was {'already paused' if paused else 'not paused'}.", "info")
        return redirect(url_for(".dashboard"), 303)

    @bp.post("/jobs/<int:job_id>/retry")
    def retry(job_id: int) -> BaseResponse:
        operations.retry(state().store, [job_id], audit=acting())
        flash(f"Job {job_id} is pending again, with fresh attempts.", "success")
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.post("/jobs/<int:job_id>/cancel")
    def cancel(job_id: int) -> BaseResponse:
        done = operations.cancel(state().store, [job_id], audit=acting())
        if done.requested:
            flash(
                f"Job {job_id} is asked to stop; it stops when its task checks "
                "current_job.cancel_requested, or runs to its end if it never does.",
                "success",
            )
        else:
            flash(f"Job {job_id} is cancelled.", "success")
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.post("/jobs/<int:job_id>/delete")
    def delete(job_id: int) -> BaseResponse:
        operations.delete(state().store, [job_id], audit=acting())
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
        audit = acting()
        actions: dict[str, tuple[Callable[[Store, list[int]], int], str]] = {
            "retry": (lambda store, ids: operations.retry(store, ids, audit=audit), "retried"),
            "cancel": (
                lambda store, ids: operations.cancel(store, ids, audit=audit).count,
                "cancelled (running ones asked to stop)",
            ),
            "delete": (lambda store, ids: operations.delete(store, ids, audit=audit), "deleted"),
        }
        if action not in actions:
            raise BadRequest(f"Unknown action {action!r}; use retry, cancel or delete.")
        act, done = actions[action]
        n = act(state().store, ids)
        flash(f"{n} job{'s' if n != 1 else ''} {done}.", "success")
        return redirect(back, 303)

    @bp.post("/jobs/retry-dead")
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
        flash(f"{n} dead job{'s' if n != 1 else ''} replayed with fresh attempts.", "success")
        return redirect(url_for(".jobs", **{**filters.args(), "status": "pending"}), 303)

    @bp.post("/jobs/<int:job_id>/run-now")
    def run_now(job_id: int) -> BaseResponse:
        moved = operations.run_now(state().store, [job_id], audit=acting())
        if moved:
            flash(f"Job {job_id} is due now.", "success")
        else:
            flash(f"Job {job_id} was due already.", "info")
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.post("/jobs/<int:job_id>/duplicate")
    def duplicate(job_id: int) -> BaseResponse:
        st = state()
        try:
            made = operations.duplicate(st.store, st.registry, job_id, audit=acting())
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidTransition):
                raise
            raise BadRequest(str(exc)) from None
        flash(f"Job {made.id} is a copy of job {job_id}.", "success")
        return redirect(url_for(".job", job_id=made.id), 303)

    @bp.post("/jobs/<int:job_id>/edit")
    def edit(job_id: int) -> BaseResponse:
        st = state()
        found = st.store.get_job(job_id)
        if found is None:
            abort(404, f"There is no job {job_id}; it may have been deleted or purged.")
        args = _json_field("args", list, "array")
        kwargs = _json_field("kwargs", dict, "object")
        queue_name = request.form.get("queue", "").strip() or None
        priority = _int_field("priority")
        try:
            replayed = operations.replay_edited(
                st.store,
                st.registry,
                job_id,
                # Only what was changed: a job of a task this app does not register can
                # still move to another queue.
                args=None if args == found.args else args,
                kwargs=None if kwargs == found.kwargs else kwargs,
                queue=queue_name,
                priority=priority,
                audit=acting(),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, InvalidTransition):
                raise
            raise BadRequest(str(exc)) from None
        flash(
            f"Job {job_id} is {replayed.status} again on queue {replayed.queue}, "
            "with fresh attempts.",
            "success",
        )
        return redirect(url_for(".job", job_id=job_id), 303)

    @bp.get("/audit")
    def audit_page() -> str:
        st = state()
        before = _int_arg("before", 1, MAX_ID)
        job_id = _int_arg("job", 1, MAX_ID)
        entries = operations.audit_entries(
            st.store, limit=AUDIT_PAGE + 1, before_id=before, job_id=job_id
        )
        more = len(entries) > AUDIT_PAGE
        entries = entries[:AUDIT_PAGE]
        where: dict[str, Any] = {} if job_id is None else {"job": job_id}
        return render_template(
            "sqlqueue/audit.html",
            now=st.store.now(),
            entries=entries,
            job_id=job_id,
            older=url_for(".audit_page", **where, before=entries[-1].id) if more else None,
            newest=url_for(".audit_page", **where) if before else None,
        )


@contextmanager
def reading(st: QueueState) -> Iterator[Connection]:
    """A read transaction for a page: its statements are planned for their parameters
    (the same statement reads the last hour on one page and the last week on another)."""
    with st.store.read() as conn:
        st.store.ops.plan_per_execution(conn)
        yield conn


def _json_field(name: str, kind: type, what: str) -> Any:
    """A form field holding a JSON ``what`` (``None`` if left out)."""
    raw = request.form.get(name)
    if raw is None:
        return None
    raw = raw.strip() or ("[]" if kind is list else "{}")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"{name} is not valid JSON ({exc}); nothing was changed.") from None
    if not isinstance(value, kind):
        raise BadRequest(f"{name} must be a JSON {what}, not {raw!r}; nothing was changed.")
    return value


def _int_field(name: str) -> int | None:
    raw = request.form.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {raw!r}.") from None


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


def seconds(value: float | None) -> str:
    """A duration for the metrics table: ``"850 ms"``, ``"12.4 s"``, ``"3.2 min"``."""
    if value is None:
        return "\u2013"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 100:
        return f"{value:.1f} s"
    if value < 6000:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    completed_y: float
    completed_h: float
    failed_y: float
    failed_h: float
    label: str


def _slots(data: queries.Activity, width: int) -> tuple[float, float]:
    slot = width / max(len(data.starts), 1)
    return slot, round(max(slot - 1, 0.5), 2)


def _when(data: queries.Activity, i: int) -> str:
    start = data.starts[i]
    return f"{start:%H:%M}\u2013{start + data.step:%H:%M} UTC"


def activity_chart(data: queries.Activity, width: int = 960, height: int = 120) -> dict[str, Any]:
    """Stacked bars (completed jobs, failed attempts) for an inline SVG, computed here so
    the page needs no script."""
    totals = [c + f for c, f in zip(data.completed, data.failed, strict=True)]
    top = max([*totals, 1])
    slot, bar_width = _slots(data, width)
    bars = []
    for i in range(len(data.starts)):
        c_h = height * data.completed[i] / top
        f_h = height * data.failed[i] / top
        bars.append(
            Bar(
                x=round(i * slot + 0.5, 2),
                width=bar_width,
                completed_y=round(height - c_h, 2),
                completed_h=round(c_h, 2),
                failed_y=round(height - c_h - f_h, 2),
                failed_h=round(f_h, 2),
                label=(
                    f"{_when(data, i)}: {data.completed[i]} completed, "
                    f"{data.failed[i]} failed attempt{'s' if data.failed[i] != 1 else ''}"
                ),
            )
        )
    return {
        "width": width,
        "height": height,
        "bars": bars,
        "svg": _bars_svg(bars, height),
        "top": top,
        "completed": sum(data.completed),
        "failed": sum(data.failed),
        "partial": data.failed_partial,
        "first": data.starts[0] if data.starts else None,
    }


def depth_chart(data: queries.Activity, width: int = 960, height: int = 80) -> dict[str, Any]:
    """The waiting jobs at each bucket's end as an area under a line, for an inline SVG."""
    top = max([*data.waiting, 1])
    slot, bar_width = _slots(data, width)
    points = [
        (round((i + 1) * slot, 2), round(height - height * n / top, 2))
        for i, n in enumerate(data.waiting)
    ]
    if points:
        points.insert(0, (0.0, points[0][1]))
    line = " ".join(f"{x},{y}" for x, y in points)
    slots = [
        {
            "x": round(i * slot + 0.5, 2),
            "width": bar_width,
            "label": f"{_when(data, i)}: {n} waiting at the end",
        }
        for i, n in enumerate(data.waiting)
    ]
    return {
        "width": width,
        "height": height,
        "top": top,
        "line": line,
        "area": f"0,{height} {line} {width},{height}" if points else "",
        "now": data.waiting[-1] if data.waiting else 0,
        "peak": max(data.waiting, default=0),
        "slots": slots,
        "svg": Markup(
            "".join(
                f'<g><title>{escape(s["label"])}</title><rect class="slot" x="{s["x"]}" y="0"'
                f' width="{s["width"]}" height="{height}"></rect></g>'
                for s in slots
            )
        ),
    }


# The charts' elements are joined here rather than looped over in the template: a
# day's chart has ~300 of them, and escaping each number in the template cost as much
# as the page's queries. Only the labels are text; everything else is a number.
def _bars_svg(bars: list[Bar], height: int) -> Markup:
    parts = []
    for bar in bars:
        rects = "".join(
            f'<rect class="{kind}" x="{bar.x}" y="{y}" width="{bar.width}" height="{h}"></rect>'
            for kind, y, h in (
                ("completed", bar.completed_y, bar.completed_h),
                ("failed", bar.failed_y, bar.failed_h),
            )
            if h
        )
        parts.append(
            f'<g><title>{escape(bar.label)}</title><rect class="slot" x="{bar.x}" y="0"'
            f' width="{bar.width}" height="{height}"></rect>{rects}</g>'
        )
    return Markup("".join(parts))

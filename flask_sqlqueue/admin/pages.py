"""The admin's pages: GETs that change nothing. Each reads through ``core.queries`` (or
``core.operations``' readers, as the CLI does) in one read transaction and renders one
template; nothing here knows which database is underneath."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from datetime import timedelta
from typing import TYPE_CHECKING
from typing import Any

from flask import render_template
from flask import request
from flask import url_for
from sqlalchemy.engine import Connection

from ..core import batches
from ..core import operations
from ..core import pausing
from ..core import periodic
from ..core import queries
from ..core import roster
from ..core.features import dependencies
from ..core.features import limits
from ..core.features import retention
from ..core.models import JobStatus
from ..core.retry_preview import retry_plan
from ..core.tasks import task_timeouts
from .charts import SPANS
from .charts import activity_chart
from .charts import depth_chart
from .context import job_or_404
from .context import no_job
from .context import state
from .formatting import seconds
from .forms import MAX_ID
from .forms import MAX_PER_PAGE
from .forms import PER_PAGE
from .forms import STATUSES
from .forms import Filters
from .forms import choice
from .forms import int_arg
from .workflow import BOX_HEIGHT
from .workflow import BOX_WIDTH
from .workflow import draw

if TYPE_CHECKING:
    from ..extension import QueueState

#: Audit entries a page of the audit log shows, and a job's page at most.
AUDIT_PAGE = 50
JOB_AUDIT = 20
#: Jobs a workflow page shows at most (the walk from the job stops there).
WORKFLOW_MOST = 300
#: The metrics page's windows, with their names.
WINDOWS: dict[str, tuple[timedelta, str]] = {
    "1h": (timedelta(hours=1), "last hour"),
    "24h": (timedelta(days=1), "last 24 hours"),
    "7d": (timedelta(days=7), "last 7 days"),
}
#: Latest completed jobs per task that the duration percentiles and mean wait come from.
METRICS_SAMPLE = 500


@contextmanager
def reading(st: QueueState) -> Iterator[Connection]:
    """A read transaction for a page: its statements are planned for their parameters
    (the same statement reads the last hour on one page and the last week on another)."""
    with st.store.read() as conn:
        st.store.ops.plan_per_execution(conn)
        yield conn


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


def dashboard() -> str:
    st = state()
    span = choice("span", SPANS, "1h")
    now = st.store.now()
    with reading(st) as conn:
        by_queue = queries.queue_counts(conn, now)
        running = queries.running_jobs(conn)
        workers = worker_rows(st, conn, now, running)
        data = queries.activity(conn, now, span=SPANS[span].length, step=SPANS[span].step)
        paused = pausing.paused_queues(conn)
        buckets = limits.describe(conn, st.registry, now)
        fresh = roster.heartbeat_fresh(st.store, st.settings.stale_after, now)
        unserved = queries.coverage(conn, fresh).warnings(st.registry)
    schedules = periodic.describe(st.store, st.registry, now)
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
        timeouts=task_timeouts(st.registry),
        unserved=unserved,
    )


def metrics() -> str:
    st = state()
    window = choice("window", WINDOWS, "24h")
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


def _per_page(per_page: int) -> dict[str, Any]:
    return {} if per_page == PER_PAGE else {"per_page": per_page}


def jobs() -> str:
    st = state()
    filters = Filters.parse(request.args)
    before = int_arg("before", 1, MAX_ID)
    per_page = int_arg("per_page", 1, MAX_PER_PAGE) or PER_PAGE
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
            else queries.search_jobs(conn, filters.query(), before_id=before, limit=per_page + 1)
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


def job(job_id: int) -> str:
    st = state()
    found = job_or_404(st.store, job_id)
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


def workflow(job_id: int) -> str:
    st = state()
    with reading(st) as conn:
        flow = dependencies.workflow(conn, job_id, most=WORKFLOW_MOST)
    if flow.jobs[job_id] is None:
        no_job(job_id)
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


def confirm_retry_dead() -> str:
    st = state()
    filters = Filters.parse(request.args)
    with reading(st) as conn:
        count = queries.count_jobs(conn, filters.query(status=JobStatus.DEAD.value))
    back = url_for(".jobs", **{**filters.args(), "status": JobStatus.DEAD.value})
    return render_template("sqlqueue/confirm.html", filters=filters, count=count, back=back)


def schedules() -> str:
    st = state()
    now = st.store.now()
    return render_template(
        "sqlqueue/schedules.html",
        now=now,
        schedules=periodic.describe(st.store, st.registry, now),
    )


def audit_page() -> str:
    st = state()
    before = int_arg("before", 1, MAX_ID)
    job_id = int_arg("job", 1, MAX_ID)
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

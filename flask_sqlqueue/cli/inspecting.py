"""Commands that read: ``status``, ``list``, ``show``, ``doctor``."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from datetime import datetime
from datetime import timedelta
from typing import Any

import click

from ..core import batches
from ..core import operations
from ..core import periodic
from ..core import queries
from ..core import roster
from ..core.features import limits
from ..core.features import retention
from ..core.features.tags import check_tag
from ..core.features.versions import Upcast
from ..core.jobs import Job
from ..core.jobs import unreadable_note
from ..core.models import JobStatus
from ..core.pausing import paused_queues
from ..core.retry_preview import PlannedAttempt
from ..core.retry_preview import retry_plan
from ..core.tasks import task_timeouts
from ..extension import QueueState
from .base import JOB_ID
from .base import STATUSES
from .base import app_state
from .base import clean_errors
from .base import queue_cli
from .formatting import first_line
from .formatting import format_age
from .formatting import format_table
from .formatting import format_time
from .formatting import indent
from .formatting import progress_bar


@queue_cli.command("status")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: per queue the counts by status, the jobs due now and the "
    "oldest one's wait in seconds, and whether it is paused (for autoscalers).",
)
@clean_errors
def status_command(as_json: bool) -> None:
    """Job counts by queue and status, and the wait of each queue's oldest eligible job.

    \b
    Example:
      flask queue status
      flask queue status --json
    """
    state = app_state()
    now = state.store.now()
    with state.store.read() as conn:
        rows = queries.status(conn, now)
        fresh = roster.heartbeat_fresh(state.store, state.settings.stale_after, now)
        cover = queries.coverage(conn, fresh)
        live = queries.live_workers(conn, fresh)
        ahead = sum(len(queries.claimed_ahead(w)) for w in live)
        paused = paused_queues(conn) if as_json else {}
    if as_json:
        click.echo(json.dumps(_status_json(rows, paused, now, len(live)), sort_keys=True))
        return
    if not rows:
        click.echo("No jobs.")
        _echo_schedules(state, now)
        _echo_controls(state, now)
        return
    # A status this version does not know (a row edited by hand) gets a column of its
    # own, so no job is ever missing from the counts.
    odd = sorted({s for row in rows for s in row.counts} - set(STATUSES))
    columns = [*STATUSES, *odd]
    table = [
        [
            row.queue,
            *(str(row.counts.get(s, 0)) for s in columns),
            _oldest_text(row, now),
        ]
        for row in rows
    ]
    totals = ["total", *(str(sum(r.counts.get(s, 0) for r in rows)) for s in columns), ""]
    click.echo(format_table(["queue", *columns, "oldest eligible"], [*table, totals]))
    for status in odd:
        click.echo(
            f"warning: jobs with unknown status {status!r}; no worker touches them.", err=True
        )
    for row in rows:
        if row.oldest_unreadable is not None:  # edited by hand: `list` shows the job
            click.echo(
                f"warning: queue {row.queue!r}: oldest eligible job "
                f"{unreadable_note({'run_at': row.oldest_unreadable})}; "
                f"flask queue list --queue {row.queue} --status pending shows it.",
                err=True,
            )
    if ahead:
        click.echo(
            f"running: {ahead} of them claimed ahead by their workers and not started "
            "(as of each worker's last heartbeat)"
        )
    _echo_unserved(cover, state.registry)
    _echo_schedules(state, now)
    _echo_controls(state, now)
    policy = retention.RetentionPolicy.from_settings(state.settings)
    click.echo(f"retention: {retention.describe(policy)}")


def _oldest_text(row: queries.QueueStatus, now: datetime) -> str:
    """The "oldest eligible" cell of ``status``: the oldest job's wait, ``-`` if none
    waits, ``unreadable`` if its ``run_at`` holds what no timestamp can (a warning
    follows the table)."""
    if row.oldest_unreadable is not None:
        return "unreadable"
    return format_age(now - row.oldest_eligible) if row.oldest_eligible else "-"


def _status_json(
    rows: list[queries.QueueStatus], paused: Collection[str], now: datetime, workers: int
) -> dict[str, Any]:
    queues: dict[str, dict[str, Any]] = {
        row.queue: {
            "counts": row.counts,
            "eligible": row.eligible,
            "oldest_eligible_seconds": (
                round((now - row.oldest_eligible).total_seconds(), 3)
                if row.oldest_eligible is not None
                else None
            ),
            "paused": row.queue in paused,
        }
        for row in rows
    }
    for row in rows:
        if row.oldest_unreadable is not None:  # no wait to give: what run_at holds
            queues[row.queue]["oldest_eligible_unreadable"] = row.oldest_unreadable
    for name in paused:  # a paused queue without jobs
        queues.setdefault(
            name, {"counts": {}, "eligible": 0, "oldest_eligible_seconds": None, "paused": True}
        )
    return {"time": now.isoformat(), "live_workers": workers, "queues": queues}


def _echo_unserved(cover: queries.Coverage, registered: Collection[str]) -> None:
    for what, fix in cover.warnings(registered):
        click.echo(f"warning: {what}; {fix}.", err=True)


def _echo_controls(state: QueueState, now: datetime) -> None:
    """Paused queues, and every limited task's buckets, under ``flask queue status``."""
    with state.store.read() as conn:
        paused = paused_queues(conn)
        buckets = limits.describe(conn, state.registry, now)
        stopping = queries.cancel_requested_running(conn)
    if stopping:
        shown = ", ".join(str(job_id) for job_id in stopping[:10])
        more = f" and {len(stopping) - 10} more" if len(stopping) > 10 else ""
        click.echo(
            f"cancel requested: running job(s) {shown}{more} "
            "(each stops when its task checks current_job.cancel_requested)"
        )
    for name, since in paused.items():
        click.echo(f"paused {name}: since {format_time(since)} UTC (no worker claims its jobs)")
    for info in buckets:
        click.echo(f"limit {info.label}: {info.summary}")
    for name, timeout, isolated in task_timeouts(state.registry):
        limit = "no timeout" if timeout is None else f"timeout {timeout:g}s"
        where = "enforced (isolate=True)" if isolated else "enforced only with --processes"
        click.echo(f"task {name}: {limit}, {where}")


def _echo_schedules(state: QueueState, now: datetime) -> None:
    """One line per periodic task under ``flask queue status``."""
    for info in periodic.describe(state.store, state.registry, now):
        when = f"next {format_time(info.next_run) or 'never'} UTC" if info.enabled else "disabled"
        click.echo(
            f"periodic {info.schedule.task}: {info.schedule.expression!r} "
            f"({info.schedule.timezone}), {when}"
        )


@queue_cli.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--queue", help="Only jobs in this queue.")
@click.option("--task", help="Only jobs of this task.")
@click.option("--tag", help="Only jobs with this tag (exactly).")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--before", "before_id", type=JOB_ID, help="Page: jobs older than this id.")
@click.option(
    "--quarantined",
    is_flag=True,
    help="Only dead jobs that spent their crash budget (SQLQUEUE_MAX_CRASHES).",
)
@clean_errors
def list_command(
    status: str | None,
    queue: str | None,
    task: str | None,
    tag: str | None,
    limit: int,
    before_id: int | None,
    quarantined: bool,
) -> None:
    """List jobs, newest first, a page at a time.

    \b
    Example:
      flask queue list --status dead --queue mail
      flask queue list --before 1200     # the next page
      flask queue list --tag customer:42
      flask queue list --quarantined     # jobs that kept killing their worker
    """
    if tag is not None:
        check_tag(tag, "--tag")
    state = app_state()
    budget = state.settings.max_crashes
    with state.store.read() as conn:
        # One extra row tells whether another page exists, so the hint never leads nowhere.
        jobs = queries.list_jobs(
            conn,
            status=status,
            queue=queue,
            task=task,
            tag=tag,
            before_id=before_id,
            limit=limit + 1,
            quarantined_at=budget if quarantined else None,
        )
    more, jobs = len(jobs) > limit, jobs[:limit]
    if not jobs:
        click.echo("No jobs match.")
        return
    rows = [
        [
            str(job.id),
            job.queue,
            job.task,
            _status_text(job.status, job.crashes, budget),
            f"{job.attempts}/{job.max_attempts}",
            "unreadable" if "run_at" in job.unreadable else format_time(job.run_at),
            first_line(job.last_error, 50),
        ]
        for job in jobs
    ]
    headers = ["id", "queue", "task", "status", "attempts", "run_at (UTC)", "last error"]
    if any(job.tags for job in jobs):  # a page without tags looks as it always did
        headers.append("tags")
        for row, job in zip(rows, jobs, strict=True):
            row.append(",".join(job.tags))
    click.echo(format_table(headers, rows))
    for job in jobs:
        if job.unreadable:  # edited by hand: `show` says the same
            click.echo(f"warning: job {job.id} {unreadable_note(job.unreadable)}", err=True)
    if more:
        click.echo(f"(more: --before {jobs[-1].id})")


@queue_cli.command("audit")
@click.option("--job", "job_id", type=JOB_ID, help="Only the entries of this job.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--before", "before_id", type=JOB_ID, help="Page: entries older than this id.")
@clean_errors
def audit_command(job_id: int | None, limit: int, before_id: int | None) -> None:
    """The audit log, newest first: who did what to which job or queue, and when.

    \b
    Example:
      flask queue audit --job 42
    """
    entries = operations.audit_entries(
        app_state().store, limit=limit + 1, before_id=before_id, job_id=job_id
    )
    more, entries = len(entries) > limit, entries[:limit]
    if not entries:
        click.echo("No audit entries.")
        return
    rows = [
        [
            str(entry.id),
            format_time(entry.at),
            entry.actor,
            entry.action,
            "" if entry.job_id is None else str(entry.job_id),
            first_line(entry.describe(), 80),
        ]
        for entry in entries
    ]
    click.echo(format_table(["id", "at (UTC)", "actor", "action", "job", "detail"], rows))
    if more:
        click.echo(f"(more: --before {entries[-1].id})")


@queue_cli.command("show")
@click.argument("job_id", type=JOB_ID)
@clean_errors
def show_command(job_id: int) -> None:
    """Everything about one job: payload, result, dependencies and dependents, each error
    with its traceback, effects.

    \b
    Example:
      flask queue show 42
    """
    state = app_state()
    job = state.store.get_job(job_id)
    if job is None:
        raise click.ClickException(f"No job with id {job_id}.")
    with state.store.read() as conn:
        effects = queries.job_effects(conn, job_id)
        edges = queries.job_edges(conn, job_id)
    fields = [
        ("id", job.id),
        ("task", job.task),
        ("queue", job.queue),
        ("status", _status_text(job.status, job.crashes, state.settings.max_crashes)),
        ("attempts", f"{job.attempts}/{job.max_attempts}"),
        ("crashes", f"{job.crashes}/{state.settings.max_crashes}"),
        ("priority", job.priority),
        ("idempotency key", job.idempotency_key or "-"),
        ("tags", ", ".join(job.tags) or "-"),
        ("unique key", job.unique_key or "-"),
        ("run at", _when(job, "run_at")),
        ("expires", _when(job, "expires_at")),
        ("created", _when(job, "created_at")),
        ("updated", _when(job, "updated_at")),
        ("started", _when(job, "started_at")),
        ("finished", _when(job, "finished_at")),
        ("worker", job.worker_id or "-"),
        ("rescues", job.rescues),
        ("releases", job.releases),
        ("snoozes", job.snoozes),
        ("progress", progress_bar(job.progress, job.progress_message)),
        ("cancel request", _when(job, "cancel_requested_at")),
        ("last error", job.last_error or "-"),
    ]
    batch = None if job.batch_id is None else batches.get_batch(state.store, job.batch_id)
    if batch is not None:
        fields.insert(4, ("batch", batch.summary(job.id)))
    registered = state.registry.get(job.task)
    if job.version != 1 or (registered is not None and registered.version != 1):
        here = "" if registered is None else f" (the task here is version {registered.version})"
        fields.insert(3, ("version", f"{job.version}{here}"))
    if registered is not None and (registered.timeout is not None or registered.isolate):
        fields.insert(-1, ("timeout", _timeout_text(registered.timeout, registered.isolate)))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        click.echo(f"{name.ljust(width)}  {value}")
    click.echo("\nargs:")
    click.echo(indent(json.dumps(job.args, indent=2, ensure_ascii=False)))
    click.echo("kwargs:")
    click.echo(indent(json.dumps(job.kwargs, indent=2, ensure_ascii=False)))
    if job.payload_error:
        click.echo(f"  ({job.payload_error})")
    if job.meta:
        click.echo("meta:")
        click.echo(indent(json.dumps(job.meta, indent=2, ensure_ascii=False)))
    upcast = None if registered is None else registered.upcast_preview(job)
    if upcast is not None:
        _echo_upcast(upcast)
    click.echo("result:")
    click.echo(indent(json.dumps(job.result, indent=2, ensure_ascii=False)))
    _echo_edges(edges)
    click.echo(f"effects reserved: {len(effects)}")
    for key, at, done in effects:
        outcome = "outcome unknown" if done is None else f"done {format_time(done)}"
        click.echo(f"  {key}  ({format_time(at)}, {outcome})")
    if job.status in (JobStatus.DEAD, JobStatus.CANCELLED):
        click.echo(f"replay: {queries.replay_note(effects)}")
    own = registered.backoff if registered is not None else None
    for line in _retry_lines(job, retry_plan(job, state.store.backoff, own), state.store.now()):
        click.echo(line)
    if not isinstance(job.errors, list):  # edited by hand: shown whole, as it is
        click.echo("errors: unreadable (not a JSON list), as stored:")
        raw = job.errors if isinstance(job.errors, str) else json.dumps(job.errors, indent=2)
        click.echo(indent(raw))
        return
    click.echo(f"errors: {len(job.errors)}")
    for record in job.errors:
        if not isinstance(record, dict):
            click.echo(indent(repr(record)))
            continue
        click.echo(
            f"  attempt {record.get('attempt')} at {record.get('at')} on {record.get('worker')}: "
            f"{record.get('type')}: {record.get('message')}"
        )
        if record.get("traceback"):
            click.echo(indent(str(record["traceback"]).rstrip(), 4))


def _when(job: Job, column: str) -> str:
    """A timestamp of ``job`` as ``show`` prints it: ``-`` if empty, or what its column
    holds if that is no timestamp (edited by hand)."""
    if column in job.unreadable:
        return unreadable_note({column: job.unreadable[column]})
    return format_time(getattr(job, column)) or "-"


def _status_text(status: str, crashes: int, max_crashes: int) -> str:
    """A job's status, ``dead (quarantined)`` for one that spent its crash budget."""
    if queries.quarantined(status, crashes, max_crashes):
        return f"{status} (quarantined)"
    return str(status)


def _echo_upcast(upcast: Upcast) -> None:
    """What the stored arguments of an earlier version run as (docs/versions.md)."""
    if upcast.error is not None:
        click.echo(f"cannot run as version {upcast.version}: {upcast.error}")
        return
    click.echo(f"runs as version {upcast.version}, upcast from version {upcast.stored}, with")
    click.echo("args:")
    click.echo(indent(json.dumps(upcast.args, indent=2, ensure_ascii=False)))
    click.echo("kwargs:")
    click.echo(indent(json.dumps(upcast.kwargs, indent=2, ensure_ascii=False)))


def _retry_lines(job: Job, planned: list[PlannedAttempt], now: datetime) -> list[str]:
    """The retry preview: each attempt still to come, then what a last failure does."""
    if job.status not in (JobStatus.PENDING, JobStatus.RUNNING):
        return []
    lines = ["next attempts (each if the one before fails; a task's Retry(delay) differs):"]
    for step in planned:
        name = f"attempt {step.number} of {job.max_attempts}"
        if step.due is not None:
            lines.append(f"  {name}  due {format_time(step.due)} ({_from_now(step.due, now)})")
        elif step.wait is not None:
            least, most = (_seconds(seconds) for seconds in step.wait)
            spread = least if most == least else f"{least}-{most}"
            lines.append(f"  {name}  {spread} after attempt {step.number - 1} fails")
        else:
            lines.append(f"  {name}  due: run_at is unreadable")
    last = planned[-1].number if planned else job.attempts
    lines.append(f"  after attempt {last} fails: dead (replay with `flask queue retry {job.id}`)")
    return lines


def _seconds(seconds: float) -> str:
    return format_age(timedelta(seconds=seconds)) if seconds >= 1 else f"{seconds:.2g}s"


def _from_now(moment: datetime, now: datetime) -> str:
    ahead = moment - now
    return f"in {format_age(ahead)}" if ahead.total_seconds() > 0 else "now"


def _echo_edges(edges: queries.Edges) -> None:
    """The job's dependencies and dependents with their statuses, if it has any."""
    if edges.dependencies:
        click.echo(f"depends on: {len(edges.dependencies)}")
        for job_id, status in edges.dependencies:
            click.echo(f"  {job_id}  {status or 'gone (purged or deleted; counts as completed)'}")
    if edges.dependents:
        click.echo(f"dependents: {len(edges.dependents)}")
        for job_id, status in edges.dependents:
            click.echo(f"  {job_id}  {status}")


def _timeout_text(timeout: float | None, isolate: bool) -> str:
    if timeout is None:
        return "none (each attempt runs in a child process)"
    where = "its child process is killed" if isolate else "enforced only with --processes"
    return f"{timeout:g}s ({where})"


@queue_cli.command("doctor")
@clean_errors
def doctor_command() -> None:
    """Check the queue's database: schema, SQLite settings or server version and SKIP
    LOCKED, clock skew, stale workers, jobs no worker here can run. Exit 1 on a failure.

    \b
    Example:
      flask queue doctor
    """
    from ..doctor import FAIL
    from ..doctor import diagnose

    state = app_state(check_schema=False)
    findings = diagnose(state.store, state.registry)
    for finding in findings:
        line = f"{finding.level:<4}  {finding.message}"
        click.echo(line + (f"\n      fix: {finding.fix}" if finding.fix else ""))
    if any(f.level == FAIL for f in findings):
        sys.exit(1)

"""``flask queue ...``: a thin click layer over the core. Errors are one line, exit 1."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from collections.abc import Callable
from collections.abc import Collection
from datetime import datetime
from datetime import timedelta
from types import FrameType
from typing import Any
from typing import TypeVar

import click
import sqlalchemy as sa
from click.core import ParameterSource
from flask.cli import AppGroup
from flask.cli import ScriptInfo

from . import schema
from .core import lifecycle
from .core import operations
from .core import queries
from .core import retention
from .core.models import JobStatus
from .core.tasks import task_timeouts
from .core.worker import WorkerOptions
from .exceptions import QueueNotSetUp
from .exceptions import SQLQueueError
from .extension import QueueState
from .extension import queue_state
from .extension import resolve_app

F = TypeVar("F", bound=Callable[..., Any])

STATUSES = [status.value for status in JobStatus]
# Job ids are 64-bit on every backend; a bigger number must be refused, not overflow a driver.
JOB_ID = click.IntRange(1, 2**63 - 1)

queue_cli = AppGroup("queue", help="Run and inspect the background-job queue.")
db_cli = AppGroup("db", help="Create and upgrade the queue's own tables (Alembic).")
queue_cli.add_command(db_cli)


def _state(check_schema: bool = True) -> QueueState:
    """The app's queue state, its schema checked unless told not to. Its errors, as every
    command's, become one-line CLI errors through :func:`_clean_errors`."""
    state = queue_state()
    if check_schema:
        state.ensure_schema()
    return state


#: Lines of SQLAlchemy's error text that are not the error: the statement, its
#: parameters and the link to SQLAlchemy's docs.
_NOT_THE_ERROR = re.compile(r"^\s*(\[SQL: |\[parameters: |\(Background on this error at: )")


def _database() -> str:
    """Which database a database error came from (the password hidden)."""
    try:
        return f"database error on {queue_state().store.engine.url!r}"
    except QueueNotSetUp:
        return "database error"


def _one_line(exc: BaseException) -> str:
    """The error's message on one line: a driver's message may span several (psycopg
    adds a hint), and SQLAlchemy's adds the statement and a link."""
    lines = str(exc).splitlines()
    return " ".join(
        line.strip() for line in lines if line.strip() and not _NOT_THE_ERROR.match(line)
    )


def _is_alembic_error(exc: Exception) -> bool:
    # Alembic is imported only by the `db` commands: if it is not loaded, it raised nothing.
    util = sys.modules.get("alembic.util")
    return util is not None and isinstance(exc, util.CommandError)


def _clean_errors(fn: F) -> F:
    """Turn the queue's own errors and database errors into one-line CLI errors."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (SQLQueueError, ValueError, TypeError, LookupError) as exc:
            raise click.ClickException(_one_line(exc)) from None
        # Before the catch-all below, which would otherwise take database errors too.
        except sa.exc.SQLAlchemyError as exc:
            cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig else exc
            raise click.ClickException(f"{_database()}: {_one_line(cause)}") from None
        except Exception as exc:
            if not _is_alembic_error(exc):
                raise
            raise click.ClickException(_one_line(exc)) from None

    return wrapper  # type: ignore[return-value]


_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"1h30m"``, ``"90s"`` as a timedelta."""
    parts = _AGE.findall(text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != text.strip().lower():
        raise ValueError(
            f"{text!r} is not an age; use a number and s, m, h, d or w, like 7d or 12h."
        )
    try:
        return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))
    except OverflowError:
        raise ValueError(f"{text!r} is too long an age.") from None


def format_age(delta: timedelta) -> str:
    seconds = int(max(delta.total_seconds(), 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0] if text.splitlines() else text
    return line if len(line) <= width else line[: width - 3] + "..."


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


# -- work ------------------------------------------------------------------------------------

#: The flags' defaults are the worker's own: written once, in ``WorkerOptions``.
WORKER_DEFAULTS = WorkerOptions()


@queue_cli.command("work")
@click.option(
    "--queue", "queues", multiple=True, help="Serve this queue (repeatable). Default: all."
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 256),
    default=WORKER_DEFAULTS.concurrency,
    show_default=True,
    help="Threads running jobs in this process.",
)
@click.option("--burst", is_flag=True, help="Exit 0 once no job is eligible now.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    default=WORKER_DEFAULTS.poll_interval,
    show_default=True,
    help="Seconds between polls while idle.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 86400),
    default=WORKER_DEFAULTS.grace,
    show_default=True,
    help="Seconds to let running jobs finish after SIGTERM/SIGINT.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(1, 256),
    help="Run every job in a child process, this many at once (instead of --concurrency "
    "threads): task timeouts are enforced and running jobs can be cancelled.",
)
@_clean_errors
def work_command(
    queues: tuple[str, ...],
    concurrency: int,
    burst: bool,
    poll_interval: float,
    grace: float,
    processes: int | None,
) -> None:
    """Run jobs until stopped.

    SIGTERM or Ctrl-C: claim nothing more, let running jobs finish within --grace
    seconds, hand unfinished ones back to pending, exit 0. A second signal exits at once.

    With --processes N, N child processes (each loading the app) run the jobs, one at a
    time each; a task's timeout kills its attempt, which counts as failed. Tasks declared
    with isolate=True run in a child process in either mode.

    \b
    Example:
      flask queue work --queue default --queue mail --concurrency 4
      flask queue work --processes 4
    """
    from .core.enqueue import check_options

    for name in queues:
        check_options(queue=name)
    ctx = click.get_current_context()
    if processes and ctx.get_parameter_source("concurrency") is not ParameterSource.DEFAULT:
        raise click.UsageError("Give --processes or --concurrency, not both.")
    state = _state()
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    logging.getLogger("flask_sqlqueue").setLevel(logging.INFO)
    options = state.worker_options(
        queues=tuple(dict.fromkeys(queues)),
        concurrency=concurrency,
        poll_interval=poll_interval,
        grace=grace,
        processes=processes or 0,
    )
    loader = None
    if processes or any(task.isolate for task in state.registry.values()):
        from .processes import AppLoader

        loader = AppLoader.from_script_info(ctx.ensure_object(ScriptInfo))
    worker = state.queue.worker(options, resolve_app(), loader=loader)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if worker.stopping:
            click.echo("second signal: exiting now", err=True)
            os._exit(1)
        click.echo(
            f"{signal.Signals(signum).name}: finishing running jobs (up to {grace:g}s)", err=True
        )
        worker.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        worker.run(burst=burst)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- inspecting -------------------------------------------------------------------------------


@queue_cli.command("status")
@_clean_errors
def status_command() -> None:
    """Job counts by queue and status, and the wait of each queue's oldest eligible job.

    \b
    Example:
      flask queue status
    """
    state = _state()
    now = state.store.now()
    with state.store.read() as conn:
        rows = queries.status(conn, now)
        cover = queries.coverage(conn, state.store.heartbeat_fresh(state.settings.stale_after, now))
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
            format_age(now - row.oldest_eligible) if row.oldest_eligible else "-",
        ]
        for row in rows
    ]
    totals = ["total", *(str(sum(r.counts.get(s, 0) for r in rows)) for s in columns), ""]
    click.echo(_table(["queue", *columns, "oldest eligible"], [*table, totals]))
    for status in odd:
        click.echo(
            f"warning: jobs with unknown status {status!r}; no worker touches them.", err=True
        )
    _echo_unserved(cover, state.registry)
    _echo_schedules(state, now)
    _echo_controls(state, now)
    policy = retention.RetentionPolicy.from_settings(state.settings)
    click.echo(f"retention: {retention.describe(policy)}")


def _echo_unserved(cover: queries.Coverage, registered: Collection[str]) -> None:
    for what, fix in cover.warnings(registered):
        click.echo(f"warning: {what}; {fix}.", err=True)


def _echo_controls(state: QueueState, now: datetime) -> None:
    """Paused queues, and every limited task's buckets, under ``flask queue status``."""
    from .core import limits
    from .core.queues import paused_queues

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
        click.echo(f"paused {name}: since {_when(since)} UTC (no worker claims its jobs)")
    for info in buckets:
        click.echo(f"limit {info.label}: {info.summary}")
    for name, timeout, isolated in task_timeouts(state.registry):
        limit = "no timeout" if timeout is None else f"timeout {timeout:g}s"
        where = "enforced (isolate=True)" if isolated else "enforced only with --processes"
        click.echo(f"task {name}: {limit}, {where}")


def _echo_schedules(state: QueueState, now: datetime) -> None:
    """One line per periodic task under ``flask queue status``."""
    from .core import periodic

    for info in periodic.describe(state.store, state.registry, now):
        click.echo(
            f"periodic {info.schedule.task}: {info.schedule.expression!r} "
            f"({info.schedule.timezone}), next {_when(info.next_run) or 'never'} UTC"
        )


@queue_cli.command("list")
@click.option("--status", type=click.Choice(STATUSES), help="Only jobs in this status.")
@click.option("--queue", help="Only jobs in this queue.")
@click.option("--task", help="Only jobs of this task.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--before", "before_id", type=JOB_ID, help="Page: jobs older than this id.")
@_clean_errors
def list_command(
    status: str | None, queue: str | None, task: str | None, limit: int, before_id: int | None
) -> None:
    """List jobs, newest first, a page at a time.

    \b
    Example:
      flask queue list --status dead --queue mail
      flask queue list --before 1200     # the next page
    """
    state = _state()
    with state.store.read() as conn:
        # One extra row tells whether another page exists, so the hint never leads nowhere.
        jobs = queries.list_jobs(
            conn, status=status, queue=queue, task=task, before_id=before_id, limit=limit + 1
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
            str(job.status),
            f"{job.attempts}/{job.max_attempts}",
            _when(job.run_at),
            _short(job.last_error, 50),
        ]
        for job in jobs
    ]
    click.echo(
        _table(["id", "queue", "task", "status", "attempts", "run_at (UTC)", "last error"], rows)
    )
    if more:
        click.echo(f"(more: --before {jobs[-1].id})")


@queue_cli.command("show")
@click.argument("job_id", type=JOB_ID)
@_clean_errors
def show_command(job_id: int) -> None:
    """Everything about one job: payload, result, each error with its traceback, effects.

    \b
    Example:
      flask queue show 42
    """
    state = _state()
    job = state.store.get_job(job_id)
    if job is None:
        raise click.ClickException(f"No job with id {job_id}.")
    with state.store.read() as conn:
        effects = queries.job_effects(conn, job_id)
    fields = [
        ("id", job.id),
        ("task", job.task),
        ("queue", job.queue),
        ("status", job.status),
        ("attempts", f"{job.attempts}/{job.max_attempts}"),
        ("priority", job.priority),
        ("idempotency key", job.idempotency_key or "-"),
        ("run at", _when(job.run_at)),
        ("created", _when(job.created_at)),
        ("updated", _when(job.updated_at)),
        ("started", _when(job.started_at) or "-"),
        ("finished", _when(job.finished_at) or "-"),
        ("worker", job.worker_id or "-"),
        ("rescues", job.rescues),
        ("releases", job.releases),
        ("progress", _progress(job.progress, job.progress_message)),
        ("cancel request", _when(job.cancel_requested_at) or "-"),
        ("last error", job.last_error or "-"),
    ]
    registered = state.registry.get(job.task)
    if registered is not None and (registered.timeout is not None or registered.isolate):
        fields.insert(-1, ("timeout", _timeout_text(registered.timeout, registered.isolate)))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        click.echo(f"{name.ljust(width)}  {value}")
    click.echo("\nargs:")
    click.echo(_indent(json.dumps(job.args, indent=2, ensure_ascii=False)))
    click.echo("kwargs:")
    click.echo(_indent(json.dumps(job.kwargs, indent=2, ensure_ascii=False)))
    if job.payload_error:
        click.echo(f"  ({job.payload_error})")
    click.echo("result:")
    click.echo(_indent(json.dumps(job.result, indent=2, ensure_ascii=False)))
    click.echo(f"effects reserved: {len(effects)}")
    for key, at in effects:
        click.echo(f"  {key}  ({_when(at)})")
    click.echo(f"errors: {len(job.errors)}")
    for record in job.errors:
        if not isinstance(record, dict):
            click.echo(_indent(repr(record)))
            continue
        click.echo(
            f"  attempt {record.get('attempt')} at {record.get('at')} on {record.get('worker')}: "
            f"{record.get('type')}: {record.get('message')}"
        )
        if record.get("traceback"):
            click.echo(_indent(str(record["traceback"]).rstrip(), 4))


def _progress(fraction: float | None, message: str | None, width: int = 20) -> str:
    """``[#########-----------]  45%  page 9 of 20``, or ``-``."""
    if fraction is None:
        return "-"
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    bar = f"[{'#' * filled}{'-' * (width - filled)}] {fraction * 100:3.0f}%"
    return f"{bar}  {_short(message, 60)}" if message else bar


def _timeout_text(timeout: float | None, isolate: bool) -> str:
    if timeout is None:
        return "none (each attempt runs in a child process)"
    where = "its child process is killed" if isolate else "enforced only with --processes"
    return f"{timeout:g}s ({where})"


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


# -- changing -----------------------------------------------------------------------------------


@queue_cli.command("retry")
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option("--dead", is_flag=True, help="Replay every dead job (narrow with --queue/--task).")
@click.option("--queue", help="With --dead: only this queue.")
@click.option("--task", help="With --dead: only this task.")
@_clean_errors
def retry_command(
    job_ids: tuple[int, ...], dead: bool, queue: str | None, task: str | None
) -> None:
    """Replay dead (or cancelled) jobs with fresh attempts.

    \b
    Example:
      flask queue retry 42 43
      flask queue retry --dead --task example_app.tasks.call_flaky_api
    """
    if bool(job_ids) == dead:
        raise click.UsageError("Give job ids or --dead, not both and not neither.")
    if (queue or task) and not dead:
        raise click.UsageError("--queue and --task go with --dead.")
    store = _state().store
    if dead:
        n = operations.retry_dead(store, queue=queue, task=task)
    else:
        n = operations.retry(store, job_ids)
    click.echo(f"Replayed {n} job(s).")


@queue_cli.command("cancel")
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@_clean_errors
def cancel_command(job_ids: tuple[int, ...]) -> None:
    """Cancel pending jobs, and ask running ones to stop. All or none: a missing or
    finished id changes nothing.

    A running job stops when its task checks current_job.cancel_requested; one that
    never checks runs to its end.

    \b
    Example:
      flask queue cancel 42 43
    """
    click.echo(operations.cancel(_state().store, job_ids).describe())


@queue_cli.command("purge")
@click.option(
    "--status",
    required=True,
    type=click.Choice(list(lifecycle.FINISHED)),
    help="Which finished jobs to delete.",
)
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Age like 7d, 12h, 30m: jobs last changed before then.",
)
@_clean_errors
def purge_command(status: str, older_than: str) -> None:
    """Delete finished jobs last changed more than --older-than ago.

    \b
    Example:
      flask queue purge --status completed --older-than 7d
    """
    age = parse_age(older_than)
    store = _state().store
    try:
        n = operations.purge(store, status, age)
    except OverflowError:
        raise click.ClickException(f"{older_than!r} is too long an age.") from None
    click.echo(f"Purged {n} {status} job(s).")


@queue_cli.command("rescue")
@_clean_errors
def rescue_command() -> None:
    """Take back running jobs whose worker stopped heartbeating (SQLQUEUE_STALE_AFTER).

    Workers on this machine are judged by its boot clock, others by the database's
    clock, so a step of a wall clock does not make a live worker look lost.

    \b
    Example:
      flask queue rescue
    """
    state = _state()
    rescued = operations.rescue(state.store, state.settings.stale_after)
    for job_id, status, worker in rescued:
        click.echo(f"job {job_id}: worker {worker} lost; now {status}")
    click.echo(f"Rescued {len(rescued)} job(s).")


@queue_cli.command("pause")
@click.argument("names", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Pause every queue known now.")
@_clean_errors
def pause_command(names: tuple[str, ...], every: bool) -> None:
    """Stop workers on every host from claiming jobs of these queues; running jobs finish.

    Enqueueing goes on: the jobs wait until `flask queue resume`. All or nothing: an
    unknown queue name changes nothing. --all pauses the queues known now (those of the
    registered tasks and those with jobs), not queues that appear later.

    \b
    Example:
      flask queue pause reports
      flask queue pause --all
    """
    _pause_or_resume(names, every, paused=True)


@queue_cli.command("resume")
@click.argument("names", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Resume every paused queue.")
@_clean_errors
def resume_command(names: tuple[str, ...], every: bool) -> None:
    """Let workers claim jobs of these paused queues again.

    \b
    Example:
      flask queue resume reports
    """
    _pause_or_resume(names, every, paused=False)


def _pause_or_resume(names: tuple[str, ...], every: bool, *, paused: bool) -> None:
    if bool(names) == every:
        raise click.UsageError("Give queue names or --all, not both and not neither.")
    state = _state()
    if every:
        names = tuple(
            operations.known_queues(state.store, state.registry)
            if paused
            else operations.paused_queues(state.store)
        )
    names = tuple(dict.fromkeys(names))
    if not names:
        click.echo("No queues to pause." if paused else "No queue is paused.")
        return
    changed = operations.set_paused(state.store, names, paused=paused, registry=state.registry)
    verb = "Paused" if paused else "Resumed"
    for name in names:
        if name in changed:
            click.echo(f"{verb} queue {name!r}.")
        else:
            click.echo(f"Queue {name!r} was {'already paused' if paused else 'not paused'}.")


@queue_cli.command("enqueue")
@click.argument("task")
@click.option("--args", "args_json", default="[]", help="JSON array of positional arguments.")
@click.option("--kwargs", "kwargs_json", default="{}", help="JSON object of keyword arguments.")
@click.option("--queue", help="Queue (default: the task's).")
@click.option("--priority", type=int, help="Higher runs first.")
@click.option("--delay", type=click.FloatRange(0), help="Seconds from now.")
@click.option("--idempotency-key", help="At most one job per key.")
@_clean_errors
def enqueue_command(
    task: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    priority: int | None,
    delay: float | None,
    idempotency_key: str | None,
) -> None:
    """Enqueue a registered task with JSON arguments.

    The arguments must fit the task's signature, and are checked as any enqueue checks
    them; nothing is written if they do not.

    \b
    Example:
      flask queue enqueue example_app.tasks.build_report --args '[7]' --kwargs '{"fmt": "csv"}'
    """
    args = _json_arg("--args", args_json, list, "array")
    kwargs = _json_arg("--kwargs", kwargs_json, dict, "object")
    state = _state()
    if task not in state.registry:  # listing the names: the CLI has no opt-out
        known = ", ".join(sorted(state.registry)) or "none"
        raise click.ClickException(f"No task {task!r} is registered in this app (known: {known}).")
    job = state.queue.enqueue(
        task, args, kwargs, queue=queue, priority=priority, delay=delay,
        idempotency_key=idempotency_key,
    )  # fmt: skip
    click.echo(f"Job {job.id} {job.status} on queue {job.queue!r}.")


def _json_arg(flag: str, text: str, kind: type, name: str) -> Any:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise click.ClickException(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise click.ClickException(f"{flag} must be a JSON {name}, got {text!r}.")
    return value


@queue_cli.command("periodic")
@_clean_errors
def periodic_command() -> None:
    """List periodic tasks: schedule, next run (its time zone and UTC), last slot enqueued.

    Every running worker (not --burst) enqueues each slot once; see docs/periodic.md.

    \b
    Example:
      flask queue periodic
    """
    from .core import periodic

    state = _state()
    infos = periodic.describe(state.store, state.registry)
    if not infos:
        click.echo("No periodic tasks; declare one with @queue.periodic('*/5 * * * *').")
        return
    rows = [
        [
            info.schedule.task,
            info.schedule.expression,
            info.schedule.timezone,
            _when(info.next_run_local) or "never",
            _when(info.next_run) or "never",
            _when(info.last_slot) or "-",
            info.queue,
            "yes" if info.schedule.backfill else "no",
        ]
        for info in infos
    ]
    headers = ["task", "schedule", "timezone", "next run (local)", "next run (UTC)"]
    headers += ["last slot (UTC)", "queue", "backfill"]
    click.echo(_table(headers, rows))


@queue_cli.command("doctor")
@_clean_errors
def doctor_command() -> None:
    """Check the queue's database: schema, SQLite settings or server version and SKIP
    LOCKED, clock skew, stale workers, jobs no worker here can run. Exit 1 on a failure.

    \b
    Example:
      flask queue doctor
    """
    from .doctor import FAIL
    from .doctor import diagnose

    state = _state(check_schema=False)
    findings = diagnose(state.store, state.registry)
    for finding in findings:
        line = f"{finding.level:<4}  {finding.message}"
        click.echo(line + (f"\n      fix: {finding.fix}" if finding.fix else ""))
    if any(f.level == FAIL for f in findings):
        sys.exit(1)


# -- schema -------------------------------------------------------------------------------------


@db_cli.command("upgrade")
@click.argument("revision", default="head")
@_clean_errors
def db_upgrade_command(revision: str) -> None:
    """Create the queue's tables or bring them to REVISION (default: head).

    \b
    Example:
      flask queue db upgrade
    """
    state = _state(check_schema=False)
    state.schema_changed()  # re-check on next use in this process
    schema.upgrade(state.store.engine, revision)
    click.echo(f"Queue schema at {schema.current(state.store.engine)}.")


@db_cli.command("downgrade")
@click.argument("revision", default="-1")
@_clean_errors
def db_downgrade_command(revision: str) -> None:
    """Step the queue's tables back to REVISION (default: one step; "base" drops them).

    \b
    Example:
      flask queue db downgrade base
    """
    state = _state(check_schema=False)
    state.schema_changed()  # re-check on next use in this process
    schema.downgrade(state.store.engine, revision)
    click.echo(f"Queue schema at {schema.current(state.store.engine) or 'base (no tables)'}.")


@db_cli.command("current")
@_clean_errors
def db_current_command() -> None:
    """Print the queue's schema revision and whether it is the newest.

    \b
    Example:
      flask queue db current
    """
    state = _state(check_schema=False)
    revision = schema.current(state.store.engine)
    if revision is None:
        click.echo(f"No queue tables yet; {schema.UPGRADE_HINT}.")
        sys.exit(1)
    suffix = " (head)" if revision == schema.head() else f" (head is {schema.head()})"
    click.echo(f"{revision}{suffix}")

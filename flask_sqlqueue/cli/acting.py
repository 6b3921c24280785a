"""Commands that change jobs and queues, each through one function of
``core.operations`` (as the admin's buttons): ``retry``, ``cancel``, ``run-now``,
``duplicate``, ``purge``, ``purge-audit``, ``rescue``, ``pause``, ``resume``; and
``enqueue``, through the one enqueue path. Every one but ``enqueue`` (which adds a job as
the app's own enqueues do, unaudited) writes the audit log when it changes something,
naming the actor ``cli:<user>``."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from typing import cast

import click

from ..core import operations
from ..core.features.audit import Audit
from ..core.features.tags import check_tag
from ..core.features.uniqueness import Unique
from ..core.models import FINISHED
from .base import JOB_ID
from .base import app_state
from .base import clean_errors
from .base import cli_actor
from .base import queue_cli
from .formatting import parse_age


def _audit() -> Audit:
    """Who acts, as the audit log names a command's user."""
    return Audit(cli_actor())


@queue_cli.command("retry")
@click.argument("job_ids", nargs=-1, type=JOB_ID)
@click.option("--dead", is_flag=True, help="Replay every dead job (narrow with --queue/--task).")
@click.option("--queue", help="With --dead: only this queue.")
@click.option("--task", help="With --dead: only this task.")
@click.option("--tag", help="With --dead: only jobs with this tag.")
@click.option("--args", "args_json", help="With one id: replay with these args (JSON array).")
@click.option("--kwargs", "kwargs_json", help="With one id: replay with these kwargs (JSON).")
@click.option("--to-queue", help="With one id: replay in this queue.")
@click.option("--priority", type=int, help="With one id: replay with this priority.")
@clean_errors
def retry_command(
    job_ids: tuple[int, ...],
    dead: bool,
    queue: str | None,
    task: str | None,
    args_json: str | None,
    kwargs_json: str | None,
    to_queue: str | None,
    priority: int | None,
    tag: str | None,
) -> None:
    """Replay dead (or cancelled) jobs with fresh attempts.

    With one id, --args, --kwargs, --to-queue and --priority change the job before it is
    replayed (what is not given stays). New arguments take their stored JSON forms, as
    `flask queue show` has them, and are checked as an enqueue checks them: if they do
    not fit the task, nothing changes.

    \b
    Example:
      flask queue retry 42 43
      flask queue retry --dead --task example_app.tasks.call_flaky_api
      flask queue retry 42 --kwargs '{"email": "fixed@example.com"}' --priority 10
    """
    if bool(job_ids) == dead:
        raise click.UsageError("Give job ids or --dead, not both and not neither.")
    if (queue or task) and not dead:
        raise click.UsageError("--queue and --task go with --dead.")
    if tag and not dead:
        raise click.UsageError("--tag goes with --dead.")
    if tag is not None:
        check_tag(tag, "--tag")
    edits = (args_json, kwargs_json, to_queue, priority)
    if any(edit is not None for edit in edits) and len(job_ids) != 1:
        raise click.UsageError("--args, --kwargs, --to-queue and --priority go with one job id.")
    state = app_state()
    store = state.store
    if dead:
        n = operations.retry_dead(store, queue=queue, task=task, tag=tag, audit=_audit())
    elif any(edit is not None for edit in edits):
        job = operations.replay_edited(
            store,
            state.registry,
            job_ids[0],
            args=None if args_json is None else _json_arg("--args", args_json, list, "array"),
            kwargs=(
                None if kwargs_json is None else _json_arg("--kwargs", kwargs_json, dict, "object")
            ),
            queue=to_queue,
            priority=priority,
            audit=_audit(),
        )
        click.echo(f"Replayed job {job.id}: {job.status} on queue {job.queue!r}.")
        return
    else:
        n = operations.retry(store, job_ids, audit=_audit())
    click.echo(f"Replayed {n} job(s).")


@queue_cli.command("run-now")
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@clean_errors
def run_now_command(job_ids: tuple[int, ...]) -> None:
    """Make pending jobs that are delayed or backing off due now. All or none: a
    missing or not pending id changes nothing.

    A paused queue or a task's limits still hold the job back.

    \b
    Example:
      flask queue run-now 42 43
    """
    n = operations.run_now(app_state().store, job_ids, audit=_audit())
    click.echo(f"{n} job(s) due now ({len(set(job_ids)) - n} were due already).")


@queue_cli.command("duplicate")
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@clean_errors
def duplicate_command(job_ids: tuple[int, ...]) -> None:
    """Enqueue a copy of each job as a new job: the same task, arguments, queue and
    priority, with fresh attempts (not its idempotency key or dependencies).

    \b
    Example:
      flask queue duplicate 42
    """
    state = app_state()
    for job_id in job_ids:
        made = operations.duplicate(state.store, state.registry, job_id, audit=_audit())
        click.echo(f"Job {made.id} is a copy of job {job_id} ({made.status}).")


@queue_cli.command("cancel")
@click.argument("job_ids", nargs=-1, required=True, type=JOB_ID)
@clean_errors
def cancel_command(job_ids: tuple[int, ...]) -> None:
    """Cancel pending jobs, and ask running ones to stop. All or none: a missing or
    finished id changes nothing.

    A running job stops when its task checks current_job.cancel_requested; one that
    never checks runs to its end.

    \b
    Example:
      flask queue cancel 42 43
    """
    click.echo(operations.cancel(app_state().store, job_ids, audit=_audit()).describe())


@queue_cli.command("purge")
@click.option(
    "--status",
    required=True,
    type=click.Choice(list(FINISHED)),
    help="Which finished jobs to delete.",
)
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Age like 7d, 12h, 30m: jobs last changed before then.",
)
@clean_errors
def purge_command(status: str, older_than: str) -> None:
    """Delete finished jobs last changed more than --older-than ago.

    \b
    Example:
      flask queue purge --status completed --older-than 7d
    """
    age = parse_age(older_than)
    store = app_state().store
    try:
        n = operations.purge(store, status, age, audit=_audit())
    except OverflowError:
        raise click.ClickException(f"{older_than!r} is too long an age.") from None
    click.echo(f"Purged {n} {status} job(s).")


@queue_cli.command("purge-audit")
@click.option(
    "--older-than",
    "older_than",
    required=True,
    help="Age like 90d, 12h: entries written before then.",
)
@clean_errors
def purge_audit_command(older_than: str) -> None:
    """Delete audit log entries written more than --older-than ago.

    \b
    Example:
      flask queue purge-audit --older-than 90d
    """
    age = parse_age(older_than)
    try:
        n = operations.purge_audit(app_state().store, age, audit=_audit())
    except OverflowError:
        raise click.ClickException(f"{older_than!r} is too long an age.") from None
    click.echo(f"Purged {n} audit entr{'y' if n == 1 else 'ies'}.")


@queue_cli.command("rescue")
@clean_errors
def rescue_command() -> None:
    """Take back running jobs whose worker stopped heartbeating (SQLQUEUE_STALE_AFTER).

    Workers on this machine are judged by its boot clock, others by the database's
    clock, so a step of a wall clock does not make a live worker look lost.

    \b
    Example:
      flask queue rescue
    """
    state = app_state()
    rescued = operations.rescue(state.store, state.settings.stale_after, audit=_audit())
    for job_id, status, worker in rescued:
        click.echo(f"job {job_id}: worker {worker} lost; now {status}")
    click.echo(f"Rescued {len(rescued)} job(s).")


@queue_cli.command("pause")
@click.argument("names", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Pause every queue known now.")
@clean_errors
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
@clean_errors
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
    state = app_state()
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
    changed = operations.set_paused(
        state.store, names, paused=paused, registry=state.registry, audit=_audit()
    )
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
@click.option("--tag", "tags", multiple=True, help="A tag for the job (repeat for more).")
@click.option("--meta", "meta_json", help="JSON object of metadata for the job.")
@click.option("--expires", help="Age after which it is not started: 90s, 10m, 2h.")
@click.option("--unique", is_flag=True, help="At most one pending job of these arguments.")
@click.option("--unique-key", help="With --unique: the key, instead of the arguments.")
@click.option(
    "--on-conflict",
    type=click.Choice(["skip", "replace"]),
    help="With --unique: return the job holding the key, or give it these arguments.",
)
@clean_errors
def enqueue_command(
    task: str,
    args_json: str,
    kwargs_json: str,
    queue: str | None,
    priority: int | None,
    delay: float | None,
    idempotency_key: str | None,
    tags: tuple[str, ...],
    meta_json: str | None,
    expires: str | None,
    unique: bool,
    unique_key: str | None,
    on_conflict: str | None,
) -> None:
    """Enqueue a registered task with JSON arguments (and tags and metadata, if given).

    The arguments must fit the task's signature, and are checked as any enqueue checks
    them; nothing is written if they do not. Typed parameters take their stored JSON
    forms, as `flask queue show` has them: an ISO 8601 string for a datetime, the text
    of a UUID or a Decimal, an enum's value, an object for a dataclass.

    \b
    Example:
      flask queue enqueue example_app.tasks.build_report --args '[7]' --kwargs '{"fmt": "csv"}'
      flask queue enqueue example_app.tasks.build_report --args '[7]' --tag customer:7 \\
          --meta '{"requested_by": "ops"}'
      flask queue enqueue example_app.tasks.build_report --args '[7]' --expires 1h \\
          --unique --on-conflict replace
    """
    if (unique_key is not None or on_conflict is not None) and not unique:
        raise click.UsageError("--unique-key and --on-conflict go with --unique.")
    once = Unique(unique_key, on_conflict=cast("Any", on_conflict or "skip")) if unique else None
    lifetime = None if expires is None else _age("--expires", expires)
    args = _json_arg("--args", args_json, list, "array")
    kwargs = _json_arg("--kwargs", kwargs_json, dict, "object")
    meta = None if meta_json is None else _json_arg("--meta", meta_json, dict, "object")
    state = app_state()
    if task not in state.registry:  # listing the names: the CLI has no opt-out
        known = ", ".join(sorted(state.registry)) or "none"
        raise click.ClickException(f"No task {task!r} is registered in this app (known: {known}).")
    job = state.queue.enqueue(
        task, args, kwargs, queue=queue, priority=priority, delay=delay,
        idempotency_key=idempotency_key, tags=tags or None, meta=meta, encoded=True,
        expires=lifetime, unique=once,
    )  # fmt: skip
    click.echo(f"Job {job.id} {job.status} on queue {job.queue!r}.")


def _age(flag: str, text: str) -> timedelta:
    try:
        return parse_age(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def _json_arg(flag: str, text: str, kind: type, name: str) -> Any:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise click.ClickException(f"{flag} is not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise click.ClickException(f"{flag} must be a JSON {name}, got {text!r}.")
    return value

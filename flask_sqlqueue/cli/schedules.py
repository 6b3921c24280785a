"""``flask queue schedules``: list the periodic schedules, disable and enable them for
every worker, and run one now; through ``core.operations`` (as the admin's buttons).
``flask queue periodic``, the listing's old name, still lists them, with a deprecation
note on stderr."""

from __future__ import annotations

import click
from flask.cli import with_appcontext

from ..core import operations
from ..core import periodic
from ..core.features.audit import Audit
from .base import app_state
from .base import clean_errors
from .base import cli_actor
from .base import queue_cli
from .formatting import format_table
from .formatting import format_time


@queue_cli.group("schedules", invoke_without_command=True)
@click.pass_context
@with_appcontext  # a group's own callback gets none from AppGroup, unlike its commands
@clean_errors
def schedules_cli(ctx: click.Context) -> None:
    """List periodic schedules: name, cron expression, enabled, last run, next run (UTC and
    the schedule's time zone), queue, backfill.

    The state lives in the database, so every worker on every host obeys it.

    \b
    Example:
      flask queue schedules
      flask queue schedules disable app.tasks.nightly_report
      flask queue schedules enable app.tasks.nightly_report
      flask queue schedules run app.tasks.nightly_report
    """
    if ctx.invoked_subcommand is not None:
        return
    _list_schedules()


@queue_cli.command(
    "periodic", deprecated="Use 'flask queue schedules', which lists the same schedules."
)
@clean_errors
def periodic_command() -> None:
    """List periodic schedules, as ``flask queue schedules`` does (its old name).

    \b
    Example:
      flask queue periodic
    """
    _list_schedules()


def _list_schedules() -> None:
    state = app_state()
    infos = periodic.describe(state.store, state.registry)
    if not infos:
        click.echo("No periodic tasks; declare one with @queue.periodic('*/5 * * * *').")
        return
    rows = [
        [
            info.name,
            f"{info.schedule.expression} ({info.schedule.timezone})",
            "yes" if info.enabled else "no",
            format_time(info.last_slot) or "-",
            format_time(info.next_run) or ("never" if info.enabled else "- (disabled)"),
            format_time(info.next_run_local) or ("never" if info.enabled else "-"),
            info.queue,
            "yes" if info.schedule.backfill else "no",
        ]
        for info in infos
    ]
    headers = ["name", "schedule", "enabled", "last run (UTC)", "next run (UTC)"]
    headers += ["next run (its zone)", "queue", "backfill"]
    click.echo(format_table(headers, rows))


@schedules_cli.command("disable")
@click.argument("name")
@clean_errors
def disable_command(name: str) -> None:
    """Stop every worker from enqueueing this schedule's slots; queued jobs still run.

    \b
    Example:
      flask queue schedules disable app.tasks.nightly_report
    """
    _set_enabled(name, enabled=False)


@schedules_cli.command("enable")
@click.argument("name")
@clean_errors
def enable_command(name: str) -> None:
    """Enqueue this schedule's slots again, from its next slot on (the slots missed
    while it was disabled are not enqueued, even with backfill).

    \b
    Example:
      flask queue schedules enable app.tasks.nightly_report
    """
    _set_enabled(name, enabled=True)


@schedules_cli.command("run")
@click.argument("name")
@clean_errors
def run_command(name: str) -> None:
    """Enqueue one run of this schedule now, with its arguments, enabled or not. Its
    cadence is untouched: the next slot still runs on time.

    \b
    Example:
      flask queue schedules run app.tasks.nightly_report
    """
    state = app_state()
    job = state.queue.run_schedule(name, actor=cli_actor())
    click.echo(f"Job {job.id} {job.status} on queue {job.queue!r}.")


def _set_enabled(name: str, *, enabled: bool) -> None:
    state = app_state()
    changed = operations.set_schedule_enabled(
        state.store, name, enabled=enabled, registry=state.registry, audit=Audit(cli_actor())
    )
    word = "enabled" if enabled else "disabled"
    if changed:
        click.echo(f"Schedule {name!r} {word}.")
    else:
        click.echo(f"Schedule {name!r} was {word} already.")

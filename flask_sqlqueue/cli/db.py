"""``flask queue db upgrade|downgrade|current``: the bundled Alembic migrations."""

from __future__ import annotations

import sys

import click

from .. import schema
from .base import app_state
from .base import clean_errors
from .base import db_cli


@db_cli.command("upgrade")
@click.argument("revision", default="head")
@clean_errors
def db_upgrade_command(revision: str) -> None:
    """Create the queue's tables or bring them to REVISION (default: head).

    \b
    Example:
      flask queue db upgrade
    """
    state = app_state(check_schema=False)
    state.schema_changed()  # re-check on next use in this process
    schema.upgrade(state.store.engine, revision)
    click.echo(f"Queue schema at {schema.current(state.store.engine)}.")


@db_cli.command("downgrade")
@click.argument("revision", default="-1")
@clean_errors
def db_downgrade_command(revision: str) -> None:
    """Step the queue's tables back to REVISION (default: one step; "base" drops them).

    \b
    Example:
      flask queue db downgrade base
    """
    state = app_state(check_schema=False)
    state.schema_changed()  # re-check on next use in this process
    schema.downgrade(state.store.engine, revision)
    click.echo(f"Queue schema at {schema.current(state.store.engine) or 'base (no tables)'}.")


@db_cli.command("current")
@clean_errors
def db_current_command() -> None:
    """Print the queue's schema revision and whether it is the newest.

    \b
    Example:
      flask queue db current
    """
    state = app_state(check_schema=False)
    revision = schema.current(state.store.engine)
    if revision is None:
        click.echo(f"No queue tables yet; {schema.UPGRADE_HINT}.")
        sys.exit(1)
    suffix = " (head)" if revision == schema.head() else f" (head is {schema.head()})"
    click.echo(f"{revision}{suffix}")

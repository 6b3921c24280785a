"""The ``flask queue`` and ``flask queue db`` groups, and what every command shares:
the app's queue state, and errors turned into one ``Error:`` line with exit status 1."""

from __future__ import annotations

import functools
import getpass
import re
import sys
from collections.abc import Callable
from typing import Any
from typing import TypeVar

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from ..core.models import JobStatus
from ..exceptions import QueueNotSetUp
from ..exceptions import SQLQueueError
from ..extension import QueueState
from ..extension import queue_state

F = TypeVar("F", bound=Callable[..., Any])

STATUSES = [status.value for status in JobStatus]
# Job ids are 64-bit on every backend; a bigger number must be refused, not overflow a driver.
JOB_ID = click.IntRange(1, 2**63 - 1)

queue_cli = AppGroup("queue", help="Run and inspect the background-job queue.")
db_cli = AppGroup("db", help="Create and upgrade the queue's own tables (Alembic).")
queue_cli.add_command(db_cli)


def app_state(check_schema: bool = True) -> QueueState:
    """The app's queue state, its schema checked unless told not to. Its errors, as every
    command's, become one-line CLI errors through :func:`clean_errors`."""
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


def clean_errors(fn: F) -> F:
    """Turn the queue's own errors and database errors into one-line CLI errors."""

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


def cli_actor() -> str:
    """Who acts, as the audit log names a command's user."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container, say)
        user = "unknown"
    return f"cli:{user}"

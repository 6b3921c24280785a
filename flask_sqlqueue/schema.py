"""The queue's own Alembic migrations: upgrade, downgrade, current, and the start-up check.

The scripts ship inside the package (``flask_sqlqueue/_migrations`` in a wheel, the
top-level ``migrations/`` folder in a checkout) and record their revision in their own
version table, so an app's own Alembic or Flask-Migrate history is never touched.

Alembic is imported only to change the schema. The start-up check, which every worker
and web process runs, reads the version table and the scripts' revision ids itself:
Alembic and what it loads (Mako, Pygments) were a sixth of a worker's memory.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine

from .core.models import VERSION_TABLE
from .exceptions import SchemaError

UPGRADE_HINT = "run `flask queue db upgrade`"


def migrations_dir() -> Path:
    """Where the bundled migration scripts are, installed or in a source checkout."""
    packaged = resources.files("flask_sqlqueue").joinpath("_migrations")
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parent.parent / "migrations"
    if (source / "env.py").is_file():
        return source
    raise SchemaError("The bundled migrations are missing from this installation.")


if TYPE_CHECKING:
    from alembic.config import Config


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def _revisions() -> dict[str, str | None]:
    """Each bundled script's revision and the one it revises, read from its source (the
    scripts are Alembic's, each assigning both as plain strings)."""
    found: dict[str, str | None] = {}
    for path in sorted((migrations_dir() / "versions").glob("*.py")):
        names: dict[str, str | None] = {}
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                    names[target.id] = ast.literal_eval(node.value)
        if names.get("revision"):
            found[str(names["revision"])] = names.get("down_revision")
    return found


@functools.cache
def head() -> str:
    """The newest revision this version of flask_sqlqueue knows."""
    revisions = _revisions()
    heads = set(revisions) - set(revisions.values())
    if len(heads) != 1:
        raise SchemaError(f"The bundled migrations have {len(heads)} heads, not one.")
    return heads.pop()


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        upgrade_on(conn, revision)


def downgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        downgrade_on(conn, revision)


def upgrade_on(conn: Connection, revision: str = "head") -> None:
    """:func:`upgrade` on an open connection, in its transaction (an app's own
    migration's: flask_sqlqueue.migrate)."""
    from alembic import command

    command.upgrade(_config(conn), revision)


def downgrade_on(conn: Connection, revision: str) -> None:
    """:func:`downgrade` on an open connection, in its transaction."""
    from alembic import command

    command.downgrade(_config(conn), revision)


def current(engine: Engine) -> str | None:
    """The revision the database is at; ``None`` before the first upgrade."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(VERSION_TABLE):
            return None
        rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(rows) > 1:
        raise SchemaError(f"The queue's version table holds {len(rows)} revisions, not one.")
    return rows[0] if rows else None


def check(engine: Engine) -> None:
    """Raise :class:`SchemaError` unless the database is at this version's head."""
    try:
        revision = current(engine)
    except Exception as exc:
        raise SchemaError(
            f"Cannot read the queue's schema version from {engine.url!r}: {exc}"
        ) from exc
    if revision == head():
        return
    if revision is None:
        raise SchemaError(f"The queue's tables do not exist in {engine.url!r} yet; {UPGRADE_HINT}.")
    if revision not in _revisions():
        raise SchemaError(
            f"The queue's schema in {engine.url!r} is at revision {revision}, newer than this "
            "version of flask_sqlqueue knows; upgrade the flask-sqlqueue package."
        )
    raise SchemaError(
        f"The queue's schema in {engine.url!r} is at revision {revision}, older than this "
        f"version of flask_sqlqueue needs ({head()}); {UPGRADE_HINT}."
    )

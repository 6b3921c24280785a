"""The queue's own Alembic migrations: upgrade, downgrade, current, and the start-up check.

The scripts ship inside the package (``flask_sqlqueue/_migrations`` in a wheel, the
top-level ``migrations/`` folder in a checkout) and record their revision in their own
version table, so an app's own Alembic or Flask-Migrate history is never touched.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
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


def _config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


@functools.cache
def head() -> str:
    """The newest revision this version of flask_sqlqueue knows."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as conn:
        command.upgrade(_config(conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        command.downgrade(_config(conn), revision)


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


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
    known = {script.revision for script in ScriptDirectory.from_config(_config()).walk_revisions()}
    if revision not in known:
        raise SchemaError(
            f"The queue's schema in {engine.url!r} is at revision {revision}, newer than this "
            "version of flask_sqlqueue knows; upgrade the flask-sqlqueue package."
        )
    raise SchemaError(
        f"The queue's schema in {engine.url!r} is at revision {revision}, older than this "
        f"version of flask_sqlqueue needs ({head()}); {UPGRADE_HINT}."
    )

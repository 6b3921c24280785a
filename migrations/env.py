"""Alembic environment for flask_sqlqueue's own tables.

Run through ``flask queue db ...`` (or ``flask_sqlqueue.schema``), which passes an open
connection in ``config.attributes``. The version table is the queue's own.
"""

from __future__ import annotations

from alembic import context

from flask_sqlqueue.core.models import VERSION_TABLE
from flask_sqlqueue.core.models import metadata
from flask_sqlqueue.core.models import use_dialect

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "flask_sqlqueue's migrations run through `flask queue db upgrade`, not plain alembic."
    )

use_dialect(connection.dialect.name)  # the tables' options on this database
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)

with context.begin_transaction():
    context.run_migrations()

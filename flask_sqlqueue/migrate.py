"""The queue's migrations run from an app's own Alembic history (Flask-Migrate), for
teams that want one ``flask db upgrade`` (docs/flask-migrate.md).

A revision of the app's history brings the queue's tables to a revision of the queue's::

    from flask_sqlqueue.migrate import downgrade_queue, upgrade_queue

    def upgrade():
        upgrade_queue("0010")

    def downgrade():
        downgrade_queue("base")

Each runs the queue's own scripts on the app migration's connection, in its
transaction, and records the queue's revision where it always is, in the queue's own
version table: so ``flask queue db current``, the start-up check and
``flask queue db upgrade`` keep working, and the app's history pins which queue schema
each of its revisions has. :func:`exclude_queue_tables` keeps autogenerate
(``flask db migrate``) from writing migrations that drop the queue's tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import schema


def upgrade_queue(revision: str = "head") -> None:
    """Bring the queue's tables up to ``revision`` of the queue's migrations, from an
    app's migration script (its ``upgrade()``). Name the revision rather than ``head``:
    a history whose meaning changes when the package does cannot be replayed.
    """
    from alembic import op

    with _outer_kept():
        schema.upgrade_on(op.get_bind(), revision)


def downgrade_queue(revision: str) -> None:
    """Take the queue's tables back to ``revision`` (``"base"`` drops them), from an
    app's migration script (its ``downgrade()``)."""
    from alembic import op

    with _outer_kept():
        schema.downgrade_on(op.get_bind(), revision)


@contextlib.contextmanager
def _outer_kept() -> Iterator[None]:
    """Run Alembic inside a running Alembic migration: the inner run replaces the
    module-level ``op`` and ``context`` proxies and clears them when it ends, so the
    outer run's are put back, for the app's revisions that come after this one."""
    from alembic import context
    from alembic import op

    saved = [getattr(module, "_proxy", None) for module in (op, context)]
    try:
        yield
    finally:
        for proxy in saved:
            if proxy is not None:
                proxy._install_proxy()


def exclude_queue_tables(name: str | None, type_: str, parent_names: object) -> bool:
    """An ``include_name`` filter for autogenerate (``flask db migrate``): the queue's
    tables, its version table among them, belong to the queue's migrations.

    ``Migrate(app, db, include_name=exclude_queue_tables)`` passes it to Alembic.
    """
    if type_ == "table" and name is not None:
        return not name.startswith("sqlqueue_")
    return True

"""Scoped uniqueness: ``sqlqueue_jobs.unique_key`` and its unique index.

A job enqueued with ``Unique`` (docs/uniqueness.md) holds its key in the new column, and
the unique index makes two producers racing for one key insert one row. The index is
partial where the database has partial indexes (PostgreSQL, SQLite), so jobs without a
key, most, stay out of it; MariaDB keeps every row, where NULLs never collide. Every
job existing at the upgrade has no key. A downgrade drops both: the jobs that held keys
stay, as ordinary jobs.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
INDEX = "uq_sqlqueue_jobs_unique_key"


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly (a frozen copy of the model's): a binary, no-pad
    collation on MariaDB/MySQL, whose default ones ignore case, accents and trailing
    spaces."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def upgrade() -> None:
    # A plain ALTER TABLE, no batch: on SQLite a batch would copy the jobs table.
    op.add_column(JOBS, sa.Column("unique_key", exact_string(255), nullable=True))
    keyed = sa.text("unique_key IS NOT NULL")
    op.create_index(
        INDEX, JOBS, ["unique_key"], unique=True, postgresql_where=keyed, sqlite_where=keyed
    )


def downgrade() -> None:
    op.drop_index(INDEX, JOBS)
    op.drop_column(JOBS, "unique_key")

"""Replay keeps uniqueness: ``sqlqueue_jobs.unique_key_freed``.

An enqueue that finds its unique key held by a job out of its scope (finished, say)
takes the key from that job (docs/uniqueness.md). The job now keeps the key it lost in
this column, not indexed, so that replaying it can take the key back, or be refused
while another job holds it: two live jobs never share a key. Every job existing at the
upgrade has none; a job whose key was taken before the upgrade is replayed without one,
as before. A downgrade drops the column.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly (a frozen copy of the model's), as 0016's."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def upgrade() -> None:
    # A plain ALTER TABLE, no batch: on SQLite a batch would copy the jobs table.
    op.add_column(JOBS, sa.Column("unique_key_freed", exact_string(255), nullable=True))


def downgrade() -> None:
    op.drop_column(JOBS, "unique_key_freed")

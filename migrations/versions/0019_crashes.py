"""The crash budget counts crashes only: ``sqlqueue_jobs.crashes``.

A rescue takes back the attempt of a worker that stopped heartbeating; ``rescues`` counts
every one. A worker that was only paused or starved and reports in again was no crash,
so the crash budget (``SQLQUEUE_MAX_CRASHES``) now reads this column, from which such a
worker takes its rescues back. At the upgrade every rescue so far counts, as it did
(``crashes = rescues``). A downgrade drops the column.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"


def upgrade() -> None:
    # A plain ALTER TABLE, no batch: on SQLite a batch would copy the jobs table.
    op.add_column(JOBS, sa.Column("crashes", sa.Integer, nullable=False, server_default="0"))
    jobs = sa.table(JOBS, sa.column("rescues", sa.Integer), sa.column("crashes", sa.Integer))
    op.execute(jobs.update().where(jobs.c.rescues > 0).values(crashes=jobs.c.rescues))


def downgrade() -> None:
    op.drop_column(JOBS, "crashes")

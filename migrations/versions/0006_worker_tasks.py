"""Workers record the task names they register, so status, doctor and the admin can
warn about pending jobs that no live worker runs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

WORKERS = "sqlqueue_workers"
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column(WORKERS, sa.Column("tasks", LongText, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(WORKERS) as batch:
        batch.drop_column("tasks")

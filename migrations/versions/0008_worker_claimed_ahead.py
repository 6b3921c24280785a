"""Workers record the jobs they claimed ahead and have not started, at each heartbeat.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

WORKERS = "sqlqueue_workers"


def upgrade() -> None:
    with op.batch_alter_table(WORKERS) as workers:
        workers.add_column(sa.Column("claimed_ahead", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(WORKERS) as workers:
        workers.drop_column("claimed_ahead")

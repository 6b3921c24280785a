"""Workers record their machine's boot and boot clock, so rescue survives clock steps.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

WORKERS = "sqlqueue_workers"


def upgrade() -> None:
    with op.batch_alter_table(WORKERS) as workers:
        workers.add_column(sa.Column("boot_id", sa.String(36), nullable=True))
        workers.add_column(sa.Column("boot_clock_us", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(WORKERS) as workers:
        workers.drop_column("boot_clock_us")
        workers.drop_column("boot_id")

"""Schedules steered at run time: each periodic schedule can be disabled and enabled
again, and every worker's scheduler obeys the flag it reads with the schedule's ledger.

``sqlqueue_schedules.enabled`` (true for every schedule existing at the upgrade) and
``toggled_at``, when ``enabled`` last changed: once a schedule is enabled again, no slot
up to that moment is enqueued. A downgrade drops both, so a disabled schedule runs again
from its next slot.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SCHEDULES = "sqlqueue_schedules"

# Frozen copy of the model type: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # Plain ALTER TABLEs, no batch: on SQLite a batch would copy the table for nothing.
    op.add_column(SCHEDULES, sa.Column("enabled", sa.Boolean(), server_default="1", nullable=False))
    op.add_column(SCHEDULES, sa.Column("toggled_at", Timestamp, nullable=True))


def downgrade() -> None:
    # Plain DROP COLUMNs, which SQLite has had since 3.35 (the queue requires it).
    op.drop_column(SCHEDULES, "toggled_at")
    op.drop_column(SCHEDULES, "enabled")

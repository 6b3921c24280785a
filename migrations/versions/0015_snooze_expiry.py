"""Snoozes and expiry: ``sqlqueue_jobs.snoozes`` and ``sqlqueue_jobs.expires_at``.

``snoozes`` counts the times a task raised ``Snooze`` (run again later without spending
an attempt); every job existing at the upgrade has none. ``expires_at`` is when a job
that has not started stops being worth running (``using(expires=...)``); ``NULL`` for
every existing job, which never expires. Neither is indexed: the claim never filters on
them, so an enqueue writes no more index entries than before.

A downgrade drops both: jobs that would have expired run whenever they are claimed.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"

# A frozen copy of the model's time type: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # Plain ALTER TABLEs, no batch: on SQLite a batch would copy the jobs table.
    op.add_column(JOBS, sa.Column("expires_at", Timestamp, nullable=True))
    op.add_column(JOBS, sa.Column("snoozes", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column(JOBS, "snoozes")
    op.drop_column(JOBS, "expires_at")

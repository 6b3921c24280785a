"""Indexes of running jobs and of started jobs hold only those rows.

Where the database has partial indexes (PostgreSQL, SQLite), the index of running jobs by
worker, the index of running jobs per limited task and key, and the index of start times
keep only the rows their queries ask for: an enqueue writes none of them, and a job's
later updates touch them only while it is in. MariaDB has no partial indexes and keeps
them whole. Rebuilding them reads the jobs table once per index.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
RUNNING = sa.text("status = 'running'")
STARTED = sa.text("started_at IS NOT NULL")
INDEXES = [
    ("ix_sqlqueue_jobs_status_worker", ["status", "worker_id"], RUNNING),
    (
        "ix_sqlqueue_jobs_task_concurrency_key_status",
        ["task", "concurrency_key", "status"],
        RUNNING,
    ),
    ("ix_sqlqueue_jobs_started_at", ["started_at"], STARTED),
]


def _rebuild(*, partial: bool) -> None:
    if op.get_bind().dialect.name not in ("postgresql", "sqlite"):
        return
    for name, columns, where in INDEXES:
        op.drop_index(name, JOBS)
        kept = where if partial else None
        op.create_index(name, JOBS, columns, postgresql_where=kept, sqlite_where=kept)


def upgrade() -> None:
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)

"""Indexes for the admin's charts and per-task metrics.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"


def upgrade() -> None:
    # (task, status) grows a third column instead of living beside a twin that has it.
    op.drop_index("ix_sqlqueue_jobs_task_status", JOBS)
    op.create_index(
        "ix_sqlqueue_jobs_task_status_finished_at", JOBS, ["task", "status", "finished_at"]
    )
    op.create_index("ix_sqlqueue_jobs_status_finished_at", JOBS, ["status", "finished_at"])
    op.create_index("ix_sqlqueue_jobs_created_at", JOBS, ["created_at"])
    op.create_index("ix_sqlqueue_jobs_started_at", JOBS, ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_jobs_started_at", JOBS)
    op.drop_index("ix_sqlqueue_jobs_created_at", JOBS)
    op.drop_index("ix_sqlqueue_jobs_status_finished_at", JOBS)
    op.drop_index("ix_sqlqueue_jobs_task_status_finished_at", JOBS)
    op.create_index("ix_sqlqueue_jobs_task_status", JOBS, ["task", "status"])

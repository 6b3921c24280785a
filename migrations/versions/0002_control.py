"""Queue pauses, limits, cancellation requests, progress, and gone workers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Frozen copies of the model types: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
PENDING = sa.text("status = 'pending'")


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly: a binary, no-pad collation on MariaDB/MySQL."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def _claim_index(*, partial: bool) -> None:
    where = PENDING if partial else None
    op.create_index(
        "ix_sqlqueue_jobs_claim",
        "sqlqueue_jobs",
        ["status", sa.text("priority DESC"), "run_at", "id"],
        postgresql_where=where,
        sqlite_where=where,
    )


def upgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as jobs:
        jobs.add_column(sa.Column("cancel_requested_at", Timestamp, nullable=True))
        jobs.add_column(sa.Column("progress", sa.Float(), nullable=True))
        jobs.add_column(sa.Column("progress_message", LongText, nullable=True))
        jobs.add_column(sa.Column("concurrency_key", exact_string(255), nullable=True))
    op.create_index(
        "ix_sqlqueue_jobs_task_concurrency_key_status",
        "sqlqueue_jobs",
        ["task", "concurrency_key", "status"],
    )
    # Finished jobs leave the claim index where the database has partial indexes.
    if op.get_bind().dialect.name in ("postgresql", "sqlite"):
        op.drop_index("ix_sqlqueue_jobs_claim", "sqlqueue_jobs")
        _claim_index(partial=True)

    with op.batch_alter_table("sqlqueue_workers") as workers:
        workers.add_column(sa.Column("stopped_at", Timestamp, nullable=True))
        workers.add_column(sa.Column("stop_reason", sa.String(32), nullable=True))

    op.create_table(
        "sqlqueue_queues",
        sa.Column("name", exact_string(100), nullable=False),
        sa.Column("paused_at", Timestamp, nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_queues"),
        mysql_charset="utf8mb4",
    )
    op.create_table(
        "sqlqueue_limits",
        sa.Column("name", exact_string(255), nullable=False),
        sa.Column("window_start", Timestamp, nullable=True),
        sa.Column("starts", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_limits"),
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_limits")
    op.drop_table("sqlqueue_queues")
    with op.batch_alter_table("sqlqueue_workers") as workers:
        workers.drop_column("stop_reason")
        workers.drop_column("stopped_at")
    if op.get_bind().dialect.name in ("postgresql", "sqlite"):
        op.drop_index("ix_sqlqueue_jobs_claim", "sqlqueue_jobs")
        _claim_index(partial=False)
    op.drop_index("ix_sqlqueue_jobs_task_concurrency_key_status", "sqlqueue_jobs")
    with op.batch_alter_table("sqlqueue_jobs") as jobs:
        jobs.drop_column("concurrency_key")
        jobs.drop_column("progress_message")
        jobs.drop_column("progress")
        jobs.drop_column("cancel_requested_at")

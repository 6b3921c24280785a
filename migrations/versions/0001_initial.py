"""Jobs, job effects and workers.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = ("sqlqueue",)
depends_on = None

# Frozen copies of the model types: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly: a binary, no-pad collation on MariaDB/MySQL, whose
    default ones ignore case, accents and trailing spaces."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def upgrade() -> None:
    op.create_table(
        "sqlqueue_jobs",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("queue", exact_string(100), nullable=False),
        sa.Column("task", exact_string(255), nullable=False),
        sa.Column("payload", LongText, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("rescues", sa.Integer(), server_default="0", nullable=False),
        sa.Column("releases", sa.Integer(), server_default="0", nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("run_at", Timestamp, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("started_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("worker_id", sa.String(100), nullable=True),
        sa.Column("claim_token", sa.String(32), nullable=True),
        sa.Column("last_error", LongText, nullable=True),
        sa.Column("errors", LongText, nullable=True),
        sa.Column("result", LongText, nullable=True),
        sa.Column("idempotency_key", exact_string(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_jobs"),
        sa.UniqueConstraint("idempotency_key", name="uq_sqlqueue_jobs_idempotency_key"),
        mysql_charset="utf8mb4",  # UTF-8 whatever the server's default
    )
    op.create_index(
        "ix_sqlqueue_jobs_claim",
        "sqlqueue_jobs",
        ["status", sa.text("priority DESC"), "run_at", "id"],
    )
    op.create_index("ix_sqlqueue_jobs_status_worker", "sqlqueue_jobs", ["status", "worker_id"])
    op.create_index("ix_sqlqueue_jobs_queue_status", "sqlqueue_jobs", ["queue", "status"])
    op.create_index("ix_sqlqueue_jobs_task_status", "sqlqueue_jobs", ["task", "status"])

    op.create_table(
        "sqlqueue_job_effects",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("key", exact_string(255), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_job_effects"),
        sa.UniqueConstraint("key", name="uq_sqlqueue_job_effects_key"),
        mysql_charset="utf8mb4",  # UTF-8 whatever the server's default
    )
    op.create_index("ix_sqlqueue_job_effects_job_id", "sqlqueue_job_effects", ["job_id"])

    op.create_table(
        "sqlqueue_workers",
        sa.Column("id", sa.String(100), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("queues", LongText, nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("last_heartbeat_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_workers"),
        mysql_charset="utf8mb4",  # UTF-8 whatever the server's default
    )
    op.create_index(
        "ix_sqlqueue_workers_last_heartbeat_at", "sqlqueue_workers", ["last_heartbeat_at"]
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_workers")
    op.drop_table("sqlqueue_job_effects")
    op.drop_table("sqlqueue_jobs")

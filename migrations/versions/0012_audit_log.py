"""The audit log: what people did to jobs and queues through the admin or the CLI.

``sqlqueue_audit_log`` holds one row per job an action changed (or one for an action on
no single job, such as pausing a queue): when, who (the ``actor`` the admin blueprint or
the command line named), which action, the job, and a JSON detail. Nothing else reads or
writes it, so enqueueing and working are unchanged. A downgrade drops it with its rows.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

AUDIT = "sqlqueue_audit_log"

# Frozen copies of the model types: a migration must not change when the models do.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        AUDIT,
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("at", Timestamp, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("detail", LongText, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_audit_log"),
        sqlite_autoincrement=True,  # ids only grow, as the jobs' (core/models.py)
        mysql_charset="utf8mb4",  # as every table of the queue, whatever the server's default
    )
    op.create_index("ix_sqlqueue_audit_log_at", AUDIT, ["at"])
    op.create_index("ix_sqlqueue_audit_log_job_id", AUDIT, ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_audit_log_job_id", AUDIT)
    op.drop_index("ix_sqlqueue_audit_log_at", AUDIT)
    op.drop_table(AUDIT)

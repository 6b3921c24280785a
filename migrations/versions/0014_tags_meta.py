"""Tags and metadata of jobs.

``sqlqueue_jobs.tags`` holds a job's tags as a JSON list and ``sqlqueue_jobs.meta`` its
metadata as a JSON object (both NULL for none, as every job existing at the upgrade has);
``sqlqueue_job_tags`` holds one row per tag of a tagged job, the index the job lists
filter by tag through (core/features/tags.py).

A downgrade drops them: the jobs stay, without their tags and metadata.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
TAGS = "sqlqueue_job_tags"
TAG_INDEX = "ix_sqlqueue_job_tags_tag_job_id"


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly: a binary, no-pad collation on MariaDB/MySQL."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def upgrade() -> None:
    # Plain ALTER TABLEs, no batch: on SQLite a batch would copy the jobs table.
    op.add_column(JOBS, sa.Column("tags", sa.Text(), nullable=True))
    op.add_column(JOBS, sa.Column("meta", sa.Text(), nullable=True))
    op.create_table(
        TAGS,
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("tag", exact_string(64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "tag", name="pk_sqlqueue_job_tags"),
        mysql_charset="utf8mb4",  # as every table of the queue, whatever the server's default
    )
    op.create_index(TAG_INDEX, TAGS, ["tag", "job_id"])


def downgrade() -> None:
    op.drop_index(TAG_INDEX, TAGS)
    op.drop_table(TAGS)
    op.drop_column(JOBS, "meta")
    op.drop_column(JOBS, "tags")

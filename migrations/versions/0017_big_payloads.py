"""Big payloads kept outside the row: ``sqlqueue_payloads``.

A job whose payload is larger than ``SQLQUEUE_INLINE_PAYLOAD_LIMIT`` keeps it here, one
row per job keyed by its id, and its own row a small marker (docs/payloads.md). Every
job existing at the upgrade keeps its payload in its row. A downgrade first puts the
payloads kept here back into their jobs' rows, then drops the table: no job loses its
arguments.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
PAYLOADS = "sqlqueue_payloads"
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        PAYLOADS,
        sa.Column("job_id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("payload", LongText, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_sqlqueue_payloads"),
        mysql_charset="utf8mb4",  # as every table of the queue, whatever the server's default
    )


def downgrade() -> None:
    jobs = sa.table(JOBS, sa.column("id", sa.BigInteger()), sa.column("payload", sa.Text()))
    side = sa.table(PAYLOADS, sa.column("job_id", sa.BigInteger()), sa.column("payload", sa.Text()))
    kept = sa.select(side.c.payload).where(side.c.job_id == jobs.c.id).scalar_subquery()
    op.execute(
        sa.update(jobs).where(sa.exists().where(side.c.job_id == jobs.c.id)).values(payload=kept)
    )
    op.drop_table(PAYLOADS)

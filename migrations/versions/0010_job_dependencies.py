"""Job dependencies: the edges of workflows, a flag on each job that has dependents, and
batches.

``sqlqueue_job_dependencies`` holds one row per (dependent job, job it depends on);
``sqlqueue_jobs.has_dependents`` is set on a job once another depends on it, so that a
job without dependents finishes with no look at the new table. Every job existing at the
upgrade has none. Each edge says what the dependent ``require``s of its dependency
(``completed``, ``finished`` or ``failed``). ``sqlqueue_batches`` holds batches with
callbacks, and ``sqlqueue_jobs.batch_id`` the batch of a job (indexed, partially where
the database can: most jobs are in none).

A downgrade cancels the jobs still waiting for dependencies: the schema it returns to has
no way to hold them back, and running them before their dependencies completed would be
worse than not running them (``flask queue retry`` replays them).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import UTC
from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
DEPENDENCIES = "sqlqueue_job_dependencies"
BATCHES = "sqlqueue_batches"
BATCH_INDEX = "ix_sqlqueue_jobs_batch_id"

# Frozen copies of the model types: a migration must not change when the models do.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
DOWNGRADED = (
    "DependencyFailed: cancelled by a schema downgrade to a version without job "
    "dependencies; replay it once its dependencies completed"
)


def upgrade() -> None:
    # Plain ALTER TABLEs, no batch: on SQLite (3.35 or newer, as the queue requires) a
    # batch would copy the jobs table, and lose its claim index's DESC on the way.
    op.add_column(
        JOBS, sa.Column("has_dependents", sa.Boolean(), server_default="0", nullable=False)
    )
    op.create_table(
        DEPENDENCIES,
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("depends_on_id", sa.BigInteger(), nullable=False),
        sa.Column("require", sa.String(16), server_default="completed", nullable=False),
        sa.PrimaryKeyConstraint("job_id", "depends_on_id", name="pk_sqlqueue_job_dependencies"),
        mysql_charset="utf8mb4",  # as every table of the queue, whatever the server's default
    )
    op.create_index("ix_sqlqueue_job_dependencies_depends_on_id", DEPENDENCIES, ["depends_on_id"])
    op.add_column(JOBS, sa.Column("batch_id", sa.BigInteger(), nullable=True))
    in_batch = sa.text("batch_id IS NOT NULL")
    op.create_index(
        BATCH_INDEX, JOBS, ["batch_id"], postgresql_where=in_batch, sqlite_where=in_batch
    )
    op.create_table(
        BATCHES,
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("label", sa.String(255), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("on_success_id", sa.BigInteger(), nullable=True),
        sa.Column("on_failure_id", sa.BigInteger(), nullable=True),
        sa.Column("on_complete_id", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sqlqueue_batches"),
        sqlite_autoincrement=True,  # ids only grow, as the jobs' (core/models.py)
        mysql_charset="utf8mb4",
    )


def downgrade() -> None:
    op.drop_table(BATCHES)
    op.drop_index(BATCH_INDEX, JOBS)
    op.drop_column(JOBS, "batch_id")
    op.drop_index("ix_sqlqueue_job_dependencies_depends_on_id", DEPENDENCIES)
    op.drop_table(DEPENDENCIES)
    now = datetime.now(UTC)
    if op.get_bind().dialect.name != "postgresql":
        now = now.replace(tzinfo=None)  # stored as naive UTC where the database keeps no zone
    table = sa.table(
        JOBS,
        sa.column("status", sa.String()),
        sa.column("last_error", sa.Text()),
        sa.column("finished_at", Timestamp),
        sa.column("updated_at", Timestamp),
    )
    op.execute(
        table.update()
        .where(table.c.status == "waiting")
        .values(status="cancelled", last_error=DOWNGRADED, finished_at=now, updated_at=now)
    )
    op.drop_column(JOBS, "has_dependents")

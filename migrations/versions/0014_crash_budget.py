"""The crash budget and the outcome of effects.

``sqlqueue_jobs.crashes`` counts a job's attempts lost with their worker (a worker that
stopped heartbeating, its job rescued); a job is quarantined (``dead``) once it reaches
``SQLQUEUE_MAX_CRASHES``. Every job existing at the upgrade starts at 0: its earlier
losses are in ``rescues``, which a replay also reset, so none is charged twice.

``sqlqueue_job_effects.done_at`` is when the task marked a reserved effect done
(``current_job.effect()``); every reservation made before the upgrade has none, and is
shown as of unknown outcome, which it is.

Revision ID: 0014_crash_budget
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0014_crash_budget"
down_revision = "0010"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
EFFECTS = "sqlqueue_job_effects"

# A frozen copy of the model type: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # Plain ALTER TABLEs, no batch: on SQLite a batch would copy the jobs table (and
    # lose its claim index's DESC on the way). No index: nothing searches by either.
    op.add_column(JOBS, sa.Column("crashes", sa.Integer(), server_default="0", nullable=False))
    op.add_column(EFFECTS, sa.Column("done_at", Timestamp, nullable=True))


def downgrade() -> None:
    op.drop_column(EFFECTS, "done_at")
    op.drop_column(JOBS, "crashes")

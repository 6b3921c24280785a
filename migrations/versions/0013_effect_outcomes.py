"""The outcome of effects.

(The crash budget needs no column: ``sqlqueue_jobs.rescues`` already counts a job's
attempts lost with their worker since it was enqueued or replayed.)

``sqlqueue_job_effects.done_at`` is when the task marked a reserved effect done
(``current_job.effect()``); every reservation made before the upgrade has none, and is
shown as of unknown outcome, which it is.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

EFFECTS = "sqlqueue_job_effects"

# A frozen copy of the model type: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    # A plain ALTER TABLE, no batch: on SQLite a batch would copy the table. No index:
    # nothing searches by it.
    op.add_column(EFFECTS, sa.Column("done_at", Timestamp, nullable=True))


def downgrade() -> None:
    op.drop_column(EFFECTS, "done_at")

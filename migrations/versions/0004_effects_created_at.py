"""An index for pruning old effect keys (SQLQUEUE_KEEP_EFFECTS) without a full scan.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

EFFECTS = "sqlqueue_job_effects"


def upgrade() -> None:
    op.create_index("ix_sqlqueue_job_effects_created_at", EFFECTS, ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_job_effects_created_at", EFFECTS)

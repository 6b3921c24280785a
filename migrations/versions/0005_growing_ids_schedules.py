"""Job ids that only grow on SQLite, and the periodic schedules' ledger.

SQLite gives an ``INTEGER PRIMARY KEY`` without ``AUTOINCREMENT`` the largest id in the
table plus one, so the id of the newest job, once purged, went to the next job. The jobs
table is rebuilt with ``AUTOINCREMENT``, every row, index and constraint kept (the key
loses its constraint name, which SQLite's AUTOINCREMENT column cannot carry), and its
counter starts past every job id the queue still remembers (effect keys outlive their
jobs). PostgreSQL's sequences and InnoDB's counter never reuse an id: nothing to change
there. The effects table keeps its plain key: its ids are never shown or kept by anyone.
A downgrade returns to a table that gives the largest id out again; upgrading once more
starts past every id still in the jobs or effects table.

``sqlqueue_schedules`` holds each periodic task's newest enqueued slot, seeded here from
the periodic jobs still in the table, so a schedule carries on where it was.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import re
from datetime import UTC
from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JOBS = "sqlqueue_jobs"
EFFECTS = "sqlqueue_job_effects"
SCHEDULES = "sqlqueue_schedules"
CLAIM = "ix_sqlqueue_jobs_claim"

# Frozen copies of the model types: a migration must not change when the models do.
Timestamp = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
PENDING = sa.text("status = 'pending'")
# A periodic job's idempotency key: the prefix, the task (or its hash), the slot in UTC.
PERIODIC_KEYS = "sqlqueue:periodic:%"
SLOT = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\Z")


def exact_string(length: int) -> sa.types.TypeEngine[str]:
    """A string compared exactly: a binary, no-pad collation on MariaDB/MySQL."""
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return sa.String(length)
    mariadb = getattr(bind.dialect, "is_mariadb", False)
    collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
    return mysql.VARCHAR(length, charset="utf8mb4", collation=collation)


def _rebuild_jobs(*, autoincrement: bool) -> None:
    """SQLite: copy the jobs table into one declared with or without AUTOINCREMENT."""
    # Reflection loses the claim index's DESC: it is dropped and made again as it was.
    op.drop_index(CLAIM, JOBS)
    with op.batch_alter_table(
        JOBS, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ):
        pass
    op.create_index(
        CLAIM, JOBS, ["status", sa.text("priority DESC"), "run_at", "id"], sqlite_where=PENDING
    )


def _stamp(moment: datetime) -> datetime:
    # Timestamps are stored as naive UTC where the database keeps no zone.
    return moment if op.get_bind().dialect.name == "postgresql" else moment.replace(tzinfo=None)


def _seed_schedules(schedules: sa.Table) -> None:
    """One ledger row per task with periodic jobs left, at its newest slot (compared in
    Python, not by the database's collation)."""
    bind = op.get_bind()
    newest: dict[str, str] = {}
    rows = bind.execute(
        sa.text(f"SELECT task, idempotency_key FROM {JOBS} WHERE idempotency_key LIKE :keys"),
        {"keys": PERIODIC_KEYS},
    )
    for task, key in rows:
        found = SLOT.search(key)
        if found and found.group(1) > newest.get(task, ""):
            newest[task] = found.group(1)
    now = _stamp(datetime.now(UTC))
    if newest:
        op.bulk_insert(
            schedules,
            [
                {
                    "task": task,
                    "last_slot": _stamp(datetime.strptime(slot, "%Y-%m-%dT%H:%M:%S%z")),
                    "created_at": now,
                    "updated_at": now,
                }
                for task, slot in sorted(newest.items())
            ],
        )


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_jobs(autoincrement=True)
        # Past every id still named anywhere: a purged job's id may live on in an effect.
        op.execute(f"DELETE FROM sqlite_sequence WHERE name = '{JOBS}'")
        op.execute(
            f"INSERT INTO sqlite_sequence (name, seq) SELECT '{JOBS}', max("
            f"(SELECT coalesce(max(id), 0) FROM {JOBS}), "
            f"(SELECT coalesce(max(job_id), 0) FROM {EFFECTS}))"
        )
    schedules = op.create_table(
        SCHEDULES,
        sa.Column("task", exact_string(255), nullable=False),
        sa.Column("last_slot", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("task", name="pk_sqlqueue_schedules"),
        mysql_charset="utf8mb4",  # UTF-8 whatever the server's default
    )
    _seed_schedules(schedules)


def downgrade() -> None:
    op.drop_table(SCHEDULES)
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_jobs(autoincrement=False)

"""The queue's tables: jobs, job effects, workers, queues, limits and schedules.

Every table name starts with ``sqlqueue_`` so it can share a database with the app's own
tables, and the metadata is separate from the app's so the app's migrations never see it.
"""

from __future__ import annotations

import enum
from datetime import UTC
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.orm import Mapped
from sqlalchemy.orm import mapped_column

JOBS_TABLE = "sqlqueue_jobs"
EFFECTS_TABLE = "sqlqueue_job_effects"
WORKERS_TABLE = "sqlqueue_workers"
QUEUES_TABLE = "sqlqueue_queues"
LIMITS_TABLE = "sqlqueue_limits"
SCHEDULES_TABLE = "sqlqueue_schedules"
VERSION_TABLE = "sqlqueue_alembic_version"

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


class JobStatus(enum.StrEnum):
    """Where a job is in its life. Stored as the lowercase value."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp that is always UTC and always timezone-aware in Python.

    SQLite and MariaDB keep no zone, so values are stored as naive UTC there and given
    their zone back on the way out; PostgreSQL stores ``timestamptz``.
    """

    impl = sa.DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(sa.DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware datetime")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# BIGINT keys on the servers; SQLite only auto-increments an INTEGER primary key.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# MariaDB's TEXT stops at 64 KiB, too small for a history of tracebacks.
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
#: Table options for MariaDB/MySQL: UTF-8 whatever the server's default (upstream
#: MariaDB's is latin1, which refuses most of the world's text).
MYSQL_TABLE = {"mysql_charset": "utf8mb4"}


class ExactString(sa.TypeDecorator[str]):
    """A name or key compared character for character, as SQLite and PostgreSQL do.

    MariaDB's and MySQL's default collations ignore case, accents and trailing spaces,
    so ``"Order-1"`` would be the same idempotency key as ``"order-1 "`` and a worker for
    queue ``reports`` would claim jobs of ``Reports``; there it is a binary, no-pad one.
    """

    impl = sa.String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            mariadb = getattr(dialect, "is_mariadb", False)
            collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=collation)
            )
        return dialect.type_descriptor(sa.String(self.length))


class Base(DeclarativeBase):
    metadata = metadata


class JobRow(Base):
    """One job: a call of a registered task, with its arguments and its history."""

    __tablename__ = JOBS_TABLE

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    queue: Mapped[str] = mapped_column(ExactString(100), default="default")
    task: Mapped[str] = mapped_column(ExactString(255))
    #: ``{"args": [...], "kwargs": {...}}`` as JSON text, encoded once by the producer.
    payload: Mapped[str] = mapped_column(LongText)
    #: A :class:`JobStatus` value; plain text so a hand-edited row never breaks loading.
    status: Mapped[str] = mapped_column(sa.String(16), default=JobStatus.PENDING.value)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(sa.Integer)
    #: Times a dead worker's attempt was taken back, counted apart from ordinary failures.
    rescues: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    #: Times a stopping worker handed the job back unfinished (not counted as attempts).
    releases: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    priority: Mapped[int] = mapped_column(sa.Integer, default=0)
    run_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_id: Mapped[str | None] = mapped_column(sa.String(100))
    #: Fresh for every claim; every write that finishes an attempt must present it.
    claim_token: Mapped[str | None] = mapped_column(sa.String(32))
    last_error: Mapped[str | None] = mapped_column(LongText)
    #: JSON list with one record per failed attempt: type, message, traceback, worker, time.
    errors: Mapped[str | None] = mapped_column(LongText)
    #: The task's return value as JSON text.
    result: Mapped[str | None] = mapped_column(LongText)
    idempotency_key: Mapped[str | None] = mapped_column(ExactString(255), unique=True)
    #: Set when cancellation of a running job was asked for; the task may check it.
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The task's own report of how far it got: a fraction in [0, 1] and a short message.
    progress: Mapped[float | None] = mapped_column(sa.Float)
    progress_message: Mapped[str | None] = mapped_column(LongText)
    #: The value a task's ``concurrency_key`` derived from the arguments, for limits.
    concurrency_key: Mapped[str | None] = mapped_column(ExactString(255))

    __table_args__ = (
        # The claim index (pending jobs by priority DESC, run_at, id) is declared below.
        # The stale scan (running jobs by worker) and per-queue counts.
        sa.Index("ix_sqlqueue_jobs_status_worker", "status", "worker_id"),
        sa.Index("ix_sqlqueue_jobs_queue_status", "queue", "status"),
        # Per-task counts and filters; finished_at lets the admin's per-task metrics read
        # a task's latest finished jobs straight from the index.
        sa.Index("ix_sqlqueue_jobs_task_status_finished_at", "task", "status", "finished_at"),
        # The admin's charts count finished jobs, new jobs and started jobs per minute.
        sa.Index("ix_sqlqueue_jobs_status_finished_at", "status", "finished_at"),
        sa.Index("ix_sqlqueue_jobs_created_at", "created_at"),
        sa.Index("ix_sqlqueue_jobs_started_at", "started_at"),
        # Running jobs per limited task and key, counted inside the claim.
        sa.Index(
            "ix_sqlqueue_jobs_task_concurrency_key_status", "task", "concurrency_key", "status"
        ),
        # Ids only grow: an app may keep a job's id, and must never find it naming another
        # job. SQLite's plain INTEGER PRIMARY KEY gives the largest freed id out again;
        # AUTOINCREMENT never does. PostgreSQL's sequence and InnoDB's counter (kept
        # across restarts by every server version the queue accepts) never go back.
        {"sqlite_autoincrement": True, **MYSQL_TABLE},
    )


class JobEffectRow(Base):
    """A side effect reserved by a job: the key exists at most once, ever.

    No foreign key to the jobs table: reservations must outlive the pruning of old jobs,
    or a replay long after would repeat the effect.
    """

    __tablename__ = EFFECTS_TABLE

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(ExactString(255), unique=True)
    job_id: Mapped[int | None] = mapped_column(sa.BigInteger, index=True)
    #: Indexed for pruning old keys (SQLQUEUE_KEEP_EFFECTS).
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)

    __table_args__ = MYSQL_TABLE


class WorkerRow(Base):
    """A running worker process, kept alive by its heartbeat."""

    __tablename__ = WORKERS_TABLE

    id: Mapped[str] = mapped_column(sa.String(100), primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(255))
    pid: Mapped[int] = mapped_column(sa.Integer)
    #: Comma-separated queue names, empty for "every queue".
    queues: Mapped[str] = mapped_column(LongText, default="")
    #: The task names the worker registers, as a JSON list; ``None`` for a worker of a
    #: version that did not record them (taken to run every task).
    tasks: Mapped[str | None] = mapped_column(LongText)
    concurrency: Mapped[int] = mapped_column(sa.Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    #: When the worker stopped (kept a day so the dashboard can show recently gone ones).
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: ``"stopped"`` after a graceful stop, ``"lost"`` when declared dead for silence.
    stop_reason: Mapped[str | None] = mapped_column(sa.String(32))
    #: The boot of the machine the worker runs on, and its boot clock (microseconds
    #: since that boot) at the last heartbeat: a rescuer on the same boot judges the
    #: worker by that clock, which wall-clock steps do not move (core/liveness.py).
    #: ``None`` where the machine has no boot clock.
    boot_id: Mapped[str | None] = mapped_column(sa.String(36))
    boot_clock_us: Mapped[int | None] = mapped_column(sa.BigInteger)
    #: The jobs the worker claimed ahead of its free threads and had not started at its
    #: last heartbeat, as a JSON list of ids (core/worker/dispatch.py); ``None`` before
    #: its first heartbeat, or from a version that did not record them.
    claimed_ahead: Mapped[str | None] = mapped_column(sa.Text)

    __table_args__ = MYSQL_TABLE


class QueueRow(Base):
    """A queue's own settings; a queue without a row is simply active."""

    __tablename__ = QUEUES_TABLE

    name: Mapped[str] = mapped_column(ExactString(100), primary_key=True)
    #: Set while the queue is paused: no worker on any host claims its jobs.
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = MYSQL_TABLE


class LimitRow(Base):
    """One concurrency or rate limit bucket (a task, or a task and key).

    The claim locks the bucket's row, so two workers never both count the same free
    slot; a rate limit keeps the current window's start and its number of starts here.
    """

    __tablename__ = LIMITS_TABLE

    name: Mapped[str] = mapped_column(ExactString(255), primary_key=True)
    window_start: Mapped[datetime | None] = mapped_column(UTCDateTime)
    starts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")

    __table_args__ = MYSQL_TABLE


class ScheduleRow(Base):
    """A periodic schedule's ledger: which of its slots are done, apart from job rows.

    A slot counts as done once it is at most ``last_slot``; the row is locked and moved
    forward in the transaction that writes the slot's job, so a crash never loses or
    doubles a slot, and pruning or purging jobs never brings one back. One row per task,
    never pruned: a schedule's slots only ever move forward, so the newest one is all
    there is to remember, and a row outlives a removed schedule at the cost of a line.
    """

    __tablename__ = SCHEDULES_TABLE

    task: Mapped[str] = mapped_column(ExactString(255), primary_key=True)
    #: The newest slot enqueued; ``None`` until the first.
    last_slot: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: When a scheduler first saw the schedule: no slot before it is ever enqueued.
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = MYSQL_TABLE


jobs: sa.Table = JobRow.__table__  # type: ignore[assignment]
effects: sa.Table = JobEffectRow.__table__  # type: ignore[assignment]
workers: sa.Table = WorkerRow.__table__  # type: ignore[assignment]
queues: sa.Table = QueueRow.__table__  # type: ignore[assignment]
limits: sa.Table = LimitRow.__table__  # type: ignore[assignment]
schedules: sa.Table = ScheduleRow.__table__  # type: ignore[assignment]

# The claim: pending jobs in priority order, then run_at, then id. Declared on the bound
# columns so DESC is a column sort order that Alembic compares with the reflected index;
# a text("priority DESC") expression shows up as a spurious difference on SQLite and MariaDB.
# Partial where the database has partial indexes: finished jobs, most of the table, stay
# out of it, so the claim index stays small however long jobs are kept.
_pending = jobs.c.status == JobStatus.PENDING.value
sa.Index(
    "ix_sqlqueue_jobs_claim",
    jobs.c.status,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    jobs.c.id,
    postgresql_where=_pending,
    sqlite_where=_pending,
)

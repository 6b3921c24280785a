"""The queue's tables: jobs, their dependencies, job effects, workers, queues, limits,
schedules and the audit log.

Every table name starts with ``sqlqueue_`` so it can share a database with the app's own
tables, and the metadata is separate from the app's so the app's migrations never see it.

The tables are SQLAlchemy Core: the queue reads and writes rows, never ORM objects, and a
worker need not load ``sqlalchemy.orm``. Nor does it load the other databases' SQLAlchemy
dialects: the types pick their per-database form when a dialect asks, and the options a
table or index has on one database only (:data:`DIALECT_OPTIONS`) are given to it by
:func:`use_dialect` when the queue first meets that database.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from typing import Any
from typing import TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

JOBS_TABLE = "sqlqueue_jobs"
EFFECTS_TABLE = "sqlqueue_job_effects"
WORKERS_TABLE = "sqlqueue_workers"
QUEUES_TABLE = "sqlqueue_queues"
LIMITS_TABLE = "sqlqueue_limits"
SCHEDULES_TABLE = "sqlqueue_schedules"
DEPENDENCIES_TABLE = "sqlqueue_job_dependencies"
BATCHES_TABLE = "sqlqueue_batches"
AUDIT_TABLE = "sqlqueue_audit_log"
TAGS_TABLE = "sqlqueue_job_tags"
PAYLOADS_TABLE = "sqlqueue_payloads"
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

    #: Enqueued with dependencies that have not all completed (docs/workflows.md).
    WAITING = "waiting"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


#: The statuses a job ends in: it runs no more unless replayed.
FINISHED = (JobStatus.COMPLETED.value, JobStatus.DEAD.value, JobStatus.CANCELLED.value)


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
            from sqlalchemy.dialects import postgresql

            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

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


class LongText(sa.TypeDecorator[str]):
    """Text of any length: MariaDB's TEXT stops at 64 KiB, too small for a history of
    tracebacks, so it is LONGTEXT there."""

    impl = sa.Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            from sqlalchemy.dialects import mysql

            return dialect.type_descriptor(mysql.LONGTEXT())
        return self.impl_instance


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
            from sqlalchemy.dialects import mysql

            mariadb = getattr(dialect, "is_mariadb", False)
            collation = "utf8mb4_nopad_bin" if mariadb else "utf8mb4_0900_bin"
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=collation)
            )
        return dialect.type_descriptor(sa.String(self.length))


def _column(name: str, type_: Any, *, null: bool = False, **options: Any) -> sa.Column[Any]:
    """A column that is NOT NULL unless ``null``, as every table here spells them."""
    return sa.Column(name, type_, nullable=null, **options)


#: One job: a call of a registered task, with its arguments and its history.
jobs = sa.Table(
    JOBS_TABLE,
    metadata,
    _column("id", BigId, primary_key=True, autoincrement=True),
    _column("queue", ExactString(100), default="default"),
    _column("task", ExactString(255)),
    # ``{"args": [...], "kwargs": {...}}`` as JSON text, encoded once by the producer.
    _column("payload", LongText()),
    # A JobStatus value; plain text so a hand-edited row never breaks loading.
    _column("status", sa.String(16), default=JobStatus.PENDING.value),
    _column("attempts", sa.Integer, default=0),
    _column("max_attempts", sa.Integer),
    # Times a lost worker's attempt was taken back, counted apart from ordinary failures.
    _column("rescues", sa.Integer, default=0, server_default="0"),
    # Times a stopping worker handed the job back unfinished (not counted as attempts).
    _column("releases", sa.Integer, default=0, server_default="0"),
    # Of the rescues, those that count as crashes: a lost worker that reports in again
    # (it was paused or starved, not dead) takes its rescue back from this count. A job
    # is quarantined once it reaches SQLQUEUE_MAX_CRASHES.
    _column("crashes", sa.Integer, server_default="0"),
    _column("priority", sa.Integer, default=0),
    _column("run_at", UTCDateTime),
    _column("created_at", UTCDateTime),
    _column("updated_at", UTCDateTime),
    _column("started_at", UTCDateTime, null=True),
    _column("finished_at", UTCDateTime, null=True),
    _column("worker_id", sa.String(100), null=True),
    # Fresh for every claim; every write that finishes an attempt must present it.
    _column("claim_token", sa.String(32), null=True),
    _column("last_error", LongText(), null=True),
    # JSON list with one record per failed attempt: type, message, traceback, worker, time.
    _column("errors", LongText(), null=True),
    # The task's return value as JSON text.
    _column("result", LongText(), null=True),
    _column("idempotency_key", ExactString(255), null=True, unique=True),
    # Set when cancellation of a running job was asked for; the task may check it.
    _column("cancel_requested_at", UTCDateTime, null=True),
    # The task's own report of how far it got: a fraction in [0, 1] and a short message.
    _column("progress", sa.Float, null=True),
    _column("progress_message", LongText(), null=True),
    # The value a task's ``concurrency_key`` derived from the arguments, for limits.
    _column("concurrency_key", ExactString(255), null=True),
    # Set once a job is enqueued that depends on this one (core/features/dependencies.py): a job
    # without it finishes with no dependents to release or cancel, so the completions
    # of a queue without workflows never look at the dependencies table.
    _column("has_dependents", sa.Boolean, server_default="0"),
    # The batch the job is a member or a callback of (core/batches.py); written at
    # enqueue only, so finishing a job never reads it.
    _column("batch_id", sa.BigInteger, null=True),
    # The job's tags as a JSON list, and its metadata as a JSON object (core/features/tags.py);
    # None for none. Read with the job; filtering goes through sqlqueue_job_tags.
    _column("tags", sa.Text, null=True),
    _column("meta", sa.Text, null=True),
    # The job is not run if no attempt started by then (``using(expires=...)``): the
    # worker that claims it later ends it ``cancelled`` (docs/expiry.md). Not indexed:
    # the claim never filters on it.
    _column("expires_at", UTCDateTime, null=True),
    # Times the task asked to run later without spending an attempt (``Snooze``).
    # Server default only: an enqueue's INSERT names no more columns than before.
    _column("snoozes", sa.Integer, server_default="0"),
    # The key of a job enqueued with Unique (core/features/uniqueness.py): at most one job holds
    # it; cleared from a holder that an enqueue finds out of its scope.
    _column("unique_key", ExactString(255), null=True),
    # The unique key an enqueue took from this job while it was out of scope: a replay
    # takes it back, or is refused while another job holds it. Not indexed.
    _column("unique_key_freed", ExactString(255), null=True),
    # The claim index and the partial ones are declared below.
    # Per-queue counts.
    sa.Index("ix_sqlqueue_jobs_queue_status", "queue", "status"),
    # Per-task counts and filters; finished_at lets the admin's per-task metrics read
    # a task's latest finished jobs straight from the index.
    sa.Index("ix_sqlqueue_jobs_task_status_finished_at", "task", "status", "finished_at"),
    # The admin's charts count finished jobs per minute and retention prunes them by
    # age; counts and lists by status read it too, so it keeps every row.
    sa.Index("ix_sqlqueue_jobs_status_finished_at", "status", "finished_at"),
    # The admin's charts count new jobs per minute.
    sa.Index("ix_sqlqueue_jobs_created_at", "created_at"),
)


class JobRow(TypedDict, total=False):
    """Values of :data:`jobs` columns as Python holds them, for the statements that
    build a row's values in steps (a failure's, a rescue's): every key is optional, as a
    guarded UPDATE names only the columns it changes, and as a new job's row
    (``options.job_values``) leaves out the columns of options not set. Values that are
    SQL expressions (``attempts - 1``) do not fit here; those statements keep a plain dict."""

    id: int
    queue: str
    task: str
    payload: str
    status: str
    attempts: int
    max_attempts: int
    rescues: int
    releases: int
    crashes: int
    priority: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    claim_token: str | None
    last_error: str | None
    errors: str | None
    result: str | None
    idempotency_key: str | None
    cancel_requested_at: datetime | None
    progress: float | None
    progress_message: str | None
    concurrency_key: str | None
    has_dependents: bool
    batch_id: int | None
    tags: str | None
    meta: str | None
    expires_at: datetime | None
    snoozes: int
    unique_key: str | None
    unique_key_freed: str | None


#: A side effect reserved by a job: the key exists at most once, ever. No foreign key to
#: the jobs table: reservations must outlive the pruning of old jobs, or a replay long
#: after would repeat the effect.
effects = sa.Table(
    EFFECTS_TABLE,
    metadata,
    _column("id", BigId, primary_key=True, autoincrement=True),
    _column("key", ExactString(255), unique=True),
    _column("job_id", sa.BigInteger, null=True, index=True),
    # Indexed for pruning old keys (SQLQUEUE_KEEP_EFFECTS).
    _column("created_at", UTCDateTime, index=True),
    # When the task marked the effect done (``current_job.effect()``); None while its
    # outcome is unknown: reserved, then the attempt failed or its worker died.
    _column("done_at", UTCDateTime, null=True),
)

#: One edge of a workflow: job ``job_id`` runs once job ``depends_on_id`` completed
#: (core/features/dependencies.py). Written with the dependent job, in its transaction; deleted
#: with it. No foreign keys: a dependency may be purged before its dependent, and counts
#: as completed once gone (only completed jobs can be purged while a dependent waits).
dependencies = sa.Table(
    DEPENDENCIES_TABLE,
    metadata,
    _column("job_id", sa.BigInteger, primary_key=True),
    # Indexed for the dependents of a job that finishes.
    _column("depends_on_id", sa.BigInteger, primary_key=True, index=True),
    # What the dependent needs of it (core/features/dependencies.py, Require): "completed" (to
    # have completed), "finished" (to have ended, whatever the outcome) or "failed" (to
    # have ended, and one of the dependent's "failed" dependencies not to have completed).
    _column("require", sa.String(16), server_default="completed"),
)

#: One tag of one job (core/features/tags.py): the index the job lists filter by tag through,
#: written with a tagged job only (a job without tags adds no row), deleted with it. The
#: job's row keeps its tags too (``sqlqueue_jobs.tags``), so reading a job never joins.
job_tags = sa.Table(
    TAGS_TABLE,
    metadata,
    _column("job_id", sa.BigInteger, primary_key=True),
    _column("tag", ExactString(64), primary_key=True),
    # A tag's jobs newest first, for the lists; the key serves deleting a job's tags.
    sa.Index("ix_sqlqueue_job_tags_tag_job_id", "tag", "job_id"),
)

#: The payload of a job too large to keep in its row (core/features/bigpayloads.py): the row's
#: ``payload`` holds a marker, this its arguments. Written with such a job only,
#: deleted with it; keyed by the job's id (no foreign key, as no table here has one).
payloads = sa.Table(
    PAYLOADS_TABLE,
    metadata,
    _column("job_id", sa.BigInteger, primary_key=True, autoincrement=False),
    _column("payload", LongText()),
)

#: A batch of jobs with callbacks (core/batches.py): its members carry its id in
#: ``sqlqueue_jobs.batch_id``, as do its callbacks, which are named here.
batches = sa.Table(
    BATCHES_TABLE,
    metadata,
    _column("id", BigId, primary_key=True, autoincrement=True),
    _column("label", sa.String(255), null=True),
    # Its members, callbacks not counted.
    _column("size", sa.Integer),
    _column("created_at", UTCDateTime),
    _column("on_success_id", sa.BigInteger, null=True),
    _column("on_failure_id", sa.BigInteger, null=True),
    _column("on_complete_id", sa.BigInteger, null=True),
)

#: A running worker process, kept alive by its heartbeat.
workers = sa.Table(
    WORKERS_TABLE,
    metadata,
    _column("id", sa.String(100), primary_key=True),
    _column("host", sa.String(255)),
    _column("pid", sa.Integer),
    # Comma-separated queue names, empty for "every queue".
    _column("queues", LongText(), default=""),
    # The task names the worker registers, as a JSON list; None for a worker of a
    # version that did not record them (taken to run every task).
    _column("tasks", LongText(), null=True),
    _column("concurrency", sa.Integer),
    _column("started_at", UTCDateTime),
    _column("last_heartbeat_at", UTCDateTime, index=True),
    # When the worker stopped (kept a day so the dashboard can show recently gone ones).
    _column("stopped_at", UTCDateTime, null=True),
    # "stopped" after a graceful stop, "lost" when declared dead for silence.
    _column("stop_reason", sa.String(32), null=True),
    # The boot of the machine the worker runs on, and its boot clock (microseconds since
    # that boot) at the last heartbeat: a rescuer on the same boot judges the worker by
    # that clock, which wall-clock steps do not move (core/liveness.py). None where the
    # machine has no boot clock.
    _column("boot_id", sa.String(36), null=True),
    _column("boot_clock_us", sa.BigInteger, null=True),
    # The jobs the worker claimed ahead of its free threads and had not started at its
    # last heartbeat, as a JSON list of ids (core/worker/dispatch.py); None before its
    # first heartbeat, or from a version that did not record them.
    _column("claimed_ahead", sa.Text, null=True),
)

#: A queue's own settings; a queue without a row is simply active.
queues = sa.Table(
    QUEUES_TABLE,
    metadata,
    _column("name", ExactString(100), primary_key=True),
    # Set while the queue is paused: no worker on any host claims its jobs.
    _column("paused_at", UTCDateTime, null=True),
    _column("updated_at", UTCDateTime),
)

#: One concurrency or rate limit bucket (a task, or a task and key). The claim locks the
#: bucket's row, so two workers never both count the same free slot; a rate limit keeps
#: the current window's start and its number of starts here.
limits = sa.Table(
    LIMITS_TABLE,
    metadata,
    _column("name", ExactString(255), primary_key=True),
    _column("window_start", UTCDateTime, null=True),
    _column("starts", sa.Integer, default=0, server_default="0"),
)

#: A periodic schedule's ledger: which of its slots are done, apart from job rows.
#:
#: A slot counts as done once it is at most ``last_slot``; the row is locked and moved
#: forward in the transaction that writes the slot's job, so a crash never loses or
#: doubles a slot, and pruning or purging jobs never brings one back. One row per task,
#: never pruned: a schedule's slots only ever move forward, so the newest one is all
#: there is to remember, and a row outlives a removed schedule at the cost of a line.
schedules = sa.Table(
    SCHEDULES_TABLE,
    metadata,
    _column("task", ExactString(255), primary_key=True),
    # The newest slot enqueued; None until the first.
    _column("last_slot", UTCDateTime, null=True),
    # When a scheduler first saw the schedule: no slot before it is ever enqueued.
    _column("created_at", UTCDateTime),
    _column("updated_at", UTCDateTime),
    # Off: no scheduler enqueues its slots (set by `flask queue schedules disable`).
    _column("enabled", sa.Boolean, default=True, server_default="1"),
    # When ``enabled`` last changed; once enabled again, no slot up to it is enqueued,
    # so the slots missed while it was off never come as a burst.
    _column("toggled_at", UTCDateTime, null=True),
)

#: What people did to jobs and queues through the admin or the CLI (core/features/audit.py): one
#: row per job an action changed, or one for an action on no single job. No foreign key:
#: the entry about a deleted job outlives it. Written in the action's transaction, never
#: by enqueueing or working, so the hot paths never touch it.
audit_log = sa.Table(
    AUDIT_TABLE,
    metadata,
    _column("id", BigId, primary_key=True, autoincrement=True),
    # Indexed for pruning old entries (flask queue purge-audit).
    _column("at", UTCDateTime, index=True),
    _column("actor", sa.String(255)),
    _column("action", sa.String(32)),
    # Indexed for a job's own history on its admin page.
    _column("job_id", sa.BigInteger, null=True, index=True),
    # What was done, as JSON text: the changed values, counts, filters.
    _column("detail", LongText(), null=True),
)

# The claim: pending jobs in priority order, then run_at, then id. Declared on the bound
# columns so DESC is a column sort order that Alembic compares with the reflected index;
# a text("priority DESC") expression shows up as a spurious difference on SQLite and MariaDB.
# Partial where the database has partial indexes (DIALECT_OPTIONS): finished jobs, most
# of the table, stay out of it, so the claim index stays small however long jobs are kept.
claim_index = sa.Index(
    "ix_sqlqueue_jobs_claim", jobs.c.status, jobs.c.priority.desc(), jobs.c.run_at, jobs.c.id
)
_pending = jobs.c.status == JobStatus.PENDING.value
# The jobs of batches: partial where the database has partial indexes, so that the jobs
# of no batch (most, or all) stay out of it.
batch_index = sa.Index("ix_sqlqueue_jobs_batch_id", jobs.c.batch_id)
_in_batch = jobs.c.batch_id.isnot(None)
# The unique keys: partial where the database has partial indexes, so that an enqueue
# without one writes nothing to it. (MariaDB keeps every row; NULLs never collide.)
unique_index = sa.Index("uq_sqlqueue_jobs_unique_key", jobs.c.unique_key, unique=True)

# Indexes that every query using them narrows to a subset of the rows: running jobs, or
# jobs that started. Partial where the database has partial indexes (DIALECT_OPTIONS),
# so a write leaves them alone unless its row is in that subset: an enqueue writes none
# of them, and an update on PostgreSQL adds no entry to them unless its row is in.
#: The stale scan and the admin's running jobs: running jobs by worker.
running_index = sa.Index("ix_sqlqueue_jobs_status_worker", jobs.c.status, jobs.c.worker_id)
#: Running jobs per limited task and key, counted inside the claim.
limits_index = sa.Index(
    "ix_sqlqueue_jobs_task_concurrency_key_status",
    jobs.c.task,
    jobs.c.concurrency_key,
    jobs.c.status,
)
#: The admin's charts count started jobs per minute.
started_index = sa.Index("ix_sqlqueue_jobs_started_at", jobs.c.started_at)
_running = jobs.c.status == JobStatus.RUNNING.value
_partial: list[tuple[sa.Index, Any]] = [
    (claim_index, _pending),
    (running_index, _running),
    (limits_index, _running),
    (started_index, jobs.c.started_at.is_not(None)),
    (batch_index, _in_batch),
    (unique_index, jobs.c.unique_key.is_not(None)),
]

#: Options a table or index has on one database only, by dialect name. Given at
#: construction (``postgresql_where=...``) they would load that database's SQLAlchemy
#: dialect to check them, on every database: :func:`use_dialect` gives them when the
#: queue first meets the database, which has loaded its dialect by then.
DIALECT_OPTIONS: dict[str, Callable[[], list[tuple[sa.Table | sa.Index, dict[str, Any]]]]] = {
    "sqlite": lambda: [
        # Ids only grow: an app may keep a job's id, and must never find it naming
        # another job. SQLite's plain INTEGER PRIMARY KEY gives the largest freed id out
        # again; AUTOINCREMENT never does. PostgreSQL's sequence and InnoDB's counter
        # (kept across restarts by every server version the queue accepts) never go back.
        (jobs, {"autoincrement": True}),
        (batches, {"autoincrement": True}),
        (audit_log, {"autoincrement": True}),
        *((index, {"where": where}) for index, where in _partial),
    ],
    "postgresql": lambda: [(index, {"where": where}) for index, where in _partial],
    # UTF-8 whatever the server's default (upstream MariaDB's is latin1, which refuses
    # most of the world's text). MariaDB's dialect reads the mysql options.
    "mysql": lambda: [(table, {"charset": "utf8mb4"}) for table in metadata.tables.values()],
}
_used: set[str] = set()
_using = threading.Lock()


def use_dialect(name: str) -> None:
    """Give the tables and indexes their options for the database dialect ``name``
    (``"mariadb"`` counts as ``"mysql"``); once per dialect, before its first DDL."""
    name = "mysql" if name == "mariadb" else name
    with _using:
        if name in _used:
            return
        for item, options in DIALECT_OPTIONS.get(name, list)():
            for key, value in options.items():
                item.dialect_options[name][key] = value
        _used.add(name)

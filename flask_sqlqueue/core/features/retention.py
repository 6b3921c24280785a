"""Retention: workers delete old finished jobs, and optionally old effect keys.

Each batch is its own short write transaction (on SQLite one ``BEGIN IMMEDIATE``) that
reads at most ``batch`` ids through an index and deletes exactly those, re-checking
their status and age: a job replayed in between is not deleted. Claims wait at most one
batch, never a whole purge.

Effect keys outlive their jobs: a key is pruned only once it is older than
``keep_effects`` *and* its job no longer exists, so a replayed or re-enqueued job can
never repeat an effect whose job is still around.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ...config import Settings
from ..models import JobStatus
from ..models import dependencies
from ..models import effects
from ..models import job_tags
from ..models import jobs
from ..models import payloads

#: Rows deleted per transaction.
BATCH = 500
#: Batches per pruning round: a round stops here and the next one carries on.
MAX_BATCHES = 20


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long finished jobs and effect keys are kept, in seconds (``None``: forever)."""

    keep_completed: float | None = 7 * 86400.0
    keep_dead: float | None = 30 * 86400.0
    keep_effects: float | None = None
    batch: int = BATCH
    max_batches: int = MAX_BATCHES

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        return cls(settings.keep_completed, settings.keep_dead, settings.keep_effects)

    @property
    def prunes_anything(self) -> bool:
        return any(k is not None for k in (self.keep_completed, self.keep_dead, self.keep_effects))


@dataclass(slots=True)
class Pruned:
    """What one pruning round deleted."""

    completed: int = 0
    cancelled: int = 0
    dead: int = 0
    effects: int = 0
    #: The round stopped at its batch limit: more rows are due.
    more: bool = False

    @property
    def total(self) -> int:
        return self.completed + self.cancelled + self.dead + self.effects


def prune_jobs_batch(conn: Connection, status: str, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` jobs of ``status`` that finished before ``before``, their
    tags, and what they waited for (a dependent still waiting counts a pruned dependency
    completed: core/features/dependencies.py)."""
    old = sa.and_(jobs.c.status == status, jobs.c.finished_at < before)
    ids = list(conn.execute(sa.select(jobs.c.id).where(old).limit(limit)).scalars())
    if not ids:
        return 0
    deleted = int(conn.execute(sa.delete(jobs).where(jobs.c.id.in_(ids), old)).rowcount)
    forget_deleted(conn, ids)
    return deleted


#: The tables whose rows belong to one job by its ``job_id``, deleted with it: the
#: edges of what it waited for (an edge naming it as a dependency stays with its
#: dependent: a dependency that is gone counts as completed), its tag rows, and its
#: payload kept outside the row.
_BELONGING = (dependencies, job_tags, payloads)
#: Job ids per DELETE, well within every database's limit on bound parameters.
_IDS_PER_STATEMENT = 1_000


def forget_deleted(conn: Connection, job_ids: Collection[int] | None = None) -> None:
    """Delete the rows that belong to those of ``job_ids`` that are gone (deleted or
    purged in this transaction); to every job that is gone with ``None``."""
    ids = None if job_ids is None else sorted(job_ids)
    for table in _BELONGING:
        gone = ~sa.exists().where(jobs.c.id == table.c.job_id)
        if ids is None:
            conn.execute(sa.delete(table).where(gone))
            continue
        for start in range(0, len(ids), _IDS_PER_STATEMENT):
            chunk = ids[start : start + _IDS_PER_STATEMENT]
            conn.execute(sa.delete(table).where(table.c.job_id.in_(chunk), gone))


def prune_effects_batch(conn: Connection, before: datetime, limit: int) -> int:
    """Delete up to ``limit`` effect keys reserved before ``before`` whose job is gone."""
    job_exists = sa.exists().where(jobs.c.id == effects.c.job_id)
    old = sa.and_(effects.c.created_at < before, sa.not_(job_exists))
    ids = list(conn.execute(sa.select(effects.c.id).where(old).limit(limit)).scalars())
    if not ids:
        return 0
    return int(conn.execute(sa.delete(effects).where(effects.c.id.in_(ids), old)).rowcount)


def prune(
    run_write: Callable[[Callable[[Connection], int]], int],
    policy: RetentionPolicy,
    now: datetime,
) -> Pruned:
    """One pruning round: batches of at most ``policy.batch`` rows, each in its own
    transaction through ``run_write``, at most ``policy.max_batches`` in all."""
    done = Pruned()
    plan: list[tuple[str, float | None]] = [
        (JobStatus.COMPLETED.value, policy.keep_completed),
        (JobStatus.CANCELLED.value, policy.keep_completed),
        (JobStatus.DEAD.value, policy.keep_dead),
        ("effects", policy.keep_effects),
    ]
    batches = 0
    for what, keep in plan:
        if keep is None:
            continue
        before = now - timedelta(seconds=keep)
        while True:
            if batches >= policy.max_batches:
                done.more = True
                return done
            batches += 1
            n = run_write(_batch(what, before, policy.batch))
            setattr(done, what, getattr(done, what) + n)
            if n < policy.batch:
                break
    return done


def _batch(what: str, before: datetime, limit: int) -> Callable[[Connection], int]:
    if what == "effects":
        return lambda conn: prune_effects_batch(conn, before, limit)
    return lambda conn: prune_jobs_batch(conn, what, before, limit)


def describe(policy: RetentionPolicy) -> str:
    """``"completed and cancelled 7d, dead 30d, effect keys forever"``."""

    def age(seconds: float | None) -> str:
        if seconds is None:
            return "forever"
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size and seconds % size == 0:
                return f"{int(seconds // size)}{unit}"
        return f"{seconds:g}s"

    return (
        f"completed and cancelled {age(policy.keep_completed)}, dead {age(policy.keep_dead)}, "
        f"effect keys {age(policy.keep_effects)}"
        + (" (once their job is gone)" if policy.keep_effects is not None else "")
    )


__all__ = ["Pruned", "RetentionPolicy", "describe", "forget_deleted", "prune"]

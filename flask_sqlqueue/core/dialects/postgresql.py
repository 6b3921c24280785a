"""PostgreSQL: row locks with ``FOR UPDATE SKIP LOCKED``.

The inner SELECT locks the candidate rows and skips rows another worker has locked, so
concurrent claimers take disjoint sets without waiting; the outer UPDATE re-checks
``status = 'pending'`` because at READ COMMITTED a row may have changed between the
snapshot and the lock.
"""

from __future__ import annotations

from sqlalchemy.dialects.postgresql import insert as pg_insert

from .base import DialectOps


class PostgresOps(DialectOps):
    name = "postgresql"
    insert = staticmethod(pg_insert)
    skip_locked = True

"""The audit log: who did what to which job, and when, through the admin or the CLI.

An action that changes jobs or queues (:mod:`.operations`) is given an :class:`Audit`
naming the actor, and writes its entries with :meth:`Audit.record` in its own
transaction: the entry exists if and only if the change does. Enqueueing and working
never write here, so the hot paths do not pay for it. Entries are kept until pruned
(:func:`prune`, ``flask queue purge-audit``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..models import audit_log

#: The longest actor name stored; a longer one is cut.
MAX_ACTOR = 255


@dataclass(frozen=True, slots=True)
class Audit:
    """Who is acting: the admin's ``actor()``, or the command line's user."""

    actor: str

    def __post_init__(self) -> None:
        # An actor comes from the app's callable or the environment: store what can be.
        name = str(self.actor).replace("\x00", "").strip() or "unknown"
        object.__setattr__(self, "actor", name[:MAX_ACTOR])

    def record(
        self,
        conn: Connection,
        now: datetime,
        action: str,
        job_ids: Iterable[int] | None = None,
        detail: Mapping[str, Any] | None = None,
        *,
        each: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> None:
        """Write one entry per job of ``job_ids`` (none if it is empty), or one entry
        without a job if it is ``None``, in the caller's transaction.

        :param detail: what to say of the action, the same for every entry.
        :param each: what to say of each job, added to ``detail``.
        """

        def text(job_id: int | None) -> str | None:
            value = {**(detail or {}), **((each or {}).get(job_id, {}) if job_id else {})}
            return json.dumps(value, ensure_ascii=False, default=str) if value else None

        targets: list[int | None] = [None] if job_ids is None else [*job_ids]
        if not targets:
            return
        rows = [
            {"at": now, "actor": self.actor, "action": action, "job_id": i, "detail": text(i)}
            for i in targets
        ]
        conn.execute(sa.insert(audit_log), rows)


@dataclass(frozen=True, slots=True)
class Entry:
    """One audit entry as read."""

    id: int
    at: datetime
    actor: str
    action: str
    job_id: int | None
    #: The detail decoded from its JSON (the text itself if it does not decode).
    detail: Any

    @classmethod
    def from_row(cls, row: Any) -> Entry:
        detail: Any = row.detail
        if detail is not None:
            try:
                detail = json.loads(detail)
            except ValueError:
                pass
        return cls(row.id, row.at, row.actor, row.action, row.job_id, detail)

    def describe(self) -> str:
        """The detail on one line (``key=value, ...``), for the CLI and the admin."""
        if isinstance(self.detail, dict):
            return ", ".join(
                f"{key}={json.dumps(value, ensure_ascii=False)}"
                for key, value in self.detail.items()
            )
        return "" if self.detail is None else str(self.detail)


def recent(
    conn: Connection, *, limit: int, before_id: int | None = None, job_id: int | None = None
) -> list[Entry]:
    """The newest ``limit`` entries (of ``job_id``, if given), older than ``before_id``
    if given, newest first."""
    query = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(audit_log.c.id < before_id)
    if job_id is not None:
        query = query.where(audit_log.c.job_id == job_id)
    return [Entry.from_row(row) for row in conn.execute(query)]


def prune(conn: Connection, before: datetime) -> int:
    """Delete the entries written before ``before``; returns how many."""
    return conn.execute(sa.delete(audit_log).where(audit_log.c.at < before)).rowcount

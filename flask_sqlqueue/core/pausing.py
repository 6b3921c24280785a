"""Pausing and resuming queues.

A paused queue has a row in ``sqlqueue_queues`` with ``paused_at`` set. Every claim
filters paused queues inside its own statement (see ``claim.py``), so a pause
holds for every claim that starts after it commits, on every host; jobs already
running finish as usual. A queue without a row is simply active.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..exceptions import UnknownQueue
from .distinct import distinct_values
from .features.audit import Audit
from .models import jobs
from .models import queues
from .options import check_options
from .store import Store


def known_queues(conn: Connection, declared: Iterable[str]) -> set[str]:
    """Queue names worth pausing: ``declared`` (the registered tasks' queues), every
    queue that has a job, and every queue that has a row (paused before)."""
    names = conn.execute(sa.select(queues.c.name)).scalars()
    return {*declared, *distinct_values(conn, "queue"), *names}


def check_queue(conn: Connection, name: str, declared: Iterable[str]) -> str:
    """``name`` if it is a valid, known queue name; else a clear error."""
    check_options(queue=name)
    if name in set(declared):
        return name
    has_row = conn.execute(sa.select(queues.c.name).where(queues.c.name == name)).first()
    has_job = conn.execute(sa.select(jobs.c.id).where(jobs.c.queue == name).limit(1)).first()
    if has_row is None and has_job is None:
        raise UnknownQueue(name, sorted(known_queues(conn, declared)))
    return name


def pause(conn: Connection, name: str, now: datetime) -> bool:
    """Pause ``name``; ``False`` if it was paused already (its ``paused_at`` is kept)."""
    updated = conn.execute(
        sa.update(queues)
        .where(queues.c.name == name, queues.c.paused_at.is_(None))
        .values(paused_at=now, updated_at=now)
    ).rowcount
    if updated:
        return True
    if conn.execute(sa.select(queues.c.name).where(queues.c.name == name)).first() is not None:
        return False  # paused already
    try:
        # A savepoint: a pause racing ours may insert the row first.
        with conn.begin_nested():
            conn.execute(sa.insert(queues).values(name=name, paused_at=now, updated_at=now))
    except sa.exc.IntegrityError:
        return False
    return True


def resume(conn: Connection, name: str, now: datetime) -> bool:
    """Resume ``name``; ``False`` if it was not paused."""
    return bool(
        conn.execute(
            sa.update(queues)
            .where(queues.c.name == name, queues.c.paused_at.is_not(None))
            .values(paused_at=None, updated_at=now)
        ).rowcount
    )


def paused_queues(conn: Connection) -> dict[str, datetime]:
    """Every paused queue with the time it was paused."""
    rows = conn.execute(
        sa.select(queues.c.name, queues.c.paused_at)
        .where(queues.c.paused_at.is_not(None))
        .order_by(queues.c.name)
    )
    return {name: paused_at for name, paused_at in rows}


def set_paused(
    store: Store,
    names: Sequence[str],
    *,
    paused: bool,
    declared: Iterable[str],
    audit: Audit | None = None,
) -> list[str]:
    """Pause (or resume) every queue in ``names`` in one transaction; return those whose
    state changed. All or nothing: one bad or unknown name raises and changes nothing.

    A resume wakes idle workers (NOTIFY on PostgreSQL, same-host wake-ups on SQLite);
    elsewhere they find the jobs at their next poll.
    """
    declared = set(declared)
    for name in names:
        check_options(queue=name)
    now = store.now()

    def write(conn: Connection) -> list[str]:
        for name in names:
            check_queue(conn, name, declared)
        change = pause if paused else resume
        changed = [name for name in dict.fromkeys(names) if change(conn, name, now)]
        if changed and not paused:
            store.ops.notify(conn)
        if audit is not None:
            for name in changed:
                audit.record(conn, now, "pause" if paused else "resume", detail={"queue": name})
        return changed

    changed = store.run_write(write)
    if changed and not paused:
        store.wake()
    return changed

"""``flask queue doctor``: one look at everything that makes a queue unsafe or slow."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import sqlalchemy as sa

from . import schema
from .core import queries
from .core import roster
from .core.diagnosis import FAIL as FAIL
from .core.diagnosis import OK as OK
from .core.diagnosis import WARN as WARN
from .core.diagnosis import Finding as Finding
from .core.models import JobStatus
from .core.models import jobs
from .core.store import Store
from .exceptions import SQLQueueError

#: Skew between this host and the database beyond which timing gets visibly off.
SKEW_WARNING = timedelta(seconds=1)


def diagnose(store: Store, registered: Iterable[str]) -> list[Finding]:
    """Check the database the queue runs on; stop early where later checks cannot run."""
    findings: list[Finding] = []
    engine = store.engine
    try:
        with store.read() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        return [Finding(FAIL, f"cannot connect to {engine.url!r}: {reason}", "check the URL")]
    findings.append(Finding(OK, f"connected to {engine.url!r}"))

    try:
        schema.check(store.read_engine)
        findings.append(Finding(OK, f"schema at revision {schema.head()} (head)"))
    except SQLQueueError as exc:
        return [*findings, Finding(FAIL, str(exc), "flask queue db upgrade")]

    with store.read() as conn:
        findings += store.ops.diagnose(conn)
    if store.ops.clock_query is not None:  # a server, with a clock of its own
        findings.append(_clock_skew(store))
    findings += _workers_and_jobs(store, set(registered))
    return findings


def _clock_skew(store: Store) -> Finding:
    skew = store.sync_clock()
    text = (
        f"this host's clock is {abs(skew.total_seconds()):.3f}s "
        + ("behind" if skew > timedelta(0) else "ahead of")
        + " the database's"
    )
    if abs(skew) > SKEW_WARNING:
        return Finding(WARN, text, "run NTP on every host; the queue uses the database's clock")
    return Finding(OK, text)


def _workers_and_jobs(store: Store, registered: set[str]) -> list[Finding]:
    found = []
    fresh = roster.heartbeat_fresh(store, store.settings.stale_after)
    with store.read() as conn:
        rows = queries.live_workers(conn, fresh)
        running = conn.execute(
            sa.select(sa.func.count()).where(jobs.c.status == JobStatus.RUNNING.value)
        ).scalar_one()
        dead = conn.execute(
            sa.select(sa.func.count()).where(jobs.c.status == JobStatus.DEAD.value)
        ).scalar_one()
        cover = queries.coverage(conn, fresh)
    stale = [row.id for row in rows if not row.fresh]
    live = len(rows) - len(stale)
    found.append(Finding(OK, f"{live} live worker(s), {running} job(s) running"))
    if stale:
        found.append(
            Finding(
                WARN,
                f"{len(stale)} worker(s) stopped heartbeating: {', '.join(stale)}",
                "flask queue rescue (live workers also do it on their own)",
            )
        )
    found += [Finding(WARN, what, fix) for what, fix in cover.warnings(registered)]
    if dead:
        found.append(
            Finding(
                WARN,
                f"{dead} dead job(s)",
                "flask queue list --status dead; flask queue retry --dead",
            )
        )
    return found

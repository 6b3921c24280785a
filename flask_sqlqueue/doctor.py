"""``flask queue doctor``: one look at everything that makes a queue unsafe or slow."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from . import schema
from .core import queries
from .core.models import JobStatus
from .core.models import jobs
from .core.store import Store
from .exceptions import SQLQueueError

OK, WARN, FAIL = "ok", "warn", "FAIL"

#: Skew between this host and the database beyond which timing gets visibly off.
SKEW_WARNING = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Finding:
    level: str
    message: str
    fix: str = ""


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

    if engine.dialect.name == "sqlite":
        findings += _sqlite(store)
    else:
        findings += _server(store)
    findings += _workers_and_jobs(store, set(registered))
    return findings


def _sqlite(store: Store) -> list[Finding]:
    found = [Finding(OK, f"SQLite {sqlite3.sqlite_version}")]
    with store.read() as conn:
        journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
        synchronous = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
    if str(journal).lower() == "wal":
        found.append(Finding(OK, "journal_mode=wal"))
    else:
        found.append(
            Finding(
                FAIL,
                f"journal_mode={journal}",
                "the queue sets WAL itself; is the file "
                "on a filesystem without shared memory (NFS, SMB)?",
            )
        )
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    level = names.get(int(synchronous), str(synchronous))
    if int(synchronous) >= 2:
        found.append(Finding(OK, f"synchronous={level}: a committed job survives power loss"))
    else:
        found.append(
            Finding(
                WARN,
                f"synchronous={level}: the last commits may be lost on power loss",
                "SQLQUEUE_SQLITE_SYNCHRONOUS = 'FULL'",
            )
        )
    if int(busy) > 0:
        found.append(Finding(OK, f"busy_timeout={busy} ms"))
    else:
        found.append(
            Finding(
                FAIL,
                "busy_timeout=0: writers fail at once when another holds the lock",
                "SQLQUEUE_SQLITE_BUSY_TIMEOUT = 30",
            )
        )
    return found


def _server(store: Store) -> list[Finding]:
    found = []
    version = ".".join(map(str, store.engine.dialect.server_version_info or ()))
    try:
        store.check_server()
        found.append(Finding(OK, f"{store.engine.dialect.name} {version} with SKIP LOCKED"))
    except SQLQueueError as exc:
        found.append(Finding(FAIL, str(exc), "upgrade the database server"))
    skew = store.sync_clock()
    text = (
        f"this host's clock is {abs(skew.total_seconds()):.3f}s "
        + ("behind" if skew > timedelta(0) else "ahead of")
        + " the database's"
    )
    if abs(skew) > SKEW_WARNING:
        found.append(
            Finding(WARN, text, "run NTP on every host; the queue uses the database's clock")
        )
    else:
        found.append(Finding(OK, text))
    return found


def _workers_and_jobs(store: Store, registered: set[str]) -> list[Finding]:
    found = []
    fresh = store.heartbeat_fresh(store.settings.stale_after)
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

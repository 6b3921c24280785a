"""Big payloads kept outside the row (docs/payloads.md).

A job whose payload (its arguments as JSON) takes more than
``SQLQUEUE_INLINE_PAYLOAD_LIMIT`` bytes keeps it in ``sqlqueue_payloads``, one row keyed
by the job's id, and its own row holds :data:`~.payload.OUTSIDE` instead: the jobs
table, which every claim and list reads, stays small. Every reader gets the real
payload back: the claim, :func:`full` for rows read whole.

A job whose payload fits writes and reads exactly what it did before: the same row,
the same statements, no side row, and no extra read (a claim reads the side table only
when a row it took holds the marker). Every statement that deletes jobs deletes their
side rows in its transaction (:func:`forget`).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..models import JobRow
from ..models import payloads
from ..payload import OUTSIDE

R = TypeVar("R")
#: A new job's row, or the values an edit writes (core/operations.py).
Row = TypeVar("Row", JobRow, dict[str, Any])


def oversize(payload: str, limit: int) -> bool:
    """Whether ``payload`` takes more than ``limit`` bytes in UTF-8 (measured only when
    its length leaves a doubt: a character takes 1 to 4 bytes)."""
    length = len(payload)
    if length > limit:
        return True
    if length * 4 <= limit:
        return False
    return len(payload.encode("utf-8")) > limit


def row_values(values: Row, limit: int) -> Row:
    """The values to write for a job with ``values``: themselves, or with a payload
    over ``limit`` replaced by the marker (then :func:`keep` writes it)."""
    if oversize(values["payload"], limit):
        return {**values, "payload": OUTSIDE}
    return values


def keep(conn: Connection, made: Iterable[tuple[int, str]], limit: int) -> None:
    """Write the side rows of new jobs, given as ``(job id, payload)``: those whose
    payload is over ``limit`` (their rows hold the marker). One statement, or none."""
    rows = [{"job_id": job_id, "payload": p} for job_id, p in made if oversize(p, limit)]
    if rows:
        conn.execute(sa.insert(payloads), rows)


def rewrite(conn: Connection, job_id: int, payload: str, limit: int) -> None:
    """After an UPDATE gave ``job_id`` the row values of ``payload``
    (:func:`row_values`), in this transaction: keep it outside if it is over ``limit``,
    and drop the one the job kept there before.

    The DELETE runs whatever the row held when read: a producer replacing the same job
    may have moved its payload outside since, and the UPDATE, which holds the row's
    lock from then on, is what orders the two."""
    conn.execute(sa.delete(payloads).where(payloads.c.job_id == job_id))
    keep(conn, [(job_id, payload)], limit)


def full(conn: Connection, rows: Sequence[R]) -> list[R]:
    """``rows`` of ``sqlqueue_jobs`` (read by attribute, with ``id`` and ``payload``),
    those holding the marker given their real payload: one SELECT, only if any does.

    A marker whose side row is missing (deleted by hand) stays: reading it reports a
    malformed payload (:func:`~.payload.decode_call`), never an empty call."""
    outside = [row.id for row in rows if row.payload == OUTSIDE]  # type: ignore[attr-defined]
    if not outside:
        return rows if isinstance(rows, list) else list(rows)
    found = {
        job_id: payload
        for job_id, payload in conn.execute(
            sa.select(payloads.c.job_id, payloads.c.payload).where(payloads.c.job_id.in_(outside))
        )
    }
    return [_with_payload(row, found) for row in rows]


def full_row(conn: Connection, row: R) -> R:
    """:func:`full` for one row."""
    return full(conn, [row])[0]


def _with_payload(row: Any, found: dict[int, str]) -> Any:
    payload = found.get(row.id)
    if payload is None or row.payload != OUTSIDE:
        return row
    # A copy read by attribute, as the row is (Job.from_row, the worker's attempt).
    return SimpleNamespace(**{**row._asdict(), "payload": payload})

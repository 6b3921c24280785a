"""Every value of an indexed column, at the cost of one index seek per value.

The queue and task names the CLI, the admin's filters, pausing and the checks for
unserved jobs list: a loose index scan, so a table of millions of jobs with a few
dozen names costs a few dozen seeks, not a scan.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .models import jobs

#: Distinct values listed at most (a runaway producer could invent a name per job).
MAX_DISTINCT = 1000


def distinct_values(conn: Connection, column: str, limit: int = MAX_DISTINCT) -> list[str]:
    """Every value of the indexed ``jobs`` column ``column`` (``"queue"`` or ``"task"``),
    sorted: one index seek per value (a loose index scan as a recursive CTE), so the
    cost follows the number of values, not the number of jobs."""
    col = jobs.c[column]
    first = sa.select(sa.func.min(col).label("value"), sa.literal(1).label("n"))
    found = first.cte("sqlqueue_distinct", recursive=True)
    following = (
        sa.select(sa.func.min(col)).where(col > found.c.value).scalar_subquery().label("value")
    )
    found = found.union_all(
        sa.select(following, (found.c.n + 1).label("n")).where(
            found.c.value.is_not(None), found.c.n < limit
        )
    )
    values = conn.execute(sa.select(found.c.value).where(found.c.value.is_not(None))).scalars()
    return sorted(values)

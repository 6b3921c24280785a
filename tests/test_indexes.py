"""The partial indexes serve the statements they were made for, as the queue sends them.

On PostgreSQL and SQLite the indexes of running jobs and of start times keep only those
rows (core/models.py). A planner takes a partial index only where it can prove the
statement's rows are all in it, and the queue binds its values as parameters: each
statement is captured as the real function sends it and explained with the same
parameters. PostgreSQL is told to avoid sequential scans, so what is checked is that the
index can serve, not what the statistics of a small table favour.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from flask_sqlqueue.core import charts
from flask_sqlqueue.core import queries
from flask_sqlqueue.core import roster
from flask_sqlqueue.core.features.limits import TaskLimits
from flask_sqlqueue.core.features.limits import running_counts
from flask_sqlqueue.core.models import utcnow
from tests import sample_app
from tests.stores import store_of


@contextmanager
def _sent(conn: sa.Connection) -> Iterator[list[tuple[str, Any]]]:
    """The SELECTs on the jobs table sent through ``conn`` meanwhile, with parameters."""
    sent: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            sent.append((statement, parameters))

    sa.event.listen(conn, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(conn, "before_cursor_execute", record)


def _plans(conn: sa.Connection, sent: list[tuple[str, Any]]) -> list[str]:
    explain = "EXPLAIN QUERY PLAN " if conn.dialect.name == "sqlite" else "EXPLAIN "
    return [
        "\n".join(str(row[-1]) for row in conn.exec_driver_sql(explain + sql, params))
        for sql, params in sent
    ]


# Either index of running jobs serves a statement that reads every running job.
RUNNING = ("ix_sqlqueue_jobs_status_worker", "ix_sqlqueue_jobs_task_concurrency_key_status")
STATEMENTS: dict[str, tuple[Callable[[sa.Connection], object], tuple[str, ...]]] = {
    "the stale scan": (
        lambda conn: roster.rescue_stale(conn, utcnow() - timedelta(days=1), utcnow()),
        RUNNING,
    ),
    "the admin's running jobs": (queries.running_jobs, RUNNING),
    "running jobs per limit": (
        lambda conn: running_counts(
            conn, [("tests.sample_app.add", None)], {"tests.sample_app.add": TaskLimits(2)}
        ),
        ("ix_sqlqueue_jobs_task_concurrency_key_status",),
    ),
    "the charts": (lambda conn: charts.activity(conn, utcnow()), ("ix_sqlqueue_jobs_started_at",)),
}


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_statements_read_the_partial_index_made_for_them(
    make_app: Any, backend: str, name: str
) -> None:
    if backend == "mysql":
        pytest.skip("MariaDB has no partial indexes: its indexes keep every row")
    app = make_app()
    with app.app_context():
        sample_app.add.enqueue_many([([i, i], {}) for i in range(50)])
    call, indexes = STATEMENTS[name]
    with store_of(app).write() as conn:
        if backend == "postgresql":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        with _sent(conn) as sent:
            call(conn)
        plans = _plans(conn, sent)
    assert any(index in plan for plan in plans for index in indexes), "\n\n".join(plans)

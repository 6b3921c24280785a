"""``flask queue doctor`` finds what makes a queue unsafe, and says how to fix it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from flask_sqlqueue.core.models import workers
from tests import sample_app


def _doctor(app: Any) -> Any:
    return app.test_cli_runner().invoke(args=["queue", "doctor"])


def test_a_healthy_queue_passes(make_app: Any) -> None:
    app = make_app()
    result = _doctor(app)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(line.startswith(("ok ", "warn", "      fix")) for line in lines), lines
    assert any("(head)" in line for line in lines)
    if app.extensions["sqlqueue"].store.engine.dialect.name == "sqlite":
        assert "ok    journal_mode=wal" in lines
        assert any(line.startswith("ok    synchronous=FULL") for line in lines)
    else:
        assert any("SKIP LOCKED" in line for line in lines)
        assert any("clock is" in line for line in lines)


def test_a_missing_schema_fails_and_names_the_fix(make_app: Any) -> None:
    result = _doctor(make_app(upgrade=False))
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "flask queue db upgrade" in result.stdout


def test_stale_workers_unknown_tasks_and_dead_jobs_are_reported(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_STALE_AFTER": 5})
    store = app.extensions["sqlqueue"].store
    long_ago = store.now() - timedelta(minutes=10)
    with app.app_context():
        sample_app.queue.enqueue("nobody.knows", unregistered=True)
        with store.write() as conn:
            conn.execute(
                sa.insert(workers).values(
                    id="gone:1:abc",
                    host="gone",
                    pid=1,
                    queues="",
                    concurrency=1,
                    started_at=long_ago,
                    last_heartbeat_at=long_ago,
                )
            )
        sample_app.gives_up.enqueue()
        sample_app.queue.worker(app=app).run_once()
    result = _doctor(app)
    assert result.exit_code == 0, result.output
    assert "warn  1 worker(s) stopped heartbeating: gone:1:abc" in result.stdout
    assert (
        "warn  1 pending job(s) of task 'nobody.knows' in queue 'default': no live worker "
        "runs them\n      fix: this app does not register the task either" in result.stdout
    )
    assert "warn  1 dead job(s)" in result.stdout


@pytest.mark.sqlite_only  # the setting applies to SQLite only
def test_a_weak_sqlite_setting_is_a_warning(make_app: Any) -> None:
    app = make_app({"SQLQUEUE_SQLITE_SYNCHRONOUS": "NORMAL"})
    result = _doctor(app)
    assert result.exit_code == 0
    assert "warn  synchronous=NORMAL" in result.stdout
    assert "SQLQUEUE_SQLITE_SYNCHRONOUS = 'FULL'" in result.stdout

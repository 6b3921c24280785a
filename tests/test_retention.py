"""Retention: workers prune old finished jobs and effect keys, on every backend."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue.config import Settings
from flask_sqlqueue.core.features import retention
from flask_sqlqueue.core.models import effects
from flask_sqlqueue.core.models import jobs
from tests import control_app as c
from tests.waiting import wait_for


@pytest.fixture
def make(database_uri: str, tmp_path: Path) -> Any:
    """Builds the control app on the test's database with the config given (once)."""
    made: list[Flask] = []

    def build(**config: Any) -> Flask:
        c.reset_events()
        app = c.make_app(database_uri, tmp_path, **config)
        made.append(app)
        return app

    yield build
    c.go.set()
    for app in made:
        c.store_of(app).engine.dispose()


def ids(app: Flask, table: sa.Table = jobs) -> set[int]:
    with c.store_of(app).read() as conn:
        return set(conn.execute(sa.select(table.c.id)).scalars())


def finished(app: Flask, status: str, ago: timedelta, **values: Any) -> int:
    """A job that reached ``status`` ``ago`` before the database's now."""
    with app.app_context():
        job = c.add.enqueue(1, 2)
    when = c.store_of(app).now() - ago
    c.update(app, job.id, status=status, finished_at=when, updated_at=when, **values)
    return job.id


def effect(app: Flask, key: str, job_id: int, ago: timedelta) -> int:
    store = c.store_of(app)
    with store.write() as conn:
        store.ops.insert_effect(conn, key, job_id, store.now() - ago)
        return int(conn.execute(sa.select(effects.c.id).where(effects.c.key == key)).scalar_one())


MIN = timedelta(minutes=1)


def test_a_worker_prunes_each_status_after_its_own_retention(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=60, SQLQUEUE_KEEP_DEAD=timedelta(minutes=5))
    old_done = finished(app, "completed", 2 * MIN)
    new_done = finished(app, "completed", 0.5 * MIN)
    old_cancelled = finished(app, "cancelled", 2 * MIN)
    young_dead = finished(app, "dead", 2 * MIN)
    old_dead = finished(app, "dead", 6 * MIN)
    # Unfinished jobs are never pruned, whatever their timestamps say.
    pending = finished(app, "pending", 60 * MIN)
    running = finished(app, "running", 60 * MIN)
    key_kept = effect(app, "mail:1", old_done, 60 * MIN)

    pruned = c.queue.worker(app=app).prune()

    assert (pruned.completed, pruned.cancelled, pruned.dead, pruned.effects) == (1, 1, 1, 0)
    assert not pruned.more
    assert ids(app) == {new_done, young_dead, pending, running}
    assert old_done not in ids(app) and old_cancelled not in ids(app) and old_dead not in ids(app)
    # Effect keys are kept forever by default, even once their job is gone.
    assert ids(app, effects) == {key_kept}


def test_effect_keys_go_only_when_old_and_their_job_is_gone(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=None, SQLQUEUE_KEEP_DEAD=None, SQLQUEUE_KEEP_EFFECTS=600)
    live_job = finished(app, "completed", 600 * MIN)  # kept forever
    gone_job = finished(app, "completed", 600 * MIN)
    with c.store_of(app).write() as conn:
        conn.execute(sa.delete(jobs).where(jobs.c.id == gone_job))
    old_of_live = effect(app, "a", live_job, 20 * MIN)
    old_of_gone = effect(app, "b", gone_job, 20 * MIN)
    new_of_gone = effect(app, "c", gone_job, 5 * MIN)

    pruned = c.queue.worker(app=app).prune()

    assert (pruned.completed, pruned.effects) == (0, 1)
    assert ids(app, effects) == {old_of_live, new_of_gone}
    assert old_of_gone not in ids(app, effects)
    assert live_job in ids(app)


def test_batches_are_small_and_a_round_is_bounded(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=60)
    old = [finished(app, "completed", 2 * MIN) for _ in range(7)]
    keep = finished(app, "completed", 0.5 * MIN)
    store = c.store_of(app)
    policy = retention.RetentionPolicy(keep_completed=60, keep_dead=None, batch=3, max_batches=2)
    transactions: list[int] = []

    def run_write(fn: Any) -> int:
        n = store.run_write(fn)
        transactions.append(n)
        return int(n)

    first = retention.prune(run_write, policy, store.now())
    assert (first.completed, first.more, transactions) == (6, True, [3, 3])
    second = retention.prune(run_write, policy, store.now())
    assert (second.completed, second.more) == (1, False)
    assert transactions == [3, 3, 1, 0]  # cancelled: nothing due
    assert ids(app) == {keep}
    assert not set(old) & ids(app)


def test_workers_prune_on_their_own(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=60, SQLQUEUE_PRUNE_INTERVAL=0.1)
    old = finished(app, "completed", 2 * MIN)
    kept = finished(app, "completed", 0.5 * MIN)
    with c.running_worker(app, stale_after=1):
        wait_for(lambda: old not in ids(app))
    assert kept in ids(app)


def test_none_keeps_forever(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=None, SQLQUEUE_KEEP_DEAD=None)
    kept = {finished(app, s, 10_000 * MIN) for s in ("completed", "cancelled", "dead")}
    worker = c.queue.worker(app=app)
    assert not worker.retention.prunes_anything
    assert worker.prune().total == 0
    assert ids(app) == kept


@pytest.mark.parametrize(
    "value",
    [0, -1, 0.0, "7d", True, math.nan, math.inf, timedelta(0), timedelta(days=-1), 1e12, [1]],
)
@pytest.mark.parametrize(
    "key", ["SQLQUEUE_KEEP_COMPLETED", "SQLQUEUE_KEEP_DEAD", "SQLQUEUE_KEEP_EFFECTS"]
)
def test_bad_retention_settings_are_refused(key: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=f"^{key} must be a number of seconds"):
        Settings.from_mapping({key: value}, instance_path="/tmp")


def test_retention_settings_accept_seconds_timedelta_and_none() -> None:
    settings = Settings.from_mapping(
        {
            "SQLQUEUE_KEEP_COMPLETED": 3600,
            "SQLQUEUE_KEEP_DEAD": timedelta(days=2),
            "SQLQUEUE_KEEP_EFFECTS": None,
        },
        instance_path="/tmp",
    )
    assert (settings.keep_completed, settings.keep_dead, settings.keep_effects) == (
        3600.0,
        172800.0,
        None,
    )
    defaults = Settings.from_mapping({}, instance_path="/tmp")
    assert (defaults.keep_completed, defaults.keep_dead, defaults.keep_effects) == (
        7 * 86400.0,
        30 * 86400.0,
        None,
    )
    with pytest.raises(ConfigurationError, match="SQLQUEUE_PRUNE_INTERVAL"):
        Settings.from_mapping({"SQLQUEUE_PRUNE_INTERVAL": 0}, instance_path="/tmp")


def test_status_shows_the_retention(make: Any) -> None:
    app = make(SQLQUEUE_KEEP_COMPLETED=3600)
    finished(app, "completed", MIN)
    output = app.test_cli_runner().invoke(args=["queue", "status"]).output
    assert "retention: completed and cancelled 1h, dead 30d, effect keys forever" in output

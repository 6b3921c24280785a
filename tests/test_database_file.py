"""The SQLite file deleted or replaced under a running ``flask queue work`` process.

A worker keeps its connections to the file it opened: after a delete or a replace it
would go on with the old file, where no job enqueued since can be seen and every outcome
is lost. It must notice at its next heartbeat, say so naming the jobs it was running,
and exit with an error so that its supervisor starts it again on the new file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from flask_sqlqueue import DatabaseFileChanged
from tests import clock_app
from tests.test_clock_steps import WAIT
from tests.test_clock_steps import env_for
from tests.test_clock_steps import started
from tests.test_clock_steps import wait_until
from tests.test_clock_steps import work
from tests.workers import spawn
from tests.workers import wait_exit


@pytest.mark.slow
@pytest.mark.sqlite_only
@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_worker_whose_database_file_goes_stops_with_an_error(
    make_app: Any,
    database_uri: str,
    tmp_path: Path,
    change: str,
    request: pytest.FixtureRequest,
) -> None:
    make_app()  # the schema
    path = Path(sa.make_url(database_uri).database or "")
    app = clock_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    request.addfinalizer(app.extensions["sqlqueue"].store.engine.dispose)
    log, output = tmp_path / "runs.log", tmp_path / "worker.out"
    env = {**env_for(database_uri), "CLOCK_STALE_AFTER": "2"}  # a heartbeat every 0.5 s
    try:
        with spawn(work("default"), env, output) as worker:
            with app.app_context():
                running = clock_app.hold.enqueue(str(log), str(tmp_path / "go"))
            wait_until(lambda: started(log, running.id), "the job", worker)
            if change == "deleted":
                path.unlink()
            else:  # a new database moved over the old one, as a restore would do
                other = tmp_path / "new.db"
                fresh = clock_app.create_app({"SQLQUEUE_DATABASE_URI": f"sqlite:///{other}"})
                clock_app.queue.upgrade_database(app=fresh)
                fresh.extensions["sqlqueue"].store.engine.dispose()
                os.replace(other, path)
            code = wait_exit(worker, WAIT, output)
    finally:
        (tmp_path / "go").touch()
    text = output.read_text()
    assert code == 1, text[-3000:]
    what = "was deleted" if change == "deleted" else "was replaced by another file"
    assert f"Error: The queue's database file {path} {what} after this process opened it" in text
    assert f"Abandoned running job(s) {running.id}: their outcomes cannot be recorded" in text
    assert "The worker stopped; start it again" in text
    # Nor does a producer still holding the old file write a job that no one would see.
    with app.app_context(), pytest.raises(DatabaseFileChanged, match=what):
        clock_app.wall.enqueue()

"""What a worker loads: a SQLite worker never imports what only other databases, the
admin, the metrics, the migrations or isolated attempts need.

A worker's memory is mostly the modules it imports (benchmarks/results/profile.md):
Flask, with Werkzeug, Jinja and Click, and SQLAlchemy's Core are the floor; the rest is
loaded only where it is used. The worker runs as users run it, ``flask queue work
--burst`` in a process of its own, and reports the modules it ended with.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env

#: Modules a SQLite worker must not load, and who needs them instead.
NOT_ON_A_SQLITE_WORKER = {
    "sqlalchemy.orm": "a caller's session= (the queue writes Core rows only)",
    "sqlalchemy.dialects.postgresql": "a PostgreSQL database",
    "sqlalchemy.dialects.mysql": "a MariaDB/MySQL database",
    "flask_sqlqueue.core.dialects.postgresql": "a PostgreSQL database",
    "flask_sqlqueue.core.dialects.mysql": "a MariaDB/MySQL database",
    "alembic": "flask queue db ...",
    "mako": "flask queue db ... (through Alembic)",
    "flask_sqlqueue.admin": "queue.admin_blueprint()",
    "flask_sqlqueue.metrics": "queue.metrics_blueprint()",
    "flask_sqlqueue.testing": "the test helpers",
    "multiprocessing": "isolated attempts (--processes, isolate=True)",
}

#: Runs the command line as ``flask`` does and prints the modules loaded at the end.
WORKER = """
import json, sys
from flask.cli import main
sys.argv = ["flask", "queue", "work", "--burst"]
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _worker_modules(database_uri: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        env=flask_env(database_uri),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] in (0, None), done.stderr[-3000:]
    return set(report["modules"])


def _loaded(modules: set[str], name: str) -> bool:
    return any(module == name or module.startswith(name + ".") for module in modules)


def test_a_sqlite_worker_loads_only_what_it_uses(tmp_path: Path) -> None:
    database_uri = f"sqlite:///{tmp_path / 'queue.db'}"
    app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri})
    sample_app.queue.upgrade_database(app=app)
    with app.app_context():
        job = sample_app.add.enqueue(2, 3)
    app.extensions["sqlqueue"].store.engine.dispose()

    modules = _worker_modules(database_uri)

    with app.app_context():
        assert job.refresh().result == 5  # the worker claimed, ran and recorded a job
    app.extensions["sqlqueue"].store.engine.dispose()
    assert "sqlalchemy.dialects.sqlite" in modules  # what the check would have caught
    loaded = {name: why for name, why in NOT_ON_A_SQLITE_WORKER.items() if _loaded(modules, name)}
    assert not loaded, f"a SQLite worker loaded modules only needed by: {loaded}"

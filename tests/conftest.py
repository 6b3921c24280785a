from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from tests import sample_app

ROOT = Path(__file__).resolve().parent.parent
SERVER_URL_VARS = {"postgresql": "SQLQUEUE_TEST_POSTGRES_URL", "mysql": "SQLQUEUE_TEST_MYSQL_URL"}


@pytest.fixture
def database_uri(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'queue.db'}"


@pytest.fixture
def make_app(database_uri: str, tmp_path: Path) -> Iterator[Any]:
    """Build the sample app on a fresh database with the schema in place."""
    made: list[Flask] = []

    def make(config: dict[str, Any] | None = None, *, upgrade: bool = True) -> Flask:
        app = sample_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri, **(config or {})})
        app.instance_path = str(tmp_path / "instance")
        if upgrade:
            sample_app.queue.upgrade_database(app=app)
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["sqlqueue"].store.engine.dispose()


# Not called `app`: pytest-flask, a test dependency, pushes a request context around
# every test that uses a fixture of that name, which the leak detector would report.
@pytest.fixture
def sq_app(make_app: Any) -> Flask:
    """The sample app on a fresh SQLite file, schema in place."""
    return make_app()  # type: ignore[no-any-return]


@pytest.fixture
def ctx(sq_app: Flask) -> Iterator[Flask]:
    """``sq_app`` with its app context pushed."""
    with sq_app.app_context():
        yield sq_app


@pytest.fixture
def queue() -> Any:
    return sample_app.queue


def flask_env(database_uri: str, **extra: str) -> dict[str, str]:
    """Environment for a `flask --app tests.sample_app ...` subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
    env.update(
        FLASK_APP="tests.sample_app:create_app",
        SAMPLE_DATABASE_URI=database_uri,
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        **extra,
    )
    return env


def run_flask(
    database_uri: str, *args: str, timeout: float = 120, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flask", *args],
        env=flask_env(database_uri, **extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(autouse=True)
def leak_detector() -> Iterator[None]:
    """Fail a test that leaves an app context pushed or worker threads running."""
    yield
    from flask import has_app_context

    leaked_ctx = has_app_context()
    while has_app_context():  # leave the next test a clean slate
        from flask.globals import _cv_app

        _cv_app.get().pop()
    deadline = time.monotonic() + 5
    alive: list[str] = []
    while time.monotonic() < deadline:
        alive = [
            t.name for t in threading.enumerate() if t.name.startswith("sqlqueue-") and t.is_alive()
        ]
        if not alive:
            break
        time.sleep(0.05)
    assert not leaked_ctx, "the test left an app context pushed"
    assert not alive, f"worker threads still running after the test: {alive}"

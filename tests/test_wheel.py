"""The built wheel: the migrations ship inside the package and work from a clean install.

Builds the wheel (its build backend comes from PyPI) and installs it with its dependencies
into a fresh virtualenv, so these tests need the network and take tens of seconds.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from flask_sqlqueue import schema

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that could point Python at the source checkout."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FLASK_", "SQLQUEUE_", "SAMPLE_"))
        and key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env.update(extra)
    return env


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--wheel", "--outdir", dist, ROOT, cwd=dist)
    (built,) = dist.glob("flask_sqlqueue-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain virtualenv (no system site-packages) with only the wheel and its dependencies."""
    venv = tmp_path_factory.mktemp("venv")
    # Without pip of its own (ensurepip is slow): this pip installs into it with --python.
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv)
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        wheel,
        cwd=venv,
    )
    return venv


def test_wheel_ships_the_migrations_inside_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()

    assert "flask_sqlqueue/_migrations/env.py" in names
    assert "flask_sqlqueue/_migrations/script.py.mako" in names
    assert "flask_sqlqueue/py.typed" in names
    shipped = {
        name.removeprefix("flask_sqlqueue/_migrations/versions/")
        for name in names
        if name.startswith("flask_sqlqueue/_migrations/versions/") and name.endswith(".py")
    }
    in_repo = {path.name for path in (ROOT / "migrations" / "versions").glob("*.py")}
    assert shipped == in_repo and shipped

    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"flask_sqlqueue", wheel.name.split("-py3")[0] + ".dist-info"}
    assert not [name for name in names if name.startswith("migrations/")]
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


APP_MODULE = """
from __future__ import annotations

from flask import Flask

from flask_sqlqueue import SQLQueue

queue = SQLQueue()


@queue.task
def ping(word: str) -> str:
    return word + "!"


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["SQLQUEUE_DATABASE_URI"] = {uri!r}
    queue.init_app(app)
    return app
"""


def test_installed_wheel_runs_db_upgrade(venv: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    assert not project.is_relative_to(ROOT)
    database = tmp_path / "data" / "queue.db"
    (project / "wheelapp.py").write_text(
        textwrap.dedent(APP_MODULE).format(uri=f"sqlite:///{database}")
    )
    flask = venv / "bin" / "flask"

    result = _run(flask, "--app", "wheelapp", "queue", "db", "upgrade", cwd=project)
    assert f"Queue schema at {schema.head()}" in result.stdout

    with contextlib.closing(sqlite3.connect(database)) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        (version,) = conn.execute("SELECT version_num FROM sqlqueue_alembic_version").fetchone()
    assert {"sqlqueue_jobs", "sqlqueue_job_effects", "sqlqueue_workers"} <= tables
    assert version == schema.head()

    # The installed package runs a job end to end, too.
    _run(
        flask,
        "--app",
        "wheelapp",
        "queue",
        "enqueue",
        "wheelapp.ping",
        "--args",
        '["hi"]',
        cwd=project,
    )
    _run(flask, "--app", "wheelapp", "queue", "work", "--burst", cwd=project)
    with contextlib.closing(sqlite3.connect(database)) as conn:
        assert conn.execute("SELECT status, result FROM sqlqueue_jobs").fetchall() == [
            ("completed", '"hi!"')
        ]

    # It was the installed copy that ran, and its migrations came from inside the package.
    where = _run(
        venv / "bin" / "python",
        "-c",
        "import flask_sqlqueue, flask_sqlqueue.schema as s; "
        "print(flask_sqlqueue.__file__); print(s.migrations_dir())",
        cwd=project,
    ).stdout.splitlines()
    (site_packages,) = venv.glob("lib/python*/site-packages")
    assert Path(where[0]).is_relative_to(site_packages)
    assert Path(where[1]) == site_packages / "flask_sqlqueue" / "_migrations"
    assert not (site_packages / "migrations").exists()

"""A queue of its own for the dependency tests: tasks that log when they start and end.

Each task appends ``start <job id>`` / ``end <job id>`` lines to the file named by the
app's ``WORKFLOW_LOG`` (one ``write()`` each, so lines of two threads never mix), so a
test can check which jobs ran, and in what order, without timing anything.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask import current_app

from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from tests.conftest import install_schema
from tests.control_app import row as row
from tests.sample_app import queue_app
from tests.stores import burst as burst
from tests.stores import store_of as store_of
from tests.waiting import WAIT
from tests.waiting import scaled

queue = SQLQueue()

#: Set by ``blocks`` once it runs; the test sets ``go`` to let it return.
started = threading.Event()
go = threading.Event()
#: While set, ``flaky`` fails.
failing = threading.Event()


def _log(kind: str) -> None:
    line = f"{kind} {current_job.id}\n".encode()
    fd = os.open(current_app.config["WORKFLOW_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@queue.task(name="workflow.step")
def step(value: Any = None) -> Any:
    """Logs its start and end; returns ``value``."""
    _log("start")
    _log("end")
    return value


@queue.task(name="workflow.fails", max_attempts=2)
def fails() -> None:
    _log("start")
    raise RuntimeError("step failed")


@queue.task(name="workflow.gives_up")
def gives_up() -> None:
    _log("start")
    raise PermanentFailure("no point retrying")


@queue.task(name="workflow.fails_once", max_attempts=3)
def fails_once() -> str:
    """Fails its first attempt, succeeds on the next."""
    _log("start")
    if current_job.attempts == 1:
        raise RuntimeError("first attempt fails")
    return "second time lucky"


@queue.task(name="workflow.flaky", max_attempts=1)
def flaky(value: Any = None) -> Any:
    """Fails while the test keeps ``failing`` set; else returns ``value``."""
    _log("start")
    if failing.is_set():
        raise RuntimeError("told to fail")
    return value


@queue.task(name="workflow.blocks")
def blocks(value: Any = None) -> Any:
    """Runs until the test sets ``go`` (or stops at a cancellation request)."""
    _log("start")
    started.set()
    deadline = time.monotonic() + WAIT
    while not go.wait(0.01) and time.monotonic() < deadline:
        current_job.raise_if_cancelled()
    return value


@queue.task(name="workflow.collects")
def collects() -> dict[str, Any]:
    """Returns the results of its dependencies, keyed by id as text (JSON's keys)."""
    _log("start")
    return {str(job_id): result for job_id, result in current_job.dependency_results.items()}


def make_app(database_uri: str, tmp_path: Path, *, schema: bool = True, **config: Any) -> Flask:
    """An app for ``queue`` on ``database_uri``; with ``schema`` (an empty database at
    first), its schema at head."""
    if schema and not database_uri.startswith("sqlite"):
        install_schema(database_uri)  # faster than the migrations, on an empty server
    settings = {"SQLQUEUE_DATABASE_URI": database_uri, **config}
    app = queue_app(__name__, queue, settings)
    app.config["WORKFLOW_LOG"] = str(tmp_path / "workflow.log")
    app.instance_path = str(tmp_path / "instance")
    if schema and database_uri.startswith("sqlite"):
        queue.upgrade_database(app=app)
    return app


@pytest.fixture
def workflow_app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    started.clear()
    go.clear()
    failing.clear()
    app = make_app(database_uri, tmp_path)
    yield app
    go.set()  # never leave a task waiting
    store_of(app).engine.dispose()


def status(app: Flask, job_id: int) -> str:
    return str(row(app, job_id).status)


def ran(app: Flask) -> list[tuple[str, int]]:
    """The ``(start|end, job id)`` lines the tasks logged, in order."""
    path = Path(app.config["WORKFLOW_LOG"])
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [(kind, int(job)) for kind, job in (line.split() for line in lines)]


def starts(app: Flask) -> list[int]:
    return [job for kind, job in ran(app) if kind == "start"]


def run_doc_example(tmp_path: Path, name: str, doc: str = "workflows.md") -> list[str]:
    """Run the example of docs/``doc`` that starts ``# name`` as a script in
    ``tmp_path``; the lines it printed."""
    page = (Path(__file__).parent.parent / "docs" / doc).read_text()
    found = re.search(rf"```python\n(# {re.escape(name)}.*?)```", page, re.DOTALL)
    assert found, f"docs/{doc} has lost its {name} example"
    (tmp_path / name).write_text(found.group(1))
    done = subprocess.run(
        [sys.executable, name],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()

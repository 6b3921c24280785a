"""How the parts find each app's queue state, and who imports whom.

Every adapter (the commands, the admin and metrics blueprints, the test helpers, the
child processes' app loader) finds the state through one accessor, with one message for
each way it can be missing; the Flask glue imports none of them; ``SQLQueue`` is the
façade that wires them in.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import QueueNotSetUp
from flask_sqlqueue import SchemaError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import schema
from flask_sqlqueue import testing
from flask_sqlqueue.cli import queue_cli
from flask_sqlqueue.extension import QueueExtension
from flask_sqlqueue.extension import QueueState
from flask_sqlqueue.extension import queue_state
from flask_sqlqueue.metrics import QueueCollector
from flask_sqlqueue.processes import AppLoader

PACKAGE = Path(__file__).resolve().parent.parent / "flask_sqlqueue"
#: The modules that sit on the Flask glue, and the façade above them.
ADAPTERS = {"cli", "admin", "metrics", "testing", "processes", "facade"}
NOT_SET_UP = re.escape(QueueNotSetUp.NOT_SET_UP)

queue = SQLQueue()
other = SQLQueue()


@queue.task
def ping() -> str:
    return "pong"


def bare_app() -> Flask:
    """An app that nobody set the queue up on."""
    return Flask(__name__)


# Not called `app`: pytest-flask would push a request context around the test.
@pytest.fixture
def qapp(tmp_path: Path) -> Iterator[Flask]:
    made = Flask(__name__, instance_path=str(tmp_path / "instance"))
    queue.init_app(made)
    yield made
    queue.state(made).store.engine.dispose()


# -- one accessor, one message per failure ---------------------------------------------------


def test_the_state_is_found_by_the_queue_and_by_the_app(qapp: Flask) -> None:
    state = queue.state(qapp)
    assert isinstance(state, QueueState)
    assert state is qapp.extensions["sqlqueue"] is queue_state(qapp)
    assert state.queue is queue and state.registry is queue.registry
    with qapp.app_context():
        assert queue.state() is state is queue_state()


def test_each_failure_has_its_message() -> None:
    for find in (queue.state, queue_state):
        with pytest.raises(QueueNotSetUp) as no_app:
            find()
        assert str(no_app.value) == QueueNotSetUp.NO_APP
        with pytest.raises(QueueNotSetUp) as not_set_up:
            find(bare_app())
        assert str(not_set_up.value) == QueueNotSetUp.NOT_SET_UP


def test_an_app_of_another_queue_is_refused_by_this_one(qapp: Flask) -> None:
    with pytest.raises(QueueNotSetUp) as refused:
        other.state(qapp)
    assert str(refused.value) == QueueNotSetUp.OTHER_QUEUE
    with pytest.raises(QueueNotSetUp, match="different SQLQueue"):
        other.drain(app=qapp)
    assert queue_state(qapp).queue is queue  # without a queue to compare, any is found


def test_the_error_is_what_callers_already_catch() -> None:
    # Flask's "outside of application context" is a RuntimeError, as the extension's
    # own refusals were; the child process's loader refused with a ConfigurationError.
    assert issubclass(QueueNotSetUp, RuntimeError)
    assert issubclass(QueueNotSetUp, ConfigurationError)
    assert "need an app" in QueueNotSetUp.NO_APP and "app context" in QueueNotSetUp.NO_APP
    assert "init_app" in QueueNotSetUp.NOT_SET_UP


def test_every_adapter_refuses_an_app_without_the_queue_with_the_one_message() -> None:
    bare = bare_app()
    with pytest.raises(QueueNotSetUp, match=NOT_SET_UP):
        testing.drain(bare)
    with pytest.raises(QueueNotSetUp, match=NOT_SET_UP):
        list(QueueCollector(bare).collect())
    with pytest.raises(QueueNotSetUp, match=NOT_SET_UP):
        AppLoader(create_app=bare_app)()
    bare.cli.add_command(queue_cli)
    result = bare.test_cli_runner().invoke(args=["queue", "status"])
    assert result.exit_code == 1
    assert f"Error: {QueueNotSetUp.NOT_SET_UP}" in result.output.splitlines()


def test_every_adapter_refuses_a_call_without_an_app_with_the_one_message() -> None:
    for call in (testing.drain, testing.enqueued, lambda: queue.worker()):
        with pytest.raises(QueueNotSetUp) as refused:
            call()
        assert str(refused.value) == QueueNotSetUp.NO_APP


def test_the_admin_of_another_queue_answers_with_the_message(qapp: Flask) -> None:
    qapp.secret_key = "test"
    qapp.register_blueprint(other.admin_blueprint(authorize=lambda: True), url_prefix="/q")
    response = qapp.test_client().get("/q/jobs")
    assert response.status_code == 503
    assert "different SQLQueue" in response.get_data(as_text=True)


# -- the state's own methods ------------------------------------------------------------------


def test_schema_changed_makes_the_next_use_check_the_tables_again(qapp: Flask) -> None:
    queue.upgrade_database(app=qapp)
    state = queue.state(qapp)
    state.ensure_schema()
    schema.downgrade(state.store.engine, "base")
    state.ensure_schema()  # checked once per process: still taken as current
    state.schema_changed()
    with pytest.raises(SchemaError):
        state.ensure_schema()
    queue.upgrade_database(app=qapp)  # which says so itself
    state.ensure_schema()


def test_worker_options_take_the_apps_stale_after(tmp_path: Path) -> None:
    made = Flask(__name__, instance_path=str(tmp_path / "instance"))
    made.config["SQLQUEUE_STALE_AFTER"] = 7
    queue.init_app(made)
    try:
        state = queue.state(made)
        assert state.worker_options().stale_after == 7.0
        assert state.worker_options(grace=1, stale_after=3).stale_after == 3
        assert state.worker_options(grace=1).grace == 1
    finally:
        state.store.engine.dispose()


# -- the façade and the commands ----------------------------------------------------------------


def test_sqlqueue_is_the_extension_with_its_adapters(qapp: Flask) -> None:
    assert issubclass(SQLQueue, QueueExtension)
    for method in ("admin_blueprint", "metrics_blueprint", "drain"):
        assert hasattr(SQLQueue, method) and not hasattr(QueueExtension, method), method
    assert qapp.cli.commands["queue"] is queue_cli


def test_init_app_leaves_an_apps_own_queue_command_alone(tmp_path: Path) -> None:
    made = Flask(__name__, instance_path=str(tmp_path / "instance"))

    @made.cli.command("queue")
    def own() -> None:
        click.echo("the app's own")

    queue.init_app(made)
    try:
        assert made.cli.commands["queue"] is own
        assert made.test_cli_runner().invoke(args=["queue"]).output == "the app's own\n"
    finally:
        queue.state(made).store.engine.dispose()


def _package_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports anywhere in it, functions included, as names
    relative to the package (``"core.store"``, ``"cli"``)."""
    module = path.relative_to(PACKAGE).with_suffix("").parts
    package = module[:-1]  # of admin/__init__.py and of admin/views.py alike: admin
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("flask_sqlqueue.")]
            names = [name.removeprefix("flask_sqlqueue.") for name in names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = list(package[: len(package) - node.level + 1])
            base += node.module.split(".") if node.module else []
            names = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flask_sqlqueue"):
            base = (node.module or "").split(".")[1:]
            names = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
        found |= {name for name in names if name}
    return found


def test_the_glue_and_the_core_import_no_adapter() -> None:
    below = [PACKAGE / "extension.py", *sorted((PACKAGE / "core").rglob("*.py"))]
    for path in below:
        reached = {name.split(".")[0] for name in _package_imports(path)} & ADAPTERS
        assert not reached, f"{path.relative_to(PACKAGE)} imports {sorted(reached)}"


def test_the_import_finder_sees_imports_inside_functions() -> None:
    # Guards the test above against passing vacuously.
    assert {"cli", "testing", "admin", "metrics"} <= _package_imports(PACKAGE / "facade.py")
    assert "extension" in _package_imports(PACKAGE / "admin" / "context.py")
    assert "core.store" in _package_imports(PACKAGE / "extension.py")

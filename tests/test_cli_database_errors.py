"""``flask queue ...`` on a database it cannot use: one ``Error:`` line, exit 1, no
traceback, and nothing written. No server is needed: the unreachable ones are a closed
port on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask

from tests import sample_app
from tests.conftest import run_flask
from tests.test_cli import assert_clean_error

COMMANDS = [
    ["status"],
    ["list"],
    ["show", "1"],
    ["retry", "1"],
    ["retry", "--dead"],
    ["cancel", "1"],
    ["purge", "--status", "completed", "--older-than", "1d"],
    ["rescue"],
    ["pause", "--all"],
    ["resume", "--all"],
    ["enqueue", "echo", "--args", "[1]"],
    ["schedules"],
    ["work", "--burst"],
    ["db", "current"],
    ["db", "upgrade"],
    ["db", "downgrade"],
]
UNREACHABLE = {
    "postgresql": ("postgresql+psycopg://postgres:secret@127.0.0.1:1/test", "Connection refused"),
    "mysql": ("mysql+pymysql://root:secret@127.0.0.1:1/test", "Can't connect"),
}
NOT_A_DATABASE = b"These are notes, not a database. " * 100


def app_on(uri: str) -> Flask:
    return sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri})


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("server", sorted(UNREACHABLE))
def test_an_unreachable_server_is_one_error_line(server: str, command: list[str]) -> None:
    uri, reason = UNREACHABLE[server]
    app = app_on(uri)
    try:
        result = app.test_cli_runner().invoke(args=["queue", *command])
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()
    line = assert_clean_error(result, reason, "127.0.0.1:1")
    assert "secret" not in result.output  # the password is never printed
    assert "sqlalche.me" not in line and "[SQL:" not in line


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_file_that_is_not_a_database_is_one_error_line(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(NOT_A_DATABASE)
    app = app_on(f"sqlite:///{path}")
    try:
        result = app.test_cli_runner().invoke(args=["queue", *command])
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()
    assert_clean_error(result, "file is not a database", str(path))
    assert path.read_bytes() == NOT_A_DATABASE  # nothing written


def test_a_real_process_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(NOT_A_DATABASE)
    # A process per database, the two kinds of command in turn (the in-process tests
    # above run every command on every database).
    cases = [(f"sqlite:///{path}", "file is not a database"), *UNREACHABLE.values()]
    commands = [["db", "current"], ["status"]]
    for index, (uri, reason) in enumerate(cases):
        command = commands[index % 2]
        done = run_flask(uri, "queue", *command)
        assert done.returncode == 1, (uri, command, done.stderr)
        assert done.stdout == ""
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
        assert reason in lines[0]

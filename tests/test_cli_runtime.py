"""``flask queue`` as an app runs it, in a process of its own: the commands work with
every click the package claims (``make test-lowest`` runs this with click 8.1.3, the
oldest Flask 3.0 takes), apart from the rest of the suite, whose test runner reads
stderr apart from stdout, as click's does from 8.2 on."""

from __future__ import annotations

from tests.conftest import run_flask


def test_the_commands_run_with_the_installed_click(database_uri: str) -> None:
    def ok(*args: str) -> str:
        done = run_flask(database_uri, "queue", *args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    ok("db", "upgrade")
    assert "Job 1 pending" in ok("enqueue", "tests.sample_app.add", "--args", "[2, 3]")
    assert "Job 2 pending" in ok(
        "enqueue", "tests.sample_app.always_fails", "--kwargs", '{"message": "x"}'
    )
    assert "pending" in ok("status")
    ok("work", "--burst")
    listing = ok("list", "--status", "completed")
    assert "tests.sample_app.add" in listing
    assert "result" in ok("show", "1")
    assert "dead" in ok("show", "2")
    assert ok("retry", "2").strip() == "Replayed 1 job(s)."
    assert "pending" in ok("show", "2")
    # A bad option is click's own usage error, the same on every version.
    bad = run_flask(database_uri, "queue", "work", "--concurrency", "zero")
    assert bad.returncode == 2 and "Invalid value for '--concurrency'" in bad.stderr

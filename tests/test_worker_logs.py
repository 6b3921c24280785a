"""What ``flask queue work`` logs: levels, JSON lines, and the start and stop lines.

Real worker processes on the sample app, their standard error read back.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from typing import Any

from flask import Flask

from flask_sqlqueue.core.logcontext import JsonFormatter
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.conftest import run_flask
from tests.waiting import scaled


def _enqueue(app: Flask) -> tuple[int, int]:
    with app.app_context():
        done = sample_app.add.enqueue(1, 2).id
        failed = sample_app.always_fails.using(max_attempts=1).enqueue("down").id
    return done, failed


def test_json_lines_carry_the_jobs_fields(make_app: Any, database_uri: str) -> None:
    done, failed = _enqueue(make_app())
    result = run_flask(database_uri, "queue", "work", "--burst", "--log-format", "json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]  # every line parses
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    about = {(line.get("job_id"), line.get("outcome")): line for line in lines}
    completed = about[(done, "completed")]
    assert completed["task"] == "tests.sample_app.add" and completed["queue"] == "default"
    assert completed["attempt"] == 1 and completed["duration"] >= 0
    dead = about[(failed, "dead")]
    assert dead["level"] == "ERROR" and "RuntimeError: down" in dead["message"]
    started, stopped = lines[0]["message"], lines[-1]["message"]
    assert "started" in started and "tests.sample_app.always_fails" in started
    assert stopped.endswith(
        "stopped: no job is eligible (--burst); 0 job(s) handed back to pending"
    )


def test_an_attempt_writes_one_line_at_info_and_its_start_at_debug(
    make_app: Any, database_uri: str
) -> None:
    """At the default level each attempt writes the line of its end only; debug adds the
    line of its start."""
    app = make_app()
    done, _ = _enqueue(app)
    result = run_flask(database_uri, "queue", "work", "--burst")
    assert result.returncode == 0, result.stderr
    about_done = [line for line in result.stderr.splitlines() if f"job={done} " in line]
    assert len(about_done) == 1 and "completed in" in about_done[0], result.stderr
    assert ": started" not in result.stderr
    with app.app_context():
        debugged = sample_app.always_fails.using(max_attempts=1).enqueue("down").id
    result = run_flask(database_uri, "queue", "work", "--burst", "--log-level", "debug")
    assert result.returncode == 0, result.stderr
    about = [line for line in result.stderr.splitlines() if f"job={debugged} " in line]
    assert [": started" in line for line in about] == [True, False], result.stderr
    assert "failed, job is dead" in about[1]


def test_log_level_leaves_out_the_lines_below_it(make_app: Any, database_uri: str) -> None:
    done, failed = _enqueue(make_app())
    result = run_flask(database_uri, "queue", "work", "--burst", "--log-level", "warning")
    assert result.returncode == 0, result.stderr
    assert f"job={failed} " in result.stderr and "failed, job is dead" in result.stderr
    assert "started" not in result.stderr and "completed" not in result.stderr
    assert f"job={done} " not in result.stderr


def test_an_idle_worker_stops_at_sigterm_and_says_why(make_app: Any, database_uri: str) -> None:
    make_app()
    # A poll interval far longer than the wait below: the stop cannot wait for a poll.
    proc = subprocess.Popen(
        [sys.executable, "-m", "flask", "queue", "work", "--poll-interval", "600"],
        env=flask_env(database_uri),
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for the start line
            if " started: " in line:
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=scaled(30))
        took = time.monotonic() - sent
        rest = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 0, rest
    assert took < scaled(10), took
    assert "SIGTERM: finishing running jobs" in rest
    assert "stopped: asked to stop; 0 job(s) handed back to pending" in rest


def test_the_json_formatter_keeps_the_traceback() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed %s", ("now",), sys.exc_info()
        )
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed now" and line["level"] == "ERROR"
    assert line["exc"].startswith("Traceback") and "ValueError: bad" in line["exc"]
    assert "job_id" not in line  # absent fields are left out

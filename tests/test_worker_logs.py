"""What ``flask queue work`` logs: levels, JSON lines, and the start and stop lines.

Real worker processes on the sample app, their standard error read back.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC
from datetime import datetime
from typing import Any

from flask import Flask

from flask_sqlqueue.core import logcontext
from flask_sqlqueue.core.logcontext import JsonFormatter
from tests import sample_app
from tests.conftest import run_flask
from tests.waiting import scaled
from tests.workers import queue_work


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


def test_the_line_of_a_success_is_an_ordinary_record_of_the_worker_logger(
    make_app: Any,
) -> None:
    """The success line is made without a look up the stack, and is still a record as
    ``log.info`` makes it: the logger's filters see it, a handler gets it with the job's
    fields and where it was logged (the function that logs it)."""
    app = make_app()
    with app.app_context():
        kept = sample_app.add.enqueue(1, 2).id
        dropped = sample_app.add.enqueue(3, 4).id
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("flask_sqlqueue.worker")
    handler = Keep(logging.INFO)
    level = logger.level

    def drop(record: logging.LogRecord) -> bool:
        return getattr(record, "sqlqueue_job_id", None) != dropped

    logger.addHandler(handler)
    logger.addFilter(drop)
    logger.setLevel(logging.INFO)
    try:
        sample_app.queue.worker(app=app).run(burst=True)
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(drop)
        logger.setLevel(level)
    done = [r for r in records if getattr(r, "sqlqueue_outcome", None) == "completed"]
    assert [r.sqlqueue_job_id for r in done] == [kept]  # type: ignore[attr-defined]
    (record,) = done
    assert record.getMessage().startswith(f"job={kept} task=tests.sample_app.add attempt=1/")
    assert record.funcName == "_log_success" and record.filename == "outcomes.py"
    assert record.lineno > 0 and record.levelno == logging.INFO
    assert record.threadName.startswith("sqlqueue-job-")
    assert record.sqlqueue_queue == "default"  # type: ignore[attr-defined]


def test_every_job_of_a_drain_has_its_line_with_its_id_task_attempt_and_duration(
    make_app: Any, database_uri: str
) -> None:
    """The lines of the completions recorded together are written together: each one is
    still there, whole, once, as it always read, between the start and the stop lines."""
    app = make_app()
    with app.app_context():
        ids = {job.id for job in sample_app.add.enqueue_many([((i, 1), {}) for i in range(60)])}
    result = run_flask(database_uri, "queue", "work", "--burst")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    completed = re.compile(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO flask_sqlqueue\.worker: "
        r"job=(\d+) task=tests\.sample_app\.add attempt=1/5: completed in \d+\.\d{3}s"
    )
    logged = [int(m[1]) for m in map(completed.fullmatch, lines) if m is not None]
    assert sorted(logged) == sorted(ids), result.stderr
    assert " started: " in lines[0] and lines[-1].endswith(
        "stopped: no job is eligible (--burst); 0 job(s) handed back to pending"
    )
    assert len(lines) == len(ids) + 2, result.stderr


def _held_logger(name: str) -> tuple[logging.Logger, io.StringIO, io.StringIO]:
    """A logger of its own with a :class:`LineHandler` and a plain handler, each on a
    stream of its own."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    held, plain = io.StringIO(), io.StringIO()
    handler = logcontext.LineHandler()
    handler.setStream(held)
    handler.setFormatter(logging.Formatter("%(threadName)s %(message)s"))
    other = logging.StreamHandler(plain)
    other.setFormatter(logging.Formatter("%(message)s"))
    logger.handlers = [handler, other]
    return logger, held, plain


def test_lines_together_reach_the_stream_as_the_block_ends_in_order() -> None:
    logger, held, plain = _held_logger("tests.lines_together")
    with logcontext.lines_together():
        for n in range(3):
            logger.info("line %d", n)
        # Not yet on the held stream; another handler has them as they are logged.
        assert held.getvalue() == "" and plain.getvalue() == "line 0\nline 1\nline 2\n"
        other = threading.Thread(target=logger.info, args=("elsewhere",), name="other")
        other.start()
        other.join()
        assert held.getvalue() == "other elsewhere\n"  # another thread's is not held
        with logcontext.lines_together():  # nested: the outer block still holds
            logger.info("line 3")
        assert held.getvalue() == "other elsewhere\n"
    me = threading.current_thread().name
    assert held.getvalue() == "other elsewhere\n" + "".join(f"{me} line {n}\n" for n in range(4))
    logger.info("after")
    assert held.getvalue().endswith(f"{me} after\n")


def test_lines_held_at_shutdown_are_written() -> None:
    logger, held, _ = _held_logger("tests.lines_at_shutdown")
    with logcontext.lines_together():
        logger.info("kept")
        logger.handlers[0].close()  # as logging.shutdown does, at exit
        assert held.getvalue().endswith(" kept\n")
    assert held.getvalue().count("kept") == 1


def test_held_lines_are_written_in_pieces_a_pipe_takes_whole() -> None:
    lines = [f"job={n} task=app.t attempt=1/5: completed in 0.001s\n" for n in range(300)]
    lines[10] = "job=10 task=app.été attempt=1/5: completed in 0.001s \udcff\n"
    lines[20] = "x" * (3 * logcontext.ATOMIC_WRITE) + "\n"
    pieces = list(logcontext.pieces(lines))
    assert "".join(pieces) == "".join(lines)
    assert len(pieces) < len(lines) / 20  # far fewer writes than lines
    for piece in pieces:
        assert piece.endswith("\n")
        size = len(piece.encode("utf-8", "backslashreplace"))
        assert size <= logcontext.ATOMIC_WRITE or piece == lines[20]


def test_a_record_made_without_a_logger_name_gets_the_job_fields() -> None:
    """``logging.makeLogRecord`` (what a socket log receiver calls) names no logger: the
    queue's record factory, once installed, gives that record the fields as any other."""
    logcontext.install()
    record = logging.makeLogRecord({"msg": "from elsewhere"})
    assert record.getMessage() == "from elsewhere"
    assert all(hasattr(record, name) for name in logcontext.FIELDS)


def test_the_formatters_write_the_times_logging_and_datetime_write() -> None:
    """Made once a second, the times are still those of logging.Formatter (text) and
    of datetime, rounded as it rounds (JSON), at every edge of a second."""
    text, plain, json_lines = (
        logcontext.TextFormatter(logcontext.TEXT_FORMAT),
        logging.Formatter(logcontext.TEXT_FORMAT),
        JsonFormatter(),
    )
    second = math.floor(time.time())
    fractions = (0.0, 0.0005, 0.4999, 0.5, 0.9994999, 0.9995, 0.999999, 0.9999995, 0.9999996)
    for created in [second + k + f for k in (0, 1, 86_400) for f in fractions]:
        record = logging.makeLogRecord({"created": created})
        record.msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord sets it
        assert text.formatTime(record) == plain.formatTime(record), created
        expected = datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")
        assert json_lines.utc_time(created) == expected, created
        assert json.loads(json_lines.format(record))["time"] == expected


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
    with queue_work(
        database_uri, "--poll-interval", "600", stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:  # wait for the start line
            if " started: " in line:
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=scaled(30))
        took = time.monotonic() - sent
        rest = proc.stderr.read()
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

"""A stop asked by a signal always ends: ``flask queue work`` acts on SIGTERM and SIGINT
on a thread of its own (``cli/signalwatch.py``), never inside a signal handler, where
setting an event whose lock the interrupted main thread holds would hang it for good."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from flask_sqlqueue import Call
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.conftest import query
from tests.waiting import scaled
from tests.waiting import wait_for
from tests.workers import FLASK
from tests.workers import spawn
from tests.workers import wait_exit

#: Each of the stops waits this long at most (a quiet machine's figure, stretched with
#: the load): the worker's grace below, and its start-up and exit.
EXIT_WITHIN = 20.0
GRACE = "5"
#: The line a worker logs once it runs.
STARTED = " started: queues="

# The main thread sets, clears and waits on an event as fast as it can (holding the
# event's lock most of the time), while a signal arrives every millisecond or so; each
# signal sets that event. A handler doing that itself on the main thread hangs within a
# few hundred signals; the watch never does.
HAMMER = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from flask_sqlqueue.cli.signalwatch import SignalWatch

    event = threading.Event()
    seen = []

    def act(signum):
        seen.append(signum)
        event.set()

    # What the watch puts back when it ends: signals still on their way then do nothing.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdout.write("ready\\n")
    sys.stdout.flush()
    with SignalWatch(act):
        deadline = time.monotonic() + float(sys.argv[1])
        while time.monotonic() < deadline and len(seen) < int(sys.argv[2]):
            event.clear()
            event.wait(0.0001)
            event.set()
    sys.stdout.write(f"{len(seen)}\\n")
    """
)


def test_signals_set_an_event_the_main_thread_holds_without_hanging(tmp_path: Path) -> None:
    wanted = 2000
    proc = subprocess.Popen(
        [sys.executable, "-c", HAMMER, str(scaled(60.0)), str(wanted)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # the watch is entered
        sent = 0
        while proc.poll() is None and sent < 5 * wanted:
            proc.send_signal(signal.SIGTERM)
            sent += 1
            time.sleep(0.001)
        out, _ = proc.communicate(timeout=scaled(30.0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    # Signals sent close together may be delivered as one: at least the count asked for.
    assert int(out.strip()) >= wanted


def stop_one(database_uri: str, tmp_path: Path, n: int, rng: random.Random) -> str:
    """Start a busy worker, SIGTERM it at a random moment, and see it exit in time;
    returns its output."""
    output = tmp_path / f"worker-{n}.out"
    env = flask_env(database_uri)
    with spawn([*FLASK, "queue", "work", "--grace", GRACE], env, output) as proc:
        # Once it has started (its signal watch is on from before that line), at a
        # random moment of its claiming and completing: start-up takes seconds on a
        # loaded machine, where a SIGTERM before the watch would end it at once.
        wait_for(
            lambda: STARTED in output.read_text() or proc.poll() is not None,
            "the worker to start",
        )
        time.sleep(rng.uniform(0.0, 0.9))
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, EXIT_WITHIN, output)
    text = output.read_text()
    assert code == 0, text
    assert "SIGTERM: finishing running jobs" in text, text
    return text


@pytest.mark.slow
def test_a_storm_of_sigterms_stops_every_busy_worker_within_its_grace(
    make_app: Any, database_uri: str, tmp_path: Path
) -> None:
    app = make_app()
    with app.app_context():
        sample_app.add.enqueue_many([Call([i, i]) for i in range(30_000)])
    rng = random.Random(24)
    stops = 16 if database_uri.startswith("sqlite") else 8
    for n in range(stops):
        stop_one(database_uri, tmp_path, n, rng)
    # Nothing left running: every job a stopped worker held finished or went back.
    running = query(
        database_uri, "SELECT count(*) FROM sqlqueue_jobs WHERE status = :s", s="running"
    )
    assert running == [(0,)]
    completed = query(
        database_uri, "SELECT count(*) FROM sqlqueue_jobs WHERE status = :s", s="completed"
    )
    assert completed[0][0] > 0

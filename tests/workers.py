"""Real workers for tests: on a thread, always stopped and joined, its errors raised;
or as a ``flask queue work`` process, always killed and reaped if the test leaves it
running, whichever way the test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import ExitStack
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from flask_sqlqueue.core.worker import Worker
from tests.conftest import ROOT
from tests.conftest import flask_env
from tests.waiting import WAIT
from tests.waiting import scaled

#: ``flask`` with the interpreter running the tests.
FLASK = [sys.executable, "-m", "flask"]


def _start(worker: Worker, *, burst: bool, errors: list[BaseException]) -> threading.Thread:
    def target() -> None:
        try:
            worker.run(burst=burst)
        except BaseException as exc:  # raised in the test's thread, below
            errors.append(exc)

    name = "sqlqueue-test-burst" if burst else "sqlqueue-test-runner"
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


@contextmanager
def running(worker: Worker, *, burst: bool = False) -> Iterator[Worker]:
    """``worker.run()`` on a thread for the block; stopped and joined when it ends, and
    whatever the worker raised is raised here."""
    errors: list[BaseException] = []
    thread = _start(worker, burst=burst, errors=errors)
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(WAIT)
    assert not thread.is_alive(), "the worker did not stop"
    if errors:
        raise errors[0]


def run_burst(worker: Worker, timeout: float = WAIT) -> None:
    """``worker.run(burst=True)``, failing the test instead of hanging if it never returns."""
    errors: list[BaseException] = []
    thread = _start(worker, burst=True, errors=errors)
    thread.join(timeout)
    if thread.is_alive():
        worker.stop()
        thread.join(WAIT)
        pytest.fail(f"a burst run did not finish within {timeout:.0f}s")
    if errors:
        raise errors[0]


# -- worker processes ------------------------------------------------------------------------


@contextmanager
def spawn(
    args: list[str],
    env: dict[str, str],
    output: Path | None = None,
    *,
    new_session: bool = False,
    **popen: Any,
) -> Iterator[subprocess.Popen[Any]]:
    """Start ``args`` in the repository's root for the block, its stdout and stderr
    written to ``output`` if given (else as ``popen`` says); killed and reaped on the way
    out if it is still running. ``new_session`` puts it in a process group of its own,
    which the kill then ends whole (its children too)."""
    with ExitStack() as stack:
        if output is not None:
            out = stack.enter_context(open(output, "wb"))
            popen.update(stdout=out, stderr=subprocess.STDOUT)
        proc = subprocess.Popen(args, env=env, cwd=ROOT, start_new_session=new_session, **popen)
        try:
            yield proc
        finally:
            reap(proc, group=new_session)


def queue_work(
    database_uri: str,
    *args: str,
    env: dict[str, str] | None = None,
    output: Path | None = None,
    **popen: Any,
) -> AbstractContextManager[subprocess.Popen[Any]]:
    """``flask queue work ARGS`` on the test's database (the sample app, unless ``env``
    says otherwise), as :func:`spawn` runs it: a context manager yielding the process."""
    environ = flask_env(database_uri) if env is None else env
    return spawn([*FLASK, "queue", "work", *args], environ, output, **popen)


def reap(proc: subprocess.Popen[Any], *, group: bool = False) -> None:
    """Kill ``proc`` (its process group with ``group``) if it still runs, wait for it and
    close its pipes: none is left running or open after the test."""
    if proc.poll() is None:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    proc.wait(timeout=10)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def stop(proc: subprocess.Popen[Any], timeout: float = WAIT) -> Any:
    """SIGTERM ``proc``, as a service manager stops a worker, and wait ``timeout`` seconds
    for it to exit (else raise :class:`subprocess.TimeoutExpired`); what it wrote to a
    ``stderr`` pipe (``None`` without one). Its exit code is ``proc.returncode``."""
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=timeout)[1]


def wait_exit(proc: subprocess.Popen[Any], timeout: float, output: Path) -> int:
    """The exit code of ``proc``; fail if it runs longer than ``timeout`` seconds on a
    quiet machine, a deadline that stretches with the load while it waits (a burst whose
    jobs each start a child process takes many times longer on a busy machine)."""
    began, limit = time.monotonic(), timeout
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            limit = max(limit, scaled(timeout))
            if time.monotonic() - began > limit:
                break
    proc.kill()
    proc.wait(timeout=10)
    pytest.fail(f"process did not exit within {limit:.0f}s:\n{output.read_text()[-3000:]}")

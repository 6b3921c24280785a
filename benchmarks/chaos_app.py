"""The app the chaos suite runs as real ``flask queue work`` processes.

``FLASK_APP=benchmarks.chaos_app:create_app``; everything is configured by environment
variables so the harness can start workers, producers and ``flask queue status`` alike:

- ``CHAOS_DATABASE_URI``: the queue's database (required).
- ``CHAOS_SIDE_FILE``: tasks append ``start|done <job> <attempt> <pid> <unix time>`` lines
  here, one ``write()`` each (atomic with ``O_APPEND``), so the harness sees every run.
- ``CHAOS_STALE_AFTER`` (default 2), ``CHAOS_MAX_ATTEMPTS`` (5), ``CHAOS_BACKOFF_BASE`` (0):
  the matching ``SQLQUEUE_*`` settings (backoff jitter is always 0).
- ``CHAOS_BROKEN``: switch on a deliberately broken behaviour *in this process only*, to
  show that the suite's checks catch it. ``unfenced``: completions ignore the claim token.
  ``spending-release``: a job handed back at a graceful stop keeps the attempt it was
  claimed with (a hand-back that spends an attempt). This hook lives here and nowhere in
  ``flask_sqlqueue``.

Poison pills (each ``max_attempts=3``): ``chaos.poison_exit`` calls ``os._exit(1)``,
``chaos.poison_kill`` SIGKILLs its own worker, ``chaos.poison_memory`` lowers the
process's ``RLIMIT_AS`` to its current size plus a small headroom and allocates until
``MemoryError`` (bounded by a hard cap, so it never endangers the machine).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from datetime import datetime
from typing import Any

import click
import sqlalchemy as sa
from flask import Flask
from flask import current_app
from flask.cli import with_appcontext
from sqlalchemy.engine import Connection

from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job

queue = SQLQueue()

POISON_ATTEMPTS = 3
_CHUNK = 16 * 2**20


def _mark(kind: str) -> None:
    """Append one ``kind job attempt pid time`` line to the side file."""
    path = current_app.config["CHAOS_SIDE_FILE"]
    line = f"{kind} {current_job.id} {current_job.attempts} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@queue.task(name="chaos.work")
def work(ms: float) -> str:
    """A healthy job: sleeps ``ms`` milliseconds; returns ``"<pid>:<attempt>"``."""
    _mark("start")
    if ms:
        time.sleep(ms / 1000)
    _mark("done")
    return f"{os.getpid()}:{current_job.attempts}"


@queue.task(name="chaos.poison_exit", max_attempts=POISON_ATTEMPTS)
def poison_exit() -> None:
    """Ends its worker process at once, as a segfaulting C extension would."""
    _mark("start")
    os._exit(1)


@queue.task(name="chaos.poison_kill", max_attempts=POISON_ATTEMPTS)
def poison_kill() -> None:
    """SIGKILLs its own worker, as the kernel's OOM killer would."""
    _mark("start")
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)  # not reached


def _address_space() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * resource.getpagesize()


@queue.task(name="chaos.poison_memory", max_attempts=POISON_ATTEMPTS)
def poison_memory(headroom_mb: int = 256) -> None:
    """Exhausts memory under a lowered ``RLIMIT_AS``: allocates until ``MemoryError``.

    The limit is this process's current address space plus ``headroom_mb``, restored
    before the error propagates; the allocation never exceeds 4 x ``headroom_mb`` even if
    the limit could not be set.
    """
    _mark("start")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + headroom_mb * 2**20
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    chunks: list[bytearray] = []
    try:
        for _ in range(4 * headroom_mb * 2**20 // _CHUNK):
            chunks.append(bytearray(_CHUNK))
    except MemoryError:
        allocated = len(chunks) * _CHUNK // 2**20
        chunks.clear()
        raise MemoryError(
            f"chaos: out of memory after {allocated} MB under RLIMIT_AS={limit // 2**20} MB"
        ) from None
    finally:
        chunks.clear()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    raise RuntimeError("RLIMIT_AS did not stop the allocation")


@click.command("chaos-produce")
@click.option("--count", type=click.IntRange(0), required=True, help="Jobs to enqueue.")
@click.option("--ms", type=click.FloatRange(0), default=0.0, help="Duration of each job.")
@with_appcontext
def produce_command(count: int, ms: float) -> None:
    """Enqueue COUNT ``chaos.work`` jobs, one transaction each; print a JSON summary."""
    started = time.monotonic()
    first = last = None
    for _ in range(count):
        job = work.enqueue(ms)
        first = job.id if first is None else first
        last = job.id
    seconds = time.monotonic() - started
    click.echo(json.dumps({"enqueued": count, "seconds": seconds, "first": first, "last": last}))


def _install_broken(mode: str) -> None:
    """Deliberately break this process, so the chaos checks can be shown to fail."""
    from flask_sqlqueue.core import transitions
    from flask_sqlqueue.core.models import jobs

    if mode == "unfenced":

        def unfenced_complete(
            conn: Connection,
            job_id: int,
            token: str,
            result: str | None,
            now: datetime,
            **_: Any,
        ) -> bool:
            del token  # the bug: the claim token is not checked
            done = conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == job_id)
                .values(
                    status="completed",
                    result=result,
                    finished_at=now,
                    updated_at=now,
                    claim_token=None,
                )
            )
            return done.rowcount == 1

        def unfenced_complete_many(
            conn: Connection, ops: Any, done: Any, now: datetime
        ) -> set[int]:
            del ops
            return {
                job_id
                for job_id, token, result in done
                if unfenced_complete(conn, job_id, token, result, now)
            }

        transitions.complete = unfenced_complete
        transitions.complete_many = unfenced_complete_many
    elif mode == "spending-release":
        release = transitions.release

        def spending_release(conn: Connection, job_id: int, token: str, now: datetime) -> bool:
            released = release(conn, job_id, token, now)
            if released:  # the bug: the attempt given back is taken again
                conn.execute(
                    sa.update(jobs).where(jobs.c.id == job_id).values(attempts=jobs.c.attempts + 1)
                )
            return released

        transitions.release = spending_release
    else:
        raise click.UsageError(
            f"CHAOS_BROKEN={mode!r} is not a known broken mode (unfenced, spending-release)."
        )


def create_app(config: dict[str, Any] | None = None) -> Flask:
    env = os.environ
    app = Flask(__name__)
    app.config.update(
        SQLQUEUE_DATABASE_URI=env.get("CHAOS_DATABASE_URI"),
        SQLQUEUE_STALE_AFTER=float(env.get("CHAOS_STALE_AFTER", "2")),
        SQLQUEUE_MAX_ATTEMPTS=int(env.get("CHAOS_MAX_ATTEMPTS", "5")),
        # As many crashes as attempts: a job killed by the storm, not by itself, must
        # not be quarantined sooner than the scenarios expect it to go dead.
        SQLQUEUE_MAX_CRASHES=int(env.get("CHAOS_MAX_ATTEMPTS", "5")),
        SQLQUEUE_BACKOFF_BASE=float(env.get("CHAOS_BACKOFF_BASE", "0")),
        SQLQUEUE_BACKOFF_JITTER=0,
        CHAOS_SIDE_FILE=env.get("CHAOS_SIDE_FILE", os.devnull),
    )
    app.config.update(config or {})
    if not app.config["SQLQUEUE_DATABASE_URI"]:
        raise RuntimeError("set CHAOS_DATABASE_URI to the queue's database URL")
    queue.init_app(app)
    app.cli.add_command(produce_command)
    broken = env.get("CHAOS_BROKEN")
    if broken and config is None:  # only in processes the harness starts (flask CLI)
        _install_broken(broken)
    return app

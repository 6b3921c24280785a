"""The chaos suite: real ``flask queue work`` processes, real databases, real signals.

::

    python benchmarks/chaos.py --database-url sqlite:/// --duration 60 --scenario all
    python benchmarks/chaos.py --database-url sqlite:/// --duration 300 --scenario kill-storm
    python benchmarks/chaos.py --database-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --duration 30 --scenario kill-storm

Scenarios (each on a database of its own; for a server URL the script creates a fresh
database and drops it afterwards, for SQLite it uses a new file in the work directory):

``kill-storm``
    N jobs, W workers x T threads; every ``--kill-every`` seconds a random worker is
    SIGKILLed and restarted, during ``--duration`` seconds or until every job is done,
    whichever comes first; then the queue is left to finish without kills.
    ``--kill-target ready`` picks only among workers that have started.
``paused``
    A worker is SIGSTOPped mid-job past STALE_AFTER; another rescues and completes the
    job; on SIGCONT the paused worker's late completion must change nothing.
``sigterm``
    SIGTERM with a short and a long job: the short one finishes, the long one is handed
    back with attempts unchanged and runs once more later; an idle worker exits within
    one poll interval.
``poison``
    Jobs that ``os._exit(1)``, SIGKILL their own worker, or exhaust memory each end
    ``dead`` after exactly max_attempts while healthy jobs beside them all complete
    (the harness restarts workers that die).
``busy``
    P producer processes x E enqueues, W workers and a ``flask queue status`` poller on
    one database: no "database is locked" reaches any process, every job runs exactly
    once, and SQLite's ``PRAGMA integrity_check`` is ok.
``outage``
    The database becomes unavailable for ``--outage`` seconds while workers run (SQLite:
    another connection holds ``BEGIN EXCLUSIVE``; PostgreSQL: connections refused and
    existing ones terminated; MariaDB: the database's own account locked and its
    connections killed): workers stay alive, no attempt is consumed, nothing is lost.

Tasks append ``start|done <job> <attempt> <pid> <time>`` lines to a side file (see
``benchmarks/chaos_app.py``); the harness compares them with the job rows, its own record
of every signal it sent, and each process's log. A scenario prints a Markdown table of
figures and the violations it found; the script exits 1 if any scenario found one.

Definitions used in the tables:

- *duplicate execution*: a start line of a job beyond its first.
- *explained by a kill*: the earlier start came from a worker the harness SIGKILLed after
  that start, and that run either wrote no ``done`` line or wrote it at most 10 s before
  the kill (the task finished but its completion was not yet committed).
- *rescue latency, kill -> rescued*: from the SIGKILL of a worker to the rescuing
  worker's log line ``job=N rescued from lost worker W``, for every job it held. It spans
  STALE_AFTER and the rescuer's heartbeat period.
- *rescue latency, kill -> next start*: from the SIGKILL to the next ``start`` line of each
  job the killed worker had started and not finished. It adds the wait for a free thread;
  a rescued job keeps its ``run_at``, so it goes ahead of jobs that became due later.
- *the attempt holding the claim*: a completed job's result names the pid and attempt of
  the run that recorded it, and must be its latest attempt (``attempts``), with a done line.

Every wait is bounded; every child process is killed on the way out (and, on Linux, by
the kernel if the harness itself dies: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import math
import os
import platform
import random
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from types import TracebackType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/chaos.py` from anywhere
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from benchmarks import chaos_app  # noqa: E402
from flask_sqlqueue.core.models import jobs as jobs_table  # noqa: E402

APP = "benchmarks.chaos_app:create_app"
FLASK = [sys.executable, "-m", "flask"]
SCENARIOS = ("kill-storm", "paused", "sigterm", "poison", "busy", "outage")

LOCKED = re.compile(r"database (?:table )?is locked", re.IGNORECASE)
TRACEBACK = "Traceback (most recent call last)"
#: SQLAlchemy's pool logs (with a traceback) a failed rollback of a connection the server
#: killed; the connection is discarded and nothing reaches the caller.
POOL_RESET = "sqlalchemy.pool.impl.QueuePool: Exception during reset or similar"
FENCED = re.compile(r"job=(\d+) task=\S+ attempt=(\d+)/\d+(?: key=\S+)?: lost its claim")
RELEASED = re.compile(r"job=(\d+) released unfinished at shutdown")
SELF_STOP = re.compile(
    r"lost its heartbeat|cannot heartbeat|declared dead(?: by another worker)?(?:; \S+ as \S+)?"
)
STARTED = re.compile(r"worker \S+ started: ")
#: A run that wrote its done line at most this long before its worker was killed is still
#: "explained by the kill": its completion had not been committed yet.
DONE_BEFORE_KILL = 10.0


class ChaosError(Exception):
    """The harness itself could not run a scenario (not a finding about the queue)."""


# -- results ------------------------------------------------------------------------------


@dataclass
class ScenarioResult:
    """What one scenario measured and every violation of the contract it saw."""

    name: str
    backend: str
    figures: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    workdir: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, name: str, value: object) -> None:
        self.figures.append((name, str(value)))

    def check(self, condition: bool, violation: str) -> bool:
        if not condition:
            self.violations.append(violation)
        return condition

    def markdown(self) -> str:
        lines = [f"## {self.name} ({self.backend})", ""]
        if self.skipped:
            return "\n".join([*lines, f"Skipped: {self.skipped}", ""])
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {name} | {_cell(value)} |" for name, value in self.figures]
        verdict = "PASS" if self.ok else f"FAIL ({len(self.violations)} violation(s))"
        lines += ["", f"**Verdict: {verdict}**"]
        if self.violations:
            lines += ["", "Violations:", ""]
            lines += [f"- {_cell(text)}" for text in self.violations[:40]]
            if len(self.violations) > 40:
                lines.append(f"- ... and {len(self.violations) - 40} more")
        if self.notes:
            lines += ["", *[f"- {note}" for note in self.notes]]
        return "\n".join([*lines, ""])


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; ``nan`` for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "n/a (no sample)"
    return (
        f"{percentile(values, 50):.2f} s / {percentile(values, 95):.2f} s / "
        f"{max(values):.2f} s (n={len(values)})"
    )


# -- databases ------------------------------------------------------------------------------


def backend_of(url: str) -> str:
    return sa.make_url(url).get_backend_name()


@contextlib.contextmanager
def fresh_database(base_url: str, workdir: Path, label: str) -> Iterator[str]:
    """A new, empty database for one scenario, dropped (or left as a file) afterwards.

    On MariaDB/MySQL it also gets an account of its own (``name@127.0.0.1``, privileges
    on that database only), so an outage can lock that account without touching anyone
    else's connections.
    """
    url = sa.make_url(base_url)
    if url.get_backend_name() == "sqlite":
        yield f"sqlite:///{workdir / (label + '.db')}"
        return
    name = f"chaos_{re.sub(r'[^a-z0-9]', '_', label.lower())}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    mysql = admin.dialect.name == "mysql"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
            own = url.set(database=name)
            if mysql:
                password = uuid.uuid4().hex
                conn.exec_driver_sql(f"CREATE USER '{name}'@'127.0.0.1' IDENTIFIED BY '{password}'")
                conn.exec_driver_sql(f"GRANT ALL PRIVILEGES ON {name}.* TO '{name}'@'127.0.0.1'")
                own = own.set(username=name, password=password, host="127.0.0.1")
        try:
            yield own.render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                if not mysql:
                    # An outage may have left connections refused; allow them to drop.
                    conn.exec_driver_sql(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                else:
                    conn.exec_driver_sql("SET SESSION lock_wait_timeout = 60")
                    _kill_mysql_connections(conn, name)
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
                    conn.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'127.0.0.1'")
    finally:
        admin.dispose()


def _kill_mysql_connections(conn: sa.Connection, user: str) -> int:
    ids = conn.execute(
        sa.text(
            "SELECT ID FROM information_schema.PROCESSLIST "
            "WHERE USER = :user AND ID <> CONNECTION_ID()"
        ),
        {"user": user},
    ).scalars()
    killed = 0
    for conn_id in list(ids):
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.exec_driver_sql(f"KILL CONNECTION {int(conn_id)}")
            killed += 1
    return killed


# -- processes --------------------------------------------------------------------------------

_libc: Any = None
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not Linux
    _libc = None


def _die_with_parent() -> None:
    """In the child: SIGKILL me if the harness dies (PR_SET_PDEATHSIG), so none linger."""
    if _libc is not None and sys.platform.startswith("linux"):
        _libc.prctl(1, signal.SIGKILL)


@dataclass(eq=False)
class Proc:
    """A child process and what the harness did to it."""

    role: str
    popen: subprocess.Popen[bytes]
    log: Path
    spawned: float
    ended: float | None = None
    killed_at: float | None = None  # SIGKILL sent by the harness
    terminated_at: float | None = None  # SIGTERM sent by the harness
    stopped_at: float | None = None  # SIGSTOP sent by the harness

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is not None and self.ended is None:
            self.ended = time.time()
        return code

    @property
    def alive(self) -> bool:
        return self.poll() is None

    @property
    def crashed(self) -> bool:
        """Exited non-zero with no SIGKILL or SIGTERM from the harness."""
        code = self.poll()
        return (
            code is not None and code != 0 and self.killed_at is None and self.terminated_at is None
        )

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, n: int = 6) -> str:
        return " / ".join(self.text().strip().splitlines()[-n:])

    def ready(self) -> bool:
        return STARTED.search(self.text()) is not None


@dataclass(frozen=True, slots=True)
class Mark:
    """One side-file line: a task run started or finished."""

    kind: str
    job: int
    attempt: int
    pid: int
    at: float


def read_marks(path: Path) -> tuple[list[Mark], int]:
    """The side file's lines, and how many were malformed."""
    marks: list[Mark] = []
    bad = 0
    if not path.exists():
        return marks, bad
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        try:
            kind, job, attempt, pid, at = parts
            marks.append(Mark(kind, int(job), int(attempt), int(pid), float(at)))
        except ValueError:
            bad += 1
    return marks, bad


class Harness:
    """One scenario's database, app, child processes and side file.

    A context manager: on the way out every child still running is SIGKILLed and reaped,
    the harness's engine disposed and a server database dropped.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        workdir: Path,
        *,
        stale_after: float = 2.0,
        max_attempts: int = 5,
        broken: str | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.side = self.dir / "side.log"
        self.stale_after = stale_after
        self.max_attempts = max_attempts
        self.broken = broken
        self.procs: list[Proc] = []
        self.url = ""
        self.app: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Harness:
        try:
            self.url = self._stack.enter_context(fresh_database(self.base_url, self.dir, "queue"))
            self._stack.callback(self.kill_all)
            self.app = chaos_app.create_app(
                {
                    "SQLQUEUE_DATABASE_URI": self.url,
                    "SQLQUEUE_STALE_AFTER": self.stale_after,
                    "SQLQUEUE_MAX_ATTEMPTS": self.max_attempts,
                    "CHAOS_SIDE_FILE": str(self.side),
                }
            )
            self._stack.callback(self.store.engine.dispose)
            chaos_app.queue.upgrade_database(app=self.app)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    @property
    def store(self) -> Any:
        return self.app.extensions["sqlqueue"].store

    @property
    def backend(self) -> str:
        return backend_of(self.url)

    # -- children ---------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FLASK_", "CHAOS_", "SQLQUEUE_"))
        }
        env.update(
            FLASK_APP=APP,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
            CHAOS_DATABASE_URI=self.url,
            CHAOS_SIDE_FILE=str(self.side),
            CHAOS_STALE_AFTER=f"{self.stale_after:g}",
            CHAOS_MAX_ATTEMPTS=str(self.max_attempts),
            CHAOS_BACKOFF_BASE="0",
        )
        if self.broken:
            env["CHAOS_BROKEN"] = self.broken
        env.update(extra)
        return env

    def spawn(self, role: str, args: list[str], **extra_env: str) -> Proc:
        n = sum(1 for p in self.procs if p.role == role)
        log = self.dir / f"{role}-{n}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                args,
                cwd=ROOT,
                env=self.env(**extra_env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # the harness spawns from one thread only
            )
        proc = Proc(role, popen, log, time.time())
        self.procs.append(proc)
        return proc

    def spawn_worker(
        self, threads: int = 2, *, grace: float = 5.0, poll: float = 0.2, **extra_env: str
    ) -> Proc:
        args = [*FLASK, "queue", "work", "--concurrency", str(threads)]
        args += ["--grace", f"{grace:g}", "--poll-interval", f"{poll:g}"]
        return self.spawn("worker", args, **extra_env)

    @property
    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "worker"]

    def send(self, proc: Proc, sig: signal.Signals) -> float:
        at = time.time()
        if sig == signal.SIGKILL:
            proc.killed_at = at
        elif sig == signal.SIGTERM:
            proc.terminated_at = at
        elif sig == signal.SIGSTOP:
            proc.stopped_at = at
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.popen.send_signal(sig)
        return at

    def kill(self, proc: Proc) -> float:
        at = self.send(proc, signal.SIGKILL)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired as exc:  # pragma: no cover - the kernel's job
            raise ChaosError(f"pid {proc.pid} survived SIGKILL for 10 s") from exc
        proc.poll()
        return at

    def stop(self, procs: Sequence[Proc], timeout: float) -> dict[Proc, int | None]:
        """SIGTERM each, wait up to ``timeout``; ``None`` for one that had to be SIGKILLed.

        A worker still starting up is given up to 30 s to finish first: before the CLI
        installs its handler, SIGTERM just ends the process (-15), which says nothing
        about the queue.
        """
        booting = [p for p in procs if p.role == "worker" and p.alive]
        wait_for(lambda: all(p.ready() or not p.alive for p in booting), 30, 0.1)
        live = [p for p in procs if p.alive]
        for proc in live:
            self.send(proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        codes: dict[Proc, int | None] = {}
        for proc in live:
            try:
                codes[proc] = proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(proc)
                codes[proc] = None
            proc.poll()
        return codes

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.popen.kill()
                proc.killed_at = proc.killed_at or time.time()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)
            proc.poll()

    # -- the database -------------------------------------------------------------------------

    def enqueue(self, items: Sequence[tuple[Any, tuple[Any, ...]]]) -> list[int]:
        """Enqueue ``(task, args)`` pairs in one transaction; their ids in order."""
        with self.app.app_context(), self.store.write() as conn:
            return [task.using(session=conn).enqueue(*args).id for task, args in items]

    def rows(self) -> list[Any]:
        with self.store.read() as conn:
            return list(conn.execute(sa.select(jobs_table).order_by(jobs_table.c.id)).all())

    def counts(self) -> collections.Counter[str]:
        with self.store.read() as conn:
            rows = conn.execute(
                sa.select(jobs_table.c.status, sa.func.count()).group_by(jobs_table.c.status)
            ).all()
        return collections.Counter({status: n for status, n in rows})

    def marks(self) -> tuple[list[Mark], int]:
        return read_marks(self.side)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def _errors(row: Any) -> list[dict[str, Any]]:
    try:
        items = json.loads(row.errors or "[]")
    except ValueError:
        return []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _worker_pid(worker_id: object) -> int | None:
    """The pid in a worker id ``host:pid:suffix``."""
    parts = str(worker_id).rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def _result(row: Any) -> Any:
    try:
        return None if row.result is None else json.loads(row.result)
    except ValueError:
        return row.result


# -- analysis shared by the scenarios ----------------------------------------------------------


@dataclass
class RunAnalysis:
    """How the task runs in the side file relate to what the harness did."""

    starts: int = 0
    duplicates: int = 0  # start lines beyond the first of each job
    jobs_rerun: int = 0
    causes: collections.Counter[str] = field(default_factory=collections.Counter)
    unexplained: list[str] = field(default_factory=list)
    attempt_twice: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    interrupted: int = 0  # runs cut short by a kill or a crash
    not_restarted: int = 0  # interrupted runs whose job never started again


def owner(mark: Mark, procs: Sequence[Proc]) -> Proc | None:
    """The process that wrote ``mark``: same pid, alive at that time (pids get reused)."""
    best = None
    for proc in procs:
        if proc.pid != mark.pid or proc.spawned > mark.at + 0.5:
            continue
        if proc.ended is not None and proc.ended < mark.at - 0.5:
            continue
        if best is None or proc.spawned > best.spawned:
            best = proc
    return best


def log_events(procs: Sequence[Proc]) -> tuple[set[tuple[int, int, int]], set[tuple[int, int]]]:
    """From worker logs: fenced outcomes ``(job, attempt, pid)`` and releases ``(job, pid)``."""
    fenced: set[tuple[int, int, int]] = set()
    released: set[tuple[int, int]] = set()
    for proc in procs:
        text = proc.text()
        fenced |= {(int(j), int(a), proc.pid) for j, a in FENCED.findall(text)}
        released |= {(int(j), proc.pid) for j in RELEASED.findall(text)}
    return fenced, released


def analyze_runs(
    marks: Sequence[Mark], procs: Sequence[Proc], job_ids: Sequence[int]
) -> RunAnalysis:
    """Count duplicate executions of ``job_ids`` and explain each one, or not.

    An earlier run of a job (every start but the last) is explained by:

    - ``kill``: its worker was SIGKILLed by the harness after the start, and the run
      wrote no done line or wrote it at most ``DONE_BEFORE_KILL`` s before the kill;
    - ``crash``: its worker died on its own (a poison pill) after the start;
    - ``released``: its worker released the job on SIGTERM (logged);
    - ``fenced``: its worker was alive but lost the claim (a late heartbeat got it
      rescued) and its worker logged that its outcome was dropped.

    Anything else is unexplained. Two starts with the same attempt number are only
    allowed across a release (which gives the attempt back).
    """
    wanted = set(job_ids)
    starts: dict[int, list[Mark]] = collections.defaultdict(list)
    dones: dict[tuple[int, int, int], Mark] = {}
    for mark in marks:
        if mark.job not in wanted:
            continue
        if mark.kind == "start":
            starts[mark.job].append(mark)
        elif mark.kind == "done":
            dones[(mark.job, mark.attempt, mark.pid)] = mark
    fenced, released = log_events(procs)
    result = RunAnalysis()
    for job in sorted(wanted):
        runs = sorted(starts.get(job, []), key=lambda m: m.at)
        result.starts += len(runs)
        if len(runs) > 1:
            result.duplicates += len(runs) - 1
            result.jobs_rerun += 1
        seen: dict[int, Mark] = {}
        for run in runs:
            earlier = seen.get(run.attempt)
            if earlier is not None and (job, earlier.pid) not in released:
                result.attempt_twice.append(
                    f"job {job} attempt {run.attempt} started twice "
                    f"(pid {earlier.pid} at {earlier.at:.3f}, pid {run.pid} at {run.at:.3f})"
                )
            seen[run.attempt] = run
        for run in runs[:-1]:
            cause = _explain(run, owner(run, procs), dones, fenced, released)
            result.causes[cause] += 1
            if cause == "unexplained":
                proc = owner(run, procs)
                result.unexplained.append(
                    f"job {job} attempt {run.attempt} ran on pid {run.pid} at {run.at:.3f} and "
                    f"again later, with no kill, crash, release or fenced outcome to explain it "
                    f"(process: {'unknown' if proc is None else proc.role}, "
                    f"done line: {'yes' if (job, run.attempt, run.pid) in dones else 'no'})"
                )
    # Rescue latency: from each kill or crash to the next start of every interrupted job.
    by_pid: dict[int, list[Mark]] = collections.defaultdict(list)
    for runs in starts.values():
        for run in runs:
            by_pid[run.pid].append(run)
    for proc in procs:
        if proc.role != "worker":
            continue
        died = proc.killed_at
        if died is None and proc.crashed:
            died = proc.ended
        if died is None:
            continue
        for run in by_pid.get(proc.pid, []):
            if run.at > died or owner(run, procs) is not proc:
                continue
            done = dones.get((run.job, run.attempt, run.pid))
            if done is not None and done.at <= died:
                continue
            result.interrupted += 1
            later = [m.at for m in starts[run.job] if m.at > died]
            if later:
                result.latencies.append(min(later) - died)
            else:
                result.not_restarted += 1
    return result


RESCUE_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ flask_sqlqueue\.worker: "
    r"job=(\d+) rescued from lost worker (\S+): now (\w+)",
    re.MULTILINE,
)


def rescue_delays(procs: Sequence[Proc]) -> list[float]:
    """From each harness SIGKILL (or crash) of a worker to the rescue of each of its jobs,
    as logged by the rescuing worker ("job=N rescued from lost worker ID")."""
    by_pid: dict[int, list[Proc]] = collections.defaultdict(list)
    for proc in procs:
        if proc.role == "worker":
            by_pid[proc.pid].append(proc)
    delays = []
    for proc in procs:
        for stamp, _job, worker, _status in RESCUE_LINE.findall(proc.text()):
            at = (
                time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:]) / 1000
            )
            pid = _worker_pid(worker)
            lost = [p for p in by_pid.get(pid or -1, []) if p.spawned <= at]
            if not lost:
                continue
            victim = max(lost, key=lambda p: p.spawned)
            died = victim.killed_at if victim.killed_at is not None else victim.ended
            if died is not None and died <= at:
                delays.append(at - died)
    return delays


def _explain(
    run: Mark,
    proc: Proc | None,
    dones: dict[tuple[int, int, int], Mark],
    fenced: set[tuple[int, int, int]],
    released: set[tuple[int, int]],
) -> str:
    if proc is None:
        return "unexplained"
    done = dones.get((run.job, run.attempt, run.pid))
    if proc.killed_at is not None and proc.killed_at >= run.at:
        if done is None or proc.killed_at - done.at <= DONE_BEFORE_KILL:
            return "kill"
    if proc.crashed and proc.ended is not None and proc.ended >= run.at:
        return "crash"
    if (run.job, run.pid) in released:
        return "released"
    if (run.job, run.attempt, run.pid) in fenced:
        return "fenced"
    return "unexplained"


def check_completed(
    result: ScenarioResult,
    rows: Sequence[Any],
    marks: Sequence[Mark],
    job_ids: Sequence[int],
    *,
    once: bool = False,
) -> None:
    """Every job in ``job_ids`` completed, its outcome recorded by the attempt holding the
    claim; every attempt beyond the first left an error record. With ``once``: exactly one
    attempt, one start and one done line per job."""
    wanted = set(job_ids)
    by_id = {row.id: row for row in rows if row.id in wanted}
    done_marks = {(m.job, m.attempt, m.pid) for m in marks if m.kind == "done"}
    starts = collections.Counter(m.job for m in marks if m.kind == "start" and m.job in wanted)
    dones = collections.Counter(m.job for m in marks if m.kind == "done" and m.job in wanted)
    statuses = collections.Counter(row.status for row in by_id.values())
    missing = wanted - set(by_id)
    result.add("jobs completed", f"{statuses.get('completed', 0)} of {len(wanted)}")
    lost = len(wanted) - statuses.get("completed", 0)
    result.add("jobs lost (not completed)", lost)
    result.add(
        "left pending / running / dead",
        f"{statuses.get('pending', 0)} / {statuses.get('running', 0)} / {statuses.get('dead', 0)}",
    )
    result.check(not missing, f"{len(missing)} job row(s) disappeared: {sorted(missing)[:10]}")
    not_completed = sorted(r.id for r in by_id.values() if r.status != "completed")
    result.check(
        not not_completed,
        f"{len(not_completed)} job(s) not completed: "
        + ", ".join(f"{i} ({by_id[i].status}, {by_id[i].last_error})" for i in not_completed[:10]),
    )
    wrong_outcome = []
    bad_history = []
    for row in by_id.values():
        if row.status != "completed":
            continue
        value = _result(row)
        pid, _, attempt = str(value).partition(":")
        if (
            not attempt.isdigit()
            or int(attempt) != row.attempts
            or (row.id, row.attempts, int(pid or 0)) not in done_marks
        ):
            wrong_outcome.append(f"{row.id} (result {value!r}, attempts {row.attempts})")
        if len(_errors(row)) != row.attempts - 1 or row.rescues > row.attempts - 1:
            bad_history.append(
                f"{row.id} (attempts {row.attempts}, rescues {row.rescues}, "
                f"errors {len(_errors(row))})"
            )
    result.add(
        "outcome recorded by the attempt holding the claim",
        f"{len(by_id) - len(wrong_outcome)} of {len(by_id)}",
    )
    result.check(
        not wrong_outcome,
        f"{len(wrong_outcome)} job(s) completed with an outcome not from their latest "
        f"attempt (a stale run's completion got through): {wrong_outcome[:10]}",
    )
    result.check(
        not bad_history,
        f"{len(bad_history)} job(s) whose extra attempts left no error record: {bad_history[:10]}",
    )
    if once:
        twice = sorted(i for i in wanted if starts[i] != 1 or dones[i] != 1)
        result.add("jobs run exactly once", f"{len(wanted) - len(twice)} of {len(wanted)}")
        result.check(
            not twice,
            f"{len(twice)} job(s) not run exactly once: "
            + ", ".join(f"{i} ({starts[i]} starts, {dones[i]} dones)" for i in twice[:10]),
        )
        more = sorted(r.id for r in by_id.values() if r.attempts != 1)
        result.add("jobs with attempts == 1", f"{len(by_id) - len(more)} of {len(by_id)}")
        result.check(
            not more,
            f"{len(more)} job(s) consumed more than one attempt: "
            + ", ".join(f"{i} ({by_id[i].attempts}: {by_id[i].last_error})" for i in more[:10]),
        )


def check_logs(result: ScenarioResult, procs: Sequence[Proc], *, tracebacks: bool = True) -> None:
    """No "database is locked" in any process's output; no traceback in a worker's."""
    locked = [p for p in procs if LOCKED.search(p.text())]
    result.add("processes that saw 'database is locked'", f"{len(locked)} of {len(procs)}")
    result.check(
        not locked,
        "'database is locked' reached: "
        + "; ".join(f"{p.role} pid {p.pid}: {_first(LOCKED, p.text())}" for p in locked[:5]),
    )
    if tracebacks:
        benign = 0
        traced = []
        for proc in procs:
            lines = proc.text().splitlines()
            spots = [i for i, line in enumerate(lines) if line.startswith(TRACEBACK)]
            pool = [i for i in spots if i and POOL_RESET in lines[i - 1]]
            benign += len(pool)
            if len(spots) > len(pool):
                traced.append(proc)
        result.add("processes with a traceback in their output", len(traced))
        if benign:
            result.add("SQLAlchemy pool tracebacks (rollback on a killed connection)", benign)
        result.check(
            not traced,
            "tracebacks in: "
            + "; ".join(f"{p.role} pid {p.pid} ({p.log.name}): {p.tail(3)}" for p in traced[:5]),
        )


def _first(pattern: re.Pattern[str], text: str) -> str:
    for line in text.splitlines():
        if pattern.search(line):
            return line.strip()[:300]
    return ""


def _explain_figures(result: ScenarioResult, runs: RunAnalysis) -> None:
    result.add("task executions (start lines)", runs.starts)
    result.add(
        "duplicate executions (jobs run more than once)", f"{runs.duplicates} ({runs.jobs_rerun})"
    )
    explained = ", ".join(f"{cause}: {n}" for cause, n in sorted(runs.causes.items())) or "-"
    result.add("duplicates by cause", explained)
    result.check(
        not runs.unexplained,
        f"{len(runs.unexplained)} unexplained duplicate execution(s): {runs.unexplained[:5]}",
    )
    result.check(not runs.attempt_twice, f"same attempt run twice: {runs.attempt_twice[:5]}")


def _self_exits(procs: Sequence[Proc]) -> list[Proc]:
    return [
        p
        for p in procs
        if p.role == "worker"
        and p.poll() is not None
        and p.killed_at is None
        and p.terminated_at is None
    ]


# -- 1. kill storm ---------------------------------------------------------------------------------


def kill_storm(
    base_url: str,
    workdir: Path,
    *,
    jobs: int = 2000,
    duration: float = 60.0,
    workers: int = 4,
    threads: int = 2,
    kill_every: float = 0.5,
    target: str = "any",
    job_ms: tuple[float, float] = (20.0, 200.0),
    stale_after: float = 2.0,
    max_attempts: int = 20,
    seed: int = 1,
    settle_timeout: float | None = None,
) -> ScenarioResult:
    """SIGKILL a random worker every ``kill_every`` s (and restart it) during ``duration``
    seconds or until every job is done; then let the queue finish without kills.

    ``target="any"`` picks among all worker processes, including ones still starting up;
    ``"ready"`` only among those that have logged that they started (a tick with none
    ready is skipped), so that every kill lands on a worker that may be running jobs.
    """
    if target not in ("any", "ready"):
        raise ValueError(f"target must be 'any' or 'ready', not {target!r}")
    rng = random.Random(seed)
    result = ScenarioResult("Kill storm", backend_of(base_url))
    with Harness(
        "kill-storm", base_url, workdir, stale_after=stale_after, max_attempts=max_attempts
    ) as h:
        result.workdir = h.dir
        durations = [rng.uniform(*job_ms) for _ in range(jobs)]
        ids = h.enqueue([(chaos_app.work, (round(ms, 1),)) for ms in durations])
        result.add(
            "jobs",
            f"{jobs} x {job_ms[0]:g}-{job_ms[1]:g} ms "
            f"(mean {sum(durations) / max(jobs, 1):.0f} ms)",
        )
        result.add("workers", f"{workers} x {threads} threads, STALE_AFTER={stale_after:g} s")
        if settle_timeout is None:
            work_s = sum(durations) / 1000 / (workers * threads)
            settle_timeout = 60 + 4 * work_s + 10 * stale_after
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        # The kill window opens once the first workers are up: killing a fleet that is
        # still importing would test nothing.
        if not wait_for(lambda: all(p.ready() or not p.alive for p in pool), 120, 0.05):
            raise ChaosError(f"workers did not start within 120 s: {pool[0].tail()}")
        opened = time.time()
        result.add("workers up after", f"{opened - started:.1f} s (the kill window opens)")
        kills: list[tuple[float, Proc]] = []
        skipped = 0
        self_exits: list[str] = []
        kill_end = time.monotonic() + duration
        next_kill = time.monotonic() + kill_every
        hard_end = kill_end + settle_timeout
        next_count = 0.0
        finished_at: float | None = None
        kill_window_end: float | None = None
        while True:
            now = time.monotonic()
            for i, proc in enumerate(pool):
                if proc.poll() is not None:  # died without our help: record, replace
                    self_exits.append(
                        f"pid {proc.pid} exited {proc.popen.returncode}: {proc.tail()}"
                    )
                    pool[i] = h.spawn_worker(threads)
            if now >= next_count:
                counts = h.counts()
                next_count = now + 0.25
                if counts.get("completed", 0) + counts.get("dead", 0) >= jobs:
                    finished_at = time.time()
                    break
            if now >= kill_end and kill_window_end is None:
                kill_window_end = time.time()
            if now < kill_end and now >= next_kill:
                next_kill += kill_every
                choices = [
                    i for i, p in enumerate(pool) if target == "any" or (p.alive and p.ready())
                ]
                if choices:
                    i = rng.choice(choices)
                    kills.append((h.kill(pool[i]), pool[i]))
                    pool[i] = h.spawn_worker(threads)
                else:
                    skipped += 1
            if now >= hard_end:
                result.violations.append(
                    f"not every job finished within {settle_timeout:.0f} s after the kill window"
                )
                break
            time.sleep(0.02)
        if kill_window_end is None:
            kill_window_end = finished_at or time.time()
        end = finished_at or time.time()
        survivors = [p for p in pool if p.alive]
        codes = h.stop(survivors, timeout=30)
        rows = h.rows()
        marks, bad = h.marks()
        runs = analyze_runs(marks, h.workers, ids)

        window = kill_window_end - opened
        why = (
            "all jobs done"
            if finished_at and finished_at <= kill_window_end + 0.5
            else "--duration"
        )
        result.add("kill window", f"{window:.1f} s (ended by {why}); total {end - started:.1f} s")
        result.add(
            "SIGKILLs (each worker restarted)",
            f"{len(kills)} (every {kill_every:g} s, target: {target} worker"
            + (f"; {skipped} ticks skipped, no worker ready" if target == "ready" else "")
            + ")",
        )
        result.add("runs interrupted by a kill", runs.interrupted)
        check_completed(result, rows, marks, ids)
        _explain_figures(result, runs)
        result.add("rescues recorded (sum of rescues)", sum(r.rescues for r in rows))
        result.add(
            "rescue latency p50 / p95 / max: kill -> job rescued (pending again)",
            _seconds(rescue_delays(h.procs)),
        )
        result.add(
            "rescue latency p50 / p95 / max: kill -> job's next start", _seconds(runs.latencies)
        )
        result.add(
            "throughput (completed jobs / total time)",
            f"{sum(r.status == 'completed' for r in rows) / max(end - started, 1e-9):.1f} jobs/s",
        )
        result.add("workers that exited on their own", len(self_exits))
        result.check(not self_exits, f"workers exited without being killed: {self_exits[:5]}")
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.add(
            "final SIGTERM: workers exiting 0", f"{len(codes) - len(bad_stop)} of {len(codes)}"
        )
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        result.check(bad == 0, f"{bad} malformed side-file line(s)")
        check_logs(result, h.procs)
        result.notes.append(
            "Rescue latency, kill -> rescued: from the SIGKILL to the rescuing worker's log line "
            "'job=N rescued from lost worker W' for every job W held (claimed, started or "
            "not); it spans STALE_AFTER and the rescuer's heartbeat period. Kill -> next "
            "start: to the next start line of each job the killed worker had started and not "
            "finished; it adds the wait for a free thread (a rescued job keeps its run_at, "
            "so it goes ahead of jobs that became due later)."
        )
        result.notes.append(
            (
                f"Kills pick any of the {workers} worker processes at random, including ones "
                "still starting up (about 1.5 s of CPU each on this machine)"
                if target == "any"
                else f"Kills pick at random among the {workers} workers that have started"
            )
            + f"; SQLQUEUE_MAX_ATTEMPTS is {max_attempts} so that a job killed repeatedly "
            "is not sent dead."
        )
    return result


# -- 2. paused worker ----------------------------------------------------------------------------


def paused_worker(
    base_url: str,
    workdir: Path,
    *,
    job_seconds: float = 3.0,
    stale_after: float = 2.0,
    broken: str | None = None,
) -> ScenarioResult:
    """SIGSTOP a worker mid-job past STALE_AFTER; a second worker rescues and completes the
    job; on SIGCONT the paused worker's late completion must be fenced."""
    title = "Paused worker" + (f" [broken: {broken}]" if broken else "")
    result = ScenarioResult(title, backend_of(base_url))
    with Harness("paused", base_url, workdir, stale_after=stale_after, broken=broken) as h:
        result.workdir = h.dir
        h.enqueue([(chaos_app.work, (job_seconds * 1000,))])
        a = h.spawn_worker(1, grace=job_seconds + 5)

        def start_by(proc: Proc) -> Mark | None:
            marks, _ = h.marks()
            return next((m for m in marks if m.kind == "start" and m.pid == proc.pid), None)

        if not wait_for(lambda: start_by(a) is not None or not a.alive, 60):
            raise ChaosError(f"worker A never started the job: {a.tail()}")
        if not a.alive:
            raise ChaosError(f"worker A exited: {a.tail()}")
        stopped = h.send(a, signal.SIGSTOP)
        b = h.spawn_worker(1)
        limit = 10 * stale_after + job_seconds + 60
        completed = wait_for(lambda: h.counts().get("completed", 0) == 1 or not b.alive, limit, 0.1)
        b_start = start_by(b)
        rescued_in = None if b_start is None else b_start.at - stopped
        result.add("job", f"1 x {job_seconds:g} s, STALE_AFTER={stale_after:g} s")
        result.add(
            "SIGSTOP -> second worker starts the job",
            "never" if rescued_in is None else f"{rescued_in:.2f} s",
        )
        result.check(
            completed and b_start is not None,
            f"the second worker did not complete the job within {limit:.0f} s: {b.tail()}",
        )
        (row,) = h.rows()
        first = (row.status, row.attempts, row.rescues, _result(row))
        resumed = h.send(a, signal.SIGCONT)
        late = wait_for(
            lambda: any(m.kind == "done" and m.pid == a.pid for m in h.marks()[0]), job_seconds + 30
        )
        # The late outcome is written just after the done line: wait for the worker to log it.
        outcome = re.compile(r"job=\d+ task=\S+ attempt=1/\d+: (?:lost its claim|completed)")
        wait_for(lambda: outcome.search(a.text()) is not None or not a.alive, 15, 0.1)
        # The paused worker's own row was removed by the rescue: it may stop, or carry on
        # under a new id. Either is fine; crashing is not.
        a_exited = wait_for(lambda: not a.alive, 3, 0.1)
        a_exit_after = (a.ended or time.time()) - resumed
        (row,) = h.rows()
        text = a.text()
        result.add(
            "after the rescue: status / attempts / rescues / result", " / ".join(map(str, first))
        )
        result.add("paused worker's late run finished (done line)", "yes" if late else "no")
        result.add(
            "after SIGCONT: status / attempts / rescues / result",
            f"{row.status} / {row.attempts} / {row.rescues} / {_result(row)}",
        )
        fenced_line = "lost its claim" in text
        result.add("paused worker logged 'lost its claim'", "yes" if fenced_line else "no")
        how = "; ".join(m.group(0) for m in SELF_STOP.finditer(text)) or "no log line about it"
        result.add(
            "paused worker after SIGCONT",
            f"exited {a.popen.returncode} after {a_exit_after:.1f} s ({how})"
            if a_exited
            else f"still running ({how})",
        )
        expected = f"{b.pid}:2"
        result.check(
            late,
            "the paused worker never finished its run after SIGCONT, so its late completion "
            "was not exercised",
        )
        result.check(
            row.status == "completed" and row.attempts == 2 and row.rescues == 1,
            f"job row after SIGCONT is {row.status}, attempts {row.attempts}, rescues "
            f"{row.rescues}; expected completed, 2, 1",
        )
        result.check(
            _result(row) == expected,
            f"the paused worker's late completion changed the job: result {_result(row)!r}, "
            f"expected {expected!r} from the rescuing worker's second attempt",
        )
        result.check(fenced_line, "the paused worker did not log that it lost its claim")
        result.check(
            not a_exited or a.popen.returncode == 0,
            f"the paused worker crashed after SIGCONT: exit {a.popen.returncode}: {a.tail()}",
        )
        result.check(b.alive, f"the rescuing worker died: {b.tail()}")
        h.stop([p for p in (a, b) if p.alive], timeout=20)
        check_logs(result, h.procs)
    return result


# -- 3. SIGTERM ----------------------------------------------------------------------------------


def sigterm(
    base_url: str,
    workdir: Path,
    *,
    short_s: float = 0.5,
    long_s: float = 4.0,
    grace: float = 2.0,
    poll: float = 1.0,
    stale_after: float = 2.0,
) -> ScenarioResult:
    """A short job finishes within --grace; a long one is handed back with attempts
    unchanged and runs exactly once later; an idle worker exits within one poll interval."""
    result = ScenarioResult("SIGTERM", backend_of(base_url))
    with Harness("sigterm", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        short, long = h.enqueue(
            [(chaos_app.work, (short_s * 1000,)), (chaos_app.work, (long_s * 1000,))]
        )
        result.add(
            "jobs",
            f"short {short_s:g} s, long {long_s:g} s; "
            f"--grace {grace:g} s, --poll-interval {poll:g} s",
        )
        w = h.spawn_worker(2, grace=grace, poll=poll)
        both = wait_for(
            lambda: (
                {m.job for m in h.marks()[0] if m.kind == "start"} == {short, long} or not w.alive
            ),
            60,
        )
        if not both or not w.alive:
            raise ChaosError(f"the worker did not start both jobs: {w.tail()}")
        signalled = h.send(w, signal.SIGTERM)
        try:
            code: int | None = w.popen.wait(timeout=grace + 20)
        except subprocess.TimeoutExpired:
            h.kill(w)
            code = None
        w.poll()
        stop_s = (w.ended or time.time()) - signalled
        by_id = {r.id: r for r in h.rows()}
        s, lg = by_id[short], by_id[long]
        result.add("worker exit code / time after SIGTERM", f"{code} / {stop_s:.2f} s")
        result.check(code == 0, f"the worker exited {code} on SIGTERM: {w.tail()}")
        result.check(
            stop_s < grace + 10, f"the worker took {stop_s:.1f} s to stop (grace {grace:g} s)"
        )
        result.add("short job: status / attempts", f"{s.status} / {s.attempts}")
        result.check(
            s.status == "completed" and s.attempts == 1,
            f"the short job is {s.status} with attempts {s.attempts}; expected completed, 1",
        )
        result.add(
            "long job after SIGTERM: status / attempts / releases / last_error",
            f"{lg.status} / {lg.attempts} / {lg.releases} / {lg.last_error}",
        )
        result.check(
            lg.status == "pending"
            and lg.attempts == 0
            and lg.releases == 1
            and lg.last_error is None
            and lg.worker_id is None,
            f"the long job was not handed back cleanly: {lg.status}, attempts {lg.attempts}, "
            f"releases {lg.releases}, last_error {lg.last_error!r}, worker {lg.worker_id!r}",
        )
        result.check(
            "released unfinished at shutdown" in w.text(), "the worker did not log the release"
        )

        w2 = h.spawn_worker(2, poll=poll)
        done = wait_for(
            lambda: h.counts().get("completed", 0) == 2 or not w2.alive, long_s + 60, 0.1
        )
        result.check(done, f"the released long job did not complete later: {w2.tail()}")
        # w2 is idle now (both jobs completed): it must stop within one poll interval. Its
        # row disappearing is the worker stopping; the process exit adds the interpreter's
        # own teardown (reported, bounded, not held to the poll interval).
        time.sleep(min(poll, 0.5))

        def has_row() -> bool:
            with h.store.read() as conn:
                found = conn.execute(
                    sa.text("SELECT COUNT(*) FROM sqlqueue_workers WHERE pid = :pid"),
                    {"pid": w2.pid},
                ).scalar_one()
            return bool(found)

        registered = has_row()
        idle_signal = h.send(w2, signal.SIGTERM)
        wait_for(lambda: not has_row() or not w2.alive, poll + 20, 0.01)
        row_gone_s = time.time() - idle_signal
        try:
            idle_code: int | None = w2.popen.wait(timeout=poll + 20)
        except subprocess.TimeoutExpired:
            h.kill(w2)
            idle_code = None
        w2.poll()
        idle_s = (w2.ended or time.time()) - idle_signal
        result.add(
            "idle worker after SIGTERM: row removed / process exited (code)",
            f"{row_gone_s:.2f} s / {idle_s:.2f} s ({idle_code})",
        )
        result.check(registered, "the idle worker had no row in sqlqueue_workers")
        result.check(
            row_gone_s <= poll,
            f"the idle worker took {row_gone_s:.2f} s to stop (remove its row); "
            f"expected within one poll interval ({poll:g} s)",
        )
        result.check(
            idle_code == 0 and idle_s <= poll + 5,
            f"the idle worker exited {idle_code} after {idle_s:.2f} s",
        )
        lg = {r.id: r for r in h.rows()}[long]
        marks, _ = h.marks()
        long_starts = [m for m in marks if m.job == long and m.kind == "start"]
        long_dones = [m for m in marks if m.job == long and m.kind == "done"]
        later = [m for m in long_starts if m.at > signalled]
        result.add(
            "long job in the end: status / attempts / releases",
            f"{lg.status} / {lg.attempts} / {lg.releases}",
        )
        result.add(
            "long job runs after the release (starts / dones)", f"{len(later)} / {len(long_dones)}"
        )
        result.check(
            lg.status == "completed" and lg.attempts == 1 and lg.releases == 1,
            f"long job ended {lg.status}, attempts {lg.attempts}, releases {lg.releases}; "
            "expected completed, 1, 1",
        )
        result.check(
            len(later) == 1 and len(long_dones) == 1 and later[0].pid == w2.pid,
            f"the long job did not run exactly once after the release: {later}, dones {long_dones}",
        )
        with h.store.read() as conn:
            leftover = conn.execute(
                sa.text(
                    "SELECT COUNT(*) FROM sqlqueue_workers "
                    "WHERE stopped_at IS NULL OR stop_reason <> 'stopped'"
                )
            ).scalar_one()
        result.add("worker rows not marked stopped", leftover)
        result.check(
            leftover == 0, f"{leftover} worker row(s) not marked stopped after clean exits"
        )
        check_logs(result, h.procs)
    return result


# -- 4. poison pills ------------------------------------------------------------------------------

POISONS = {
    "os._exit(1)": (chaos_app.poison_exit, "WorkerLost: worker lost"),
    "SIGKILL self": (chaos_app.poison_kill, "WorkerLost: worker lost"),
    "memory exhaustion": (chaos_app.poison_memory, "MemoryError: chaos: out of memory"),
}


def poison_pills(
    base_url: str,
    workdir: Path,
    *,
    healthy: int = 200,
    workers: int = 4,
    threads: int = 2,
    healthy_ms: tuple[float, float] = (50.0, 300.0),
    stale_after: float = 2.0,
    seed: int = 2,
    timeout: float = 180.0,
) -> ScenarioResult:
    """Poison pills end dead after exactly max_attempts; healthy jobs beside them complete."""
    rng = random.Random(seed)
    result = ScenarioResult("Poison pills", backend_of(base_url))
    with Harness("poison", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        items: list[tuple[Any, tuple[Any, ...]]] = [(task, ()) for task, _ in POISONS.values()]
        items += [(chaos_app.work, (round(rng.uniform(*healthy_ms), 1),)) for _ in range(healthy)]
        ids = h.enqueue(items)
        poison_ids = dict(zip(POISONS, ids[: len(POISONS)], strict=True))
        healthy_ids = ids[len(POISONS) :]
        result.add(
            "jobs",
            f"{len(POISONS)} poison pills (max_attempts {chaos_app.POISON_ATTEMPTS}) "
            f"+ {healthy} healthy ({healthy_ms[0]:g}-{healthy_ms[1]:g} ms)",
        )
        result.add(
            "workers",
            f"{workers} x {threads} threads, STALE_AFTER={stale_after:g} s; "
            "restarted when they die",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        deaths: list[str] = []
        deadline = time.monotonic() + timeout
        finished = False
        while time.monotonic() < deadline:
            for i, proc in enumerate(pool):
                if proc.poll() is not None:
                    deaths.append(str(proc.popen.returncode))
                    pool[i] = h.spawn_worker(threads)
            counts = h.counts()
            if counts.get("completed", 0) + counts.get("dead", 0) >= len(ids):
                finished = True
                break
            time.sleep(0.1)
        elapsed = time.time() - started
        result.check(finished, f"jobs still unfinished after {timeout:.0f} s: {dict(h.counts())}")
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        rows = {r.id: r for r in h.rows()}
        marks, _ = h.marks()
        crashed = {p.pid: p for p in h.workers if p.crashed}
        crashers = {
            m.pid
            for m in marks
            if m.kind == "start"
            and m.job in (poison_ids["os._exit(1)"], poison_ids["SIGKILL self"])
        }
        for label, job_id in poison_ids.items():
            row = rows[job_id]
            own = {m.attempt: m for m in marks if m.job == job_id and m.kind == "start"}
            expected_error = POISONS[label][1]
            # Account for every attempt: its own run's failure, or a WorkerLost from a worker
            # that crashed (on this pill, or on another pill it shared a process with).
            collateral = 0
            unaccounted = []
            for record in _errors(row):
                attempt, kind = record.get("attempt"), str(record.get("type"))
                pid = _worker_pid(record.get("worker"))
                mine = own.get(attempt) if isinstance(attempt, int) else None
                if kind == "WorkerLost" and pid in crashed:
                    collateral += mine is None or mine.pid != pid
                elif kind == expected_error.partition(":")[0] and mine is not None:
                    pass
                else:
                    unaccounted.append(f"attempt {attempt}: {kind} on pid {pid}")
            result.add(
                f"poison {label}: status / attempts / own runs (+ lost beside another pill) "
                "/ last_error",
                f"{row.status} / {row.attempts} / {len(own)} (+{collateral}) / {row.last_error}",
            )
            result.check(
                row.status == "dead"
                and row.attempts == chaos_app.POISON_ATTEMPTS
                and len(_errors(row)) == chaos_app.POISON_ATTEMPTS,
                f"poison {label}: {row.status} after {row.attempts} attempts "
                f"({len(_errors(row))} error records); "
                f"expected dead after exactly {chaos_app.POISON_ATTEMPTS}",
            )
            result.check(
                not unaccounted and len(own) + collateral == row.attempts,
                f"poison {label}: attempts not explained by its own runs or a crashed worker: "
                f"{unaccounted}, {len(own)} own runs + {collateral} collateral "
                f"for {row.attempts} attempts",
            )
            result.check(
                (row.last_error or "").startswith(expected_error)
                or (row.last_error or "").startswith("WorkerLost"),
                f"poison {label}: last_error {row.last_error!r}, expected {expected_error!r}...",
            )
        result.add(
            "worker deaths (exit codes)",
            ", ".join(f"{c}: {n}" for c, n in sorted(collections.Counter(deaths).items()))
            or "none",
        )
        result.check(
            set(crashed) == crashers,
            f"worker deaths do not match the os._exit/SIGKILL runs: died {sorted(crashed)}, "
            f"ran a crashing pill {sorted(crashers)} (memory exhaustion must not kill a worker)",
        )
        check_completed(result, list(rows.values()), marks, healthy_ids)
        runs = analyze_runs(marks, h.workers, healthy_ids)
        _explain_figures(result, runs)
        result.add(
            "healthy jobs with more than one attempt (collateral of a crash)",
            sum(rows[i].attempts > 1 for i in healthy_ids),
        )
        result.add(
            "crash -> job rescued p50 / p95 / max (pending again, or dead)",
            _seconds(rescue_delays(h.procs)),
        )
        result.add("time until every job was finished", f"{elapsed:.1f} s")
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        check_logs(result, h.procs)
    return result


# -- 5. busy storm ---------------------------------------------------------------------------


def busy_storm(
    base_url: str,
    workdir: Path,
    *,
    producers: int = 4,
    per_producer: int = 2500,
    workers: int = 4,
    threads: int = 2,
    poll_every: float = 0.5,
    stale_after: float = 10.0,
    timeout: float | None = None,
) -> ScenarioResult:
    """Producers, workers and a status poller on one database: no "database is locked",
    every job exactly once, and an intact SQLite file."""
    total = producers * per_producer
    timeout = timeout or 120 + total * 0.05
    result = ScenarioResult("Busy storm", backend_of(base_url))
    with Harness("busy", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        result.add(
            "load",
            f"{producers} producers x {per_producer} enqueues (one transaction each), "
            f"{workers} workers x {threads} threads, "
            f"`flask queue status` every {poll_every:g} s",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        started = time.time()
        makers = [
            h.spawn("producer", [*FLASK, "chaos-produce", "--count", str(per_producer)])
            for _ in range(producers)
        ]
        polls: list[Proc] = []
        poller: Proc | None = None
        next_poll = 0.0
        deadline = time.monotonic() + timeout
        produced_at: float | None = None
        finished = False
        most_running = 0
        while time.monotonic() < deadline:
            if poller is not None and poller.poll() is not None:
                poller, next_poll = None, time.monotonic() + poll_every
            if poller is None and time.monotonic() >= next_poll:
                poller = h.spawn("status", [*FLASK, "queue", "status"])
                polls.append(poller)
            if produced_at is None and all(p.poll() is not None for p in makers):
                produced_at = time.time()
            counts = h.counts()
            most_running = max(most_running, counts.get("running", 0))
            if produced_at is not None and counts.get("completed", 0) >= total:
                finished = True
                break
            if any(p.poll() is not None for p in pool):
                break  # a worker died: reported below
            time.sleep(0.1)
        end = time.time()
        for proc in polls:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=60)
        died = _self_exits(pool)
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        result.check(
            finished, f"not all {total} jobs completed within {timeout:.0f} s: {dict(h.counts())}"
        )
        outputs = []
        for proc in makers:
            text = proc.text().strip().splitlines()
            try:
                outputs.append(json.loads(text[-1]))
            except (IndexError, ValueError):
                outputs.append({})
        bad_makers = [
            (p.pid, p.popen.returncode, p.tail(3))
            for p, o in zip(makers, outputs, strict=True)
            if p.popen.returncode != 0 or o.get("enqueued") != per_producer
        ]
        result.check(not bad_makers, f"producers failed: {bad_makers[:4]}")
        produce_s = max((o.get("seconds", 0.0) for o in outputs), default=0.0)
        result.add(
            "enqueue rate (all producers)",
            f"{total / max(produce_s, 1e-9):.0f} jobs/s (slowest producer {produce_s:.1f} s)",
        )
        result.add(
            "throughput (completed jobs / total time)",
            f"{total / max(end - started, 1e-9):.1f} jobs/s over {end - started:.1f} s",
        )
        result.add(
            "most jobs running at once (sampled)", f"{most_running} (threads: {workers * threads})"
        )
        result.check(
            most_running <= workers * threads,
            f"{most_running} jobs running with only {workers * threads} worker threads: "
            "a claim took more jobs than its limit",
        )
        failed_polls = [p for p in polls if p.popen.returncode != 0]
        result.add("status polls (failed)", f"{len(polls)} ({len(failed_polls)})")
        result.check(
            not failed_polls, f"flask queue status failed: {[p.tail(3) for p in failed_polls[:3]]}"
        )
        result.check(
            not died,
            "workers exited during the storm: "
            f"{[(p.pid, p.popen.returncode, p.tail()) for p in died]}",
        )
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        rows = h.rows()
        marks, bad = h.marks()
        result.check(len(rows) == total, f"{len(rows)} job rows for {total} enqueues")
        check_completed(result, rows, marks, [r.id for r in rows], once=True)
        result.check(bad == 0, f"{bad} malformed side-file line(s)")
        check_logs(result, h.procs)
        if h.backend == "sqlite":
            h.store.engine.dispose()
            path = sa.make_url(h.url).database or ""
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
                integrity = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
            result.add("PRAGMA integrity_check", ", ".join(integrity))
            result.check(integrity == ["ok"], f"integrity_check: {integrity[:5]}")
        else:
            result.add("PRAGMA integrity_check", "n/a (server database)")
    return result


# -- 6. database outage ----------------------------------------------------------------------------


@contextlib.contextmanager
def _outage(h: Harness) -> Iterator[Callable[[], None]]:
    """Make the database unavailable to every other connection until the block ends.

    Yields a function to call periodically during the outage (servers: keep killing).
    """
    url = sa.make_url(h.url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        holder = sqlite3.connect(url.database or "", timeout=60, isolation_level=None)
        try:
            holder.execute("BEGIN EXCLUSIVE")
            yield lambda: None
            holder.execute("ROLLBACK")
        finally:
            holder.close()
        return
    name = url.database
    admin = sa.create_engine(
        sa.make_url(h.base_url), isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.exec_driver_sql(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")

                def terminate() -> None:
                    conn.execute(
                        sa.text(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    )

                try:
                    terminate()
                    yield terminate
                finally:
                    conn.exec_driver_sql(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
            else:
                conn.exec_driver_sql(f"ALTER USER '{name}'@'127.0.0.1' ACCOUNT LOCK")
                try:
                    _kill_mysql_connections(conn, name or "")

                    def kill_connections() -> None:
                        _kill_mysql_connections(conn, name or "")

                    yield kill_connections
                finally:
                    conn.exec_driver_sql(f"ALTER USER '{name}'@'127.0.0.1' ACCOUNT UNLOCK")
    finally:
        admin.dispose()


def outage(
    base_url: str,
    workdir: Path,
    *,
    jobs: int | None = None,
    job_ms: float = 200.0,
    seconds: float = 10.0,
    lead: float = 2.0,
    workers: int = 4,
    threads: int = 2,
    stale_after: float = 2.0,
    timeout: float = 180.0,
) -> ScenarioResult:
    """The database is unavailable for ``seconds`` while workers run: they survive, no
    attempt is consumed, nothing is lost.

    The jobs are enqueued once every worker has started, ``lead`` seconds before the
    outage; by default there are enough to keep every thread busy for ``lead + 6`` s of
    claiming (no claim succeeds during the outage), so jobs run before, across and after it.
    """
    slots = workers * threads
    jobs = jobs or max(slots, math.ceil(slots * (lead + 6) / (job_ms / 1000)))
    result = ScenarioResult("Database outage", backend_of(base_url))
    with Harness("outage", base_url, workdir, stale_after=stale_after) as h:
        result.workdir = h.dir
        how = {
            "sqlite": "another connection holds BEGIN EXCLUSIVE",
            "postgresql": "ALLOW_CONNECTIONS false + pg_terminate_backend of every connection "
            "(repeated every 0.2 s)",
            "mysql": "the database's own account locked (ACCOUNT LOCK) + KILL CONNECTION of "
            "every connection it has (repeated every 0.1 s)",
        }[h.backend]
        result.add("outage", f"{seconds:g} s: {how}")
        result.add(
            "load",
            f"{jobs} jobs x {job_ms:g} ms, {workers} workers x {threads} threads, "
            f"STALE_AFTER={stale_after:g} s",
        )
        pool = [h.spawn_worker(threads) for _ in range(workers)]
        if not wait_for(lambda: all(p.ready() for p in pool) or any(not p.alive for p in pool), 60):
            raise ChaosError("workers did not start")
        ids = h.enqueue([(chaos_app.work, (job_ms,)) for _ in range(jobs)])
        time.sleep(lead)
        running_before = h.counts()
        result.check(
            running_before.get("running", 0) <= slots,
            f"{running_before.get('running', 0)} jobs running with only {slots} worker threads: "
            "a claim took more jobs than its limit",
        )
        died_during: list[str] = []
        interval = 0.2 if h.backend == "postgresql" else 0.1
        with _outage(h) as keep_down:
            began = time.time()
            while time.time() - began < seconds:
                keep_down()
                for p in pool:
                    if p.poll() is not None and not any(str(p.pid) in d for d in died_during):
                        died_during.append(
                            f"pid {p.pid} exited {p.popen.returncode} during the outage: {p.tail()}"
                        )
                time.sleep(interval)
        ended = time.time()
        result.add(
            "jobs completed before the outage / running at its start",
            f"{running_before.get('completed', 0)} / {running_before.get('running', 0)}",
        )

        def settled() -> bool:
            counts = h.counts()
            finished = counts.get("completed", 0) + counts.get("dead", 0) >= jobs
            return finished or all(not p.alive for p in pool)

        finished = wait_for(settled, timeout, 0.2)
        done_at = time.time()
        died = _self_exits(pool)
        alive = sum(p.alive for p in pool)
        result.add("workers alive after the outage", f"{alive} of {workers}")
        result.add("time to finish after the outage", f"{done_at - ended:.1f} s")
        result.check(
            finished, f"jobs unfinished {timeout:.0f} s after the outage: {dict(h.counts())}"
        )
        result.check(
            not died,
            "workers exited because of the outage: "
            + "; ".join(
                f"pid {p.pid} exited {p.popen.returncode} at +{(p.ended or 0) - began:.1f} s: "
                f"{_first(SELF_STOP, p.text()) or p.tail(3)}"
                for p in died
            ),
        )
        codes = h.stop([p for p in pool if p.alive], timeout=30)
        bad_stop = {p.pid: c for p, c in codes.items() if c != 0}
        result.check(not bad_stop, f"workers did not exit 0 on SIGTERM: {bad_stop}")
        rows = h.rows()
        marks, _ = h.marks()
        check_completed(result, rows, marks, ids, once=True)
        rescued = [r for r in rows if r.rescues]
        result.add("jobs rescued (attempt consumed by the outage)", len(rescued))
        db_errors = sum(p.text().count("database error during") for p in pool)
        unrecorded = sum(p.text().count("could not record the outcome") for p in pool)
        late = sum(p.text().count("outcome recorded once the database was back") for p in pool)
        result.add(
            "worker log: 'database error during ...' / 'could not record the outcome' / "
            "'outcome recorded once the database was back'",
            f"{db_errors} / {unrecorded} / {late}",
        )
        check_logs(result, h.procs)
    return result


# -- running from the command line ---------------------------------------------------------------


def header(argv: Sequence[str], url: str) -> str:
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if commit and subprocess.run([*git, "diff-index", "--quiet", "HEAD", "--"]).returncode:
        commit += " + uncommitted changes"
    import flask_sqlqueue

    shown = sa.make_url(url).render_as_string(hide_password=True)
    if backend_of(url) == "sqlite":
        shown += "` (a fresh file per scenario in the work directory; the path is not used)"
    else:
        shown += "` (a fresh database per scenario, created and dropped by the script)"
    return "\n".join(
        [
            "# flask_sqlqueue chaos figures",
            "",
            f"- command: `{shlex.join(['python', 'benchmarks/chaos.py', *argv])}`",
            f"- database: `{shown}",
            f"- machine: {cores or os.cpu_count()} cores (`nproc`), {platform.machine()}, "
            f"{platform.system()} {platform.release()}",
            f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"SQLAlchemy {sa.__version__}, flask_sqlqueue {flask_sqlqueue.__version__}"
            + (f" (commit {commit})" if commit else ""),
            f"- started: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            "",
        ]
    )


def run(name: str, args: argparse.Namespace, workdir: Path) -> ScenarioResult:
    url = args.database_url
    if name == "kill-storm":
        return kill_storm(
            url,
            workdir,
            jobs=args.jobs,
            duration=args.duration,
            workers=args.workers,
            threads=args.threads,
            kill_every=args.kill_every,
            target=args.kill_target,
            stale_after=args.stale_after,
            seed=args.seed,
        )
    if name == "paused":
        return paused_worker(url, workdir, stale_after=args.stale_after)
    if name == "sigterm":
        return sigterm(url, workdir, stale_after=args.stale_after)
    if name == "poison":
        return poison_pills(
            url,
            workdir,
            healthy=args.healthy,
            workers=args.workers,
            threads=args.threads,
            stale_after=args.stale_after,
        )
    if name == "busy":
        return busy_storm(
            url,
            workdir,
            producers=args.producers,
            per_producer=args.enqueues,
            workers=args.workers,
            threads=args.threads,
        )
    if name == "outage":
        return outage(
            url,
            workdir,
            seconds=args.outage,
            workers=args.workers,
            threads=args.threads,
            stale_after=args.stale_after,
        )
    raise ValueError(name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Chaos scenarios against real flask queue workers.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--database-url", required=True, help="sqlite:///... or a server URL")
    parser.add_argument("--duration", type=float, default=60.0, help="kill-storm window (s)")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--jobs", type=int, default=2000, help="kill-storm jobs")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kill-every", type=float, default=0.5, help="kill-storm period (s)")
    parser.add_argument(
        "--kill-target",
        choices=["any", "ready"],
        default="any",
        help="kill-storm victims: any worker process, or only workers that have started",
    )
    parser.add_argument("--stale-after", type=float, default=2.0, help="SQLQUEUE_STALE_AFTER")
    parser.add_argument("--healthy", type=int, default=200, help="poison: healthy jobs")
    parser.add_argument("--producers", type=int, default=4, help="busy: producer processes")
    parser.add_argument("--enqueues", type=int, default=2500, help="busy: enqueues each")
    parser.add_argument("--outage", type=float, default=10.0, help="outage length (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep logs and side files here")
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if backend_of(args.database_url) not in ("sqlite", "postgresql", "mysql"):
        parser.error("--database-url must be sqlite, postgresql or mysql/mariadb")

    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sqlqueue-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(header(argv, args.database_url), flush=True)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    failed = False
    for name in names:
        try:
            result = run(name, args, workdir)
        except ChaosError as exc:
            result = ScenarioResult(name, backend_of(args.database_url))
            result.violations.append(f"the harness could not run the scenario: {exc}")
        print(result.markdown(), flush=True)
        failed = failed or not result.ok
    if failed or keep:
        print(f"Logs and side files: {workdir}", flush=True)
    else:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

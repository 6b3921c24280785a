"""The chaos suite's harness: fresh databases, worker processes and their marks, results."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
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

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from benchmarks import chaos_app
from flask_sqlqueue.core.models import jobs as jobs_table

#: The repository: the workers run from it, whatever the working directory.
ROOT = Path(__file__).resolve().parent.parent.parent
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
HANDED_BACK = re.compile(r"handed back (\d+) job\(s\) claimed ahead and not started")
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


#: Jobs a worker may claim beyond its threads while jobs are short (``--claim-ahead``).
CLAIM_AHEAD = 64


def most_claimed(workers: int, threads: int) -> int:
    """The most jobs ``workers`` workers of ``threads`` threads may hold ``running``:
    their threads' worth, and what each may claim ahead of them."""
    return workers * (threads + CLAIM_AHEAD)


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


def seconds_text(values: Sequence[float]) -> str:
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
                    kill_mysql_connections(conn, name)
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
                    conn.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'127.0.0.1'")
    finally:
        admin.dispose()


def kill_mysql_connections(conn: sa.Connection, user: str) -> int:
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
                    "SQLQUEUE_MAX_CRASHES": self.max_attempts,
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
        args += ["--claim-ahead", str(CLAIM_AHEAD)]
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
        if sig == signal.SIGKILL:
            # Taken once the signal is sent: a harness thread held up between reading the
            # clock and sending (a loaded machine) would otherwise date the kill before
            # jobs the worker started in the meantime, leaving their re-runs unexplained.
            proc.killed_at = time.time()
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

    def enqueue(
        self,
        items: Sequence[tuple[Any, tuple[Any, ...]]],
        depends_on: Sequence[Sequence[int]] | None = None,
    ) -> list[int]:
        """Enqueue ``(task, args)`` pairs in one transaction; their ids in order. With
        ``depends_on``, item ``i`` depends on the items whose indexes ``depends_on[i]``
        lists (each earlier than ``i``)."""
        ids: list[int] = []
        with self.app.app_context(), self.store.write() as conn:
            for index, (task, args) in enumerate(items):
                before = [ids[i] for i in depends_on[index]] if depends_on else None
                ids.append(task.using(session=conn, depends_on=before).enqueue(*args).id)
        return ids

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


def error_records(row: Any) -> list[dict[str, Any]]:
    try:
        items = json.loads(row.errors or "[]")
    except ValueError:
        return []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def worker_pid(worker_id: object) -> int | None:
    """The pid in a worker id ``host:pid:suffix``."""
    parts = str(worker_id).rsplit(":", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def job_result(row: Any) -> Any:
    try:
        return None if row.result is None else json.loads(row.result)
    except ValueError:
        return row.result

"""What every peer shares: processes, /proc readings, throw-away servers and databases."""

from __future__ import annotations

import compileall
import contextlib
import os
import platform
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from urllib.parse import unquote
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL = "mysql+pymysql://root@127.0.0.1:3306/test"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
TICK = os.sysconf("SC_CLK_TCK")
IDLE_SHARE = 0.25  # of a core: a worker using less sits idle (Workers.wait_idle)


class BenchError(Exception):
    """A measurement that cannot be trusted: reported as an error, never as a number."""


def step(label: str, measure: Callable[[], object]) -> str | None:
    """Run one measurement and print ``label``, its time and its outcome; return the
    error's text if it failed (a traceback too, if not a :class:`BenchError`)."""
    began = time.monotonic()
    error = None
    try:
        measure()
    except Exception as exc:
        error = str(exc) if isinstance(exc, BenchError) else repr(exc)
        if not isinstance(exc, BenchError):
            traceback.print_exc(file=sys.stderr)
    outcome = "ok" if error is None else f"ERROR {error}"
    print(f"{label} {time.monotonic() - began:6.1f} s  {outcome}", file=sys.stderr, flush=True)
    return error


def machine(
    postgres_version: str, mysql_version: str, redis_version: str | None = None
) -> list[str]:
    """The report's header lines on the machine: when, which commit, CPU and load, the
    versions of Python and the stores."""
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    redis = f"; Redis {redis_version} (loopback, no persistence)" if redis_version else ""
    return [
        f"- {now}, commit {checkout()}",
        f"- CPU: {os.cpu_count()} cores, {model}; load average at the start {load}",
        f"- Python {platform.python_version()} ({platform.system()} {platform.release()})",
        f"- SQLite {sqlite3.sqlite_version}; PostgreSQL {postgres_version}; "
        f"MariaDB {mysql_version}{redis}",
    ]


def compile_checkout() -> str:
    """Compile the bytecode of the checkout's modules (flask_sqlqueue, the benchmark's
    apps), as ``pip install`` compiles an installed package's: the peers come from
    site-packages with theirs, and a checkout installed in editable mode has none until
    a process writes it, which ``PYTHONDONTWRITEBYTECODE`` forbids. Returns the report's
    line saying so."""
    for folder in ("flask_sqlqueue", "benchmarks"):
        compileall.compile_dir(ROOT / folder, quiet=1)
    why = " (this environment sets `PYTHONDONTWRITEBYTECODE`)" if sys.dont_write_bytecode else ""
    return (
        "- the checkout's modules byte-compiled before the run, as `pip install` compiles "
        f"the peers' in site-packages{why}"
    )


def checkout() -> str:
    """The checkout's commit, with ``+ uncommitted changes`` when any file outside
    benchmarks/results (where the reports are written) differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout

    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    changed = [
        line
        for line in git("status", "--porcelain").splitlines()
        if not line[3:].startswith("benchmarks/results/")
    ]
    return head + (" + uncommitted changes" if changed else "")


def closing_line(started: float) -> str:
    """The report's last header line: the wall time since ``started`` (monotonic)."""
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"- wall time {(time.monotonic() - started) / 60:.1f} min; load average at the end {load}"
    )


def publish(text: str, output: Path | None) -> None:
    """Print the report, and write it to ``output`` if given."""
    print(text)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def base_env(**extra: str) -> dict[str, str]:
    """The environment for worker processes: this checkout importable, quiet logs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# -- /proc -------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant (Celery and Huey may fork)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def stat_cpu(path: str) -> float | None:
    """User + system CPU seconds in a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat``
    file (that process or thread alone); ``None`` once it is gone."""
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and its descendants."""
    return sum(stat_cpu(f"/proc/{member}/stat") or 0.0 for member in process_tree(pid))


def pids_named(names: tuple[str, ...]) -> list[int]:
    """Every process whose command name (``/proc/<pid>/comm``) is one of ``names``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() in names:
                    found.append(int(entry))
    return found


def peak_rss_mb(pid: int) -> float:
    """Peak resident set (VmHWM) of ``pid`` plus any children it forked, in MiB."""
    total_kb = 0
    for member in process_tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kb += int(line.split()[1])
    return total_kb / 1024


_COUNTERS: dict[str, Any] = {}


def sqlite_count(path: Path, sql: str) -> int:
    """Count with one long-lived autocommit connection per file: the harness polls often."""
    conn = _COUNTERS.get(str(path))
    if conn is None:
        conn = _COUNTERS[str(path)] = sqlite3.connect(path, timeout=30, isolation_level=None)
    return int(conn.execute(sql).fetchone()[0])


def pg_count(dsn: str, sql: str) -> int:
    import psycopg

    conn = _COUNTERS.get(dsn)
    if conn is None:
        conn = _COUNTERS[dsn] = psycopg.connect(dsn, autocommit=True)
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def mysql_connect(url: str, **options: Any) -> Any:
    """A PyMySQL connection from a ``mysql[+pymysql]://user[:password]@host[:port]/db`` URL."""
    import pymysql

    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/") or None,
        **options,
    )


def mysql_count(url: str, sql: str) -> int:
    conn = _COUNTERS.get(url)
    if conn is None:
        conn = _COUNTERS[url] = mysql_connect(url, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(sql)
        return int(cur.fetchone()[0])


def close_counters() -> None:
    """Close the counting connections (before a file is removed or a database dropped)."""
    while _COUNTERS:
        _, conn = _COUNTERS.popitem()
        conn.close()


# -- worker processes --------------------------------------------------------------------


@dataclass
class Workers:
    """Real worker processes, started as each project's users start them."""

    argv: list[str]
    env: dict[str, str]
    count: int
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    spawned: float = 0.0  # time.monotonic() just before the first process was spawned

    def start(self) -> None:
        self.spawned = time.monotonic()
        for index in range(self.count):
            log = open(self.log_dir / f"worker-{index}.log", "wb")
            self.procs.append(
                subprocess.Popen(
                    self.argv,
                    env=self.env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()

    def check_alive(self) -> None:
        for index, proc in enumerate(self.procs):
            if proc.poll() is not None:
                raise BenchError(
                    f"worker {index} exited with {proc.returncode}: {self.log_tail(index)}"
                )

    def log_tail(self, index: int, lines: int = 6) -> str:
        path = self.log_dir / f"worker-{index}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def wait_idle(self, timeout: float = 90.0) -> None:
        """Wait until every worker has finished starting and sits idle: under a quarter of
        a core over 0.3 s (start-up takes a whole one; a worker that polls the database
        every millisecond while idle takes a few percent)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            last = cpu_seconds(proc.pid)
            while True:
                time.sleep(0.3)
                self.check_alive()
                now = cpu_seconds(proc.pid)
                if now - last <= IDLE_SHARE * 0.3:
                    break
                last = now
                if time.monotonic() > deadline:
                    raise BenchError("workers did not settle within the timeout")

    def peak_rss_mb(self) -> float:
        return max(peak_rss_mb(proc.pid) for proc in self.procs)

    def cpu_seconds(self) -> float:
        """CPU time of every worker process so far (and of anything they forked)."""
        return sum(cpu_seconds(proc.pid) for proc in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # A worker may have forked helpers into its session; leave none behind.
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str], count: int, log_dir: Path) -> Iterator[Workers]:
    workers = Workers(argv, env, count, log_dir)
    try:
        workers.start()
        yield workers
    finally:
        workers.stop()


# -- servers and databases ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A throw-away redis-server on loopback, no persistence; yields its URL."""
    if not Path(REDIS_SERVER).exists():
        raise BenchError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    data = folder / "redis"
    data.mkdir()
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(data),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def postgres_database(admin_url: str, label: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one peer, dropped afterwards; yields its URL."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        params = conninfo_to_dict(admin_url)
        user = quote(str(params.get("user", "")), safe="")
        password = quote(str(params.get("password", "")), safe="")
        auth = f"{user}:{password}@" if password else f"{user}@" if user else ""
        host = params.get("host", "127.0.0.1")
        port = params.get("port", 5432)
        yield f"postgresql://{auth}{host}:{port}/{name}"
    finally:
        close_counters()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def mysql_database(admin_url: str, label: str) -> Iterator[str]:
    """A fresh MariaDB database for one system, dropped afterwards; yields its URL (the
    admin URL's scheme, user, password, host and port)."""
    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    _mysql_admin(admin_url, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    try:
        yield urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    finally:
        close_counters()
        _mysql_admin(admin_url, f"DROP DATABASE IF EXISTS `{name}`")


def _mysql_admin(admin_url: str, sql: str) -> None:
    conn = mysql_connect(admin_url, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


@contextlib.contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)

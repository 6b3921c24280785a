"""``python -m example_app.demo`` (``make demo``): the example app, a worker and sample jobs.

From nothing but this checkout and its virtualenv: creates the queue's tables in a SQLite
file in the instance folder (``flask queue db upgrade``), starts a worker
(``flask queue work --concurrency 2``) and the web app (``flask run`` on 127.0.0.1) as
child processes, posts a few sample requests once the web app answers, and prints what
to try next. Ctrl-C or SIGTERM stops both children cleanly.

``--seconds N`` runs N seconds after the sample jobs are posted, prints
``flask queue status`` and exits 0: a bounded run for tests and CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # loopback only: nothing here is meant to be reachable from outside
DEFAULT_PORT = 5000
BANNER = "flask_sqlqueue example app"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ACCESS_LOG = re.compile(r'" \d{3} ')

_print_lock = threading.Lock()
# Proxies from the environment must not see requests to our own loopback server.
_http = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoError(Exception):
    """Setting up failed; the message says why."""


def say(text: str = "") -> None:
    with _print_lock:
        print(text, flush=True)


# -- child processes -----------------------------------------------------------------------


def flask_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "flask", "--app", "example_app", *args]


def child_env(instance_path: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASK_")}
    env.update(FLASK_SKIP_DOTENV="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if instance_path:
        env["EXAMPLE_INSTANCE_PATH"] = instance_path
    return env


class Child:
    """A child process whose output is shown line by line behind a ``name |`` prefix.

    It runs in its own session, so a Ctrl-C in the terminal reaches only the demo, which
    then stops each child with one SIGTERM (a second signal would make the worker quit
    without waiting for its running jobs). While ``quiet`` is set, access-log lines are
    dropped: the demo's own requests would drown what it prints about them.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.quiet = threading.Event()
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._show_output, daemon=True)
        self._pump.start()

    def _show_output(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            text = ANSI.sub("", line.rstrip())
            if not (self.quiet.is_set() and ACCESS_LOG.search(text)):
                say(f"{self.name:<6} | {text}")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.running:
            self.proc.terminate()

    def kill(self) -> None:
        if self.running:
            self.proc.kill()

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            say(f"{self.name} did not stop within {timeout:g}s; killing it")
            self.proc.kill()
            self.proc.wait(10)
        self._pump.join(5)
        return self.proc.returncode


def stop_children(children: list[Child], timeout: float = 20.0) -> None:
    for child in children:
        child.terminate()
    for child in children:
        child.wait(timeout)


# -- talking to the web app ------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    """One JSON request; returns the status and the decoded answer."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if data is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with _http.open(request, timeout=10) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_until_serving(base: str, web: Child, timeout: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if not web.running:
            raise DemoError("the web app exited while starting; see its output above")
        try:
            with _http.open(base, timeout=2) as response:
                if response.read().decode("utf-8", "replace").startswith(BANNER):
                    return
                raise DemoError(f"something else answers at {base}; try --port")
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    if not stop.is_set():
        raise DemoError(f"the web app did not answer at {base} within {timeout:g}s")


def post_samples(base: str) -> list[int]:
    """Post a few realistic requests and report each answer; returns the new job ids."""
    tag = time.strftime("%H%M%S")
    order = int(time.time()) % 100_000 * 10
    paid = {"id": f"evt_{tag}_1", "type": "payment.succeeded", "data": {"amount": 1299}}
    samples: list[tuple[str, str, Any]] = [
        (f"webhook {paid['id']} (payment.succeeded)", "/webhooks/payments", paid),
        (f"webhook {paid['id']} again (duplicate delivery)", "/webhooks/payments", paid),
        (
            f"webhook evt_{tag}_2 (payment.refunded)",
            "/webhooks/payments",
            {"id": f"evt_{tag}_2", "type": "payment.refunded", "data": {"amount": 1299}},
        ),
        (
            f"webhook evt_{tag}_3 (payment.disputed: no handler, will go dead)",
            "/webhooks/payments",
            {"id": f"evt_{tag}_3", "type": "payment.disputed"},
        ),
        ("webhook without an id", "/webhooks/payments", {"type": "payment.succeeded"}),
        ("report 7 as csv", "/reports", {"report_id": 7, "format": "csv"}),
        ("report 8 as json", "/reports", {"report_id": 8}),
        *(
            (f"shipping quote for order {n} (flaky API)", f"/orders/{n}/shipping-quote", {})
            for n in range(order + 1, order + 5)
        ),
    ]
    say("Sample requests (the worker picks the jobs up as they arrive):")
    width = max(len(label) for label, _, _ in samples)
    job_ids: list[int] = []
    for label, path, body in samples:
        status, answer = call("POST", base.rstrip("/") + path, body)
        if status == 202:
            note = ""
            if answer.get("duplicate"):
                note = " (the same job: a repeated event id enqueues nothing new)"
            say(f"  {label:<{width}}  -> {status}, job {answer['job_id']}{note}")
            if answer["job_id"] not in job_ids:
                job_ids.append(answer["job_id"])
        else:
            say(f"  {label:<{width}}  -> {status}, {answer.get('error', answer)}")
    return job_ids


# -- what to print ---------------------------------------------------------------------------


def flask_hint(instance_path: str | None) -> str:
    """How the user can run ``flask --app example_app`` from a shell in the checkout."""
    flask_bin = Path(sys.executable).parent / "flask"
    on_path = shutil.which("flask")
    if on_path and Path(on_path).resolve() == flask_bin.resolve():
        command = "flask"
    elif flask_bin.exists():
        try:
            command = str(flask_bin.absolute().relative_to(ROOT))
        except ValueError:
            command = str(flask_bin)
    else:
        command = f"{sys.executable} -m flask"
    prefix = f"EXAMPLE_INSTANCE_PATH={shlex.quote(instance_path)} " if instance_path else ""
    return f"{prefix}{command} --app example_app"


def print_guide(base: str, flask: str) -> None:
    say(
        f"""
The example app is at {base} (loopback only); a worker with 2 threads runs its jobs.
The queue's admin dashboard is at {base}admin/ (open to this machine with no login: a
demo, do not deploy like this).

Try it:
  curl -s {base}
  curl -s -X POST {base}webhooks/payments -H 'Content-Type: application/json' \\
       -d '{{"id": "evt_42", "type": "payment.succeeded", "data": {{"amount": 500}}}}'
       (send it twice: the same job id comes back, and one job runs)
  curl -s -X POST {base}reports -H 'Content-Type: application/json' \\
       -d '{{"report_id": 7, "format": "csv"}}'
  curl -s -X POST {base}orders/42/shipping-quote
  curl -s {base}jobs/1

Inspect the queue from another shell in {ROOT}:
  {flask} queue status
  {flask} queue list
  {flask} queue list --status dead
  {flask} queue show 1
  {flask} queue retry --dead
"""
    )


def print_jobs(base: str, job_ids: list[int]) -> None:
    say("The sample jobs now:")
    for job_id in job_ids:
        status, job = call("GET", f"{base}jobs/{job_id}")
        if status != 200:
            say(f"  job {job_id}: {status} {job}")
            continue
        line = (
            f"  job {job['id']:<4} {job['task'].rsplit('.', 1)[-1]:<21} {job['status']:<9} "
            f"attempts {job['attempts']}/{job['max_attempts']}"
        )
        if job["status"] == "completed" and job["attempts"] > 1:
            line += f"  (after {job['attempts'] - 1} failed attempt(s))"
        elif job["last_error"]:
            line += f"  last error: {job['last_error']}"
        say(line)


def queue_status(env: dict[str, str]) -> None:
    done = subprocess.run(
        flask_args("queue", "status"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    say("$ flask --app example_app queue status")
    say(done.stdout.rstrip())
    if done.stderr.strip():
        say(done.stderr.rstrip())


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_app.demo",
        description="Run the example app and a worker on SQLite, with a few sample jobs.",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        metavar="N",
        help="stop N seconds after posting the sample jobs, printing the queue's status",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"web app port on {HOST} (default {DEFAULT_PORT}, or a free one if it is "
        "taken; 0: any free port)",
    )
    parser.add_argument(
        "--instance-path",
        metavar="DIR",
        help="instance folder holding the SQLite database and the tasks' logs "
        "(default: instance/ in the checkout)",
    )
    parser.add_argument(
        "--reset",
        action="store_true",
        help="delete the queue database and the tasks' logs first",
    )
    args = parser.parse_args(argv)
    if args.seconds is not None and not args.seconds >= 0:
        parser.error("--seconds must be zero or more")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be between 0 and 65535")
    return args


def reset(instance_path: str | None) -> None:
    from example_app import create_app
    from example_app.tasks import queue

    app = create_app(instance_path=instance_path)
    engine = queue.state(app).store.engine
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database:
        raise DemoError("--reset only deletes the SQLite file; drop other databases yourself")
    doomed = [database + suffix for suffix in ("", "-wal", "-shm")]
    doomed += [os.path.join(app.instance_path, name) for name in ("payments.log", "outbox.log")]
    for path in doomed:
        if os.path.exists(path):
            os.remove(path)
            say(f"removed {path}")


def setup_database(env: dict[str, str]) -> None:
    say("$ flask --app example_app queue db upgrade")
    upgrade = subprocess.run(
        flask_args("queue", "db", "upgrade"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    say((upgrade.stdout + upgrade.stderr).rstrip())
    if upgrade.returncode != 0:
        raise DemoError("could not create the queue's tables")


def choose_port(wanted: int) -> int:
    if wanted and port_is_free(wanted):
        return wanted
    if wanted:
        say(f"port {wanted} is taken; using a free one")
    return free_port()


def run(args: argparse.Namespace, stop: threading.Event, children: list[Child]) -> None:
    """Everything between the signal handlers and the final clean-up."""
    instance_path = os.path.abspath(args.instance_path) if args.instance_path else None
    env = child_env(instance_path)
    if args.reset:
        reset(instance_path)
    setup_database(env)
    if stop.is_set():
        return
    port = choose_port(args.port)
    base = f"http://{HOST}:{port}/"
    worker_args = flask_args("queue", "work", "--concurrency", "2", "--grace", "10")
    children.append(Child("worker", worker_args, env))
    web = Child("web", flask_args("run", "--host", HOST, "--port", str(port), "--no-reload"), env)
    children.append(web)
    web.quiet.set()
    wait_until_serving(base, web, 60, stop)
    if stop.is_set():
        return
    job_ids = post_samples(base)
    time.sleep(0.2)  # let the access-log lines of those requests go by, unshown
    web.quiet.clear()
    print_guide(base, flask_hint(instance_path))
    if args.seconds is None:
        say("Press Ctrl-C to stop the worker and the web app.\n")
    else:
        say(f"Running for {args.seconds:g} seconds...\n")

    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    while not stop.is_set():
        if deadline is not None and time.monotonic() >= deadline:
            break
        stopped = [child.name for child in children if not child.running]
        if stopped:
            raise DemoError(f"the {' and the '.join(stopped)} stopped unexpectedly")
        stop.wait(0.2)
    if stop.is_set():
        return
    say()
    web.quiet.set()
    print_jobs(base, job_ids)
    say()
    queue_status(env)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    children: list[Child] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():  # a second Ctrl-C: do not wait any longer
            for child in children:
                child.kill()
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        run(args, stop, children)
    except (DemoError, OSError, subprocess.SubprocessError) as exc:
        say(f"demo: {exc}")
        return 1
    finally:
        if any(child.running for child in children):
            say("\nStopping the web app and the worker...")
        stop_children(children)
    say("Stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

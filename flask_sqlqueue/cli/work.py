"""``flask queue work``: run jobs until stopped, with the signals' graceful stop."""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource
from flask import Flask
from flask.cli import ScriptInfo

from ..core import logcontext
from ..core.enqueue import check_options
from ..core.worker import Worker
from ..core.worker import WorkerOptions
from ..extension import resolve_app
from .base import app_state
from .base import clean_errors
from .base import queue_cli
from .health import SystemdNotifier
from .signalwatch import SignalWatch

if TYPE_CHECKING:
    from ..metrics import WorkerServer

log = logging.getLogger("flask_sqlqueue.worker")
#: The flags' defaults are the worker's own: written once, in ``WorkerOptions``.
WORKER_DEFAULTS = WorkerOptions()


@queue_cli.command("work")
@click.option(
    "--queue", "queues", multiple=True, help="Serve this queue (repeatable). Default: all."
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 256),
    default=WORKER_DEFAULTS.concurrency,
    show_default=True,
    help="Threads running jobs in this process.",
)
@click.option("--burst", is_flag=True, help="Exit 0 once no job is eligible now.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(0.01, 3600),
    default=WORKER_DEFAULTS.poll_interval,
    show_default=True,
    help="Seconds between polls while idle.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 86400),
    default=WORKER_DEFAULTS.grace,
    show_default=True,
    help="Seconds to let running jobs finish after SIGTERM/SIGINT.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(1, 256),
    help="Run every job in a child process, this many at once (instead of --concurrency "
    "threads): task timeouts are enforced and running jobs can be cancelled.",
)
@click.option(
    "--max-jobs-per-child",
    type=click.IntRange(1, None),
    help="With --processes (or isolate=True tasks): a child process exits after this many "
    "attempts and a fresh one takes its place, started during its last attempt.",
)
@click.option(
    "--max-memory-per-child",
    type=click.IntRange(1, None),
    metavar="MIB",
    help="With --processes (or isolate=True tasks): a child process whose resident memory "
    "is over this many MiB after an attempt exits, and a fresh one takes its place (Linux).",
)
@click.option(
    "--spare-children",
    type=click.IntRange(0, 64),
    default=0,
    show_default=True,
    help="With --processes: keep this many idle child processes started beyond the busy "
    "ones, so a child killed or recycled leaves no job waiting for a fresh interpreter.",
)
@click.option(
    "--claim-ahead",
    type=click.IntRange(0, 10_000),
    default=WORKER_DEFAULTS.claim_ahead,
    show_default=True,
    help="While jobs are short, claim up to this many beyond the free threads, so one "
    "commit serves many jobs; 0 claims only for free threads.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="The worker's log lines from this level up (and the app's, unless it configures "
    "logging itself).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line, with the job's fields (job_id, task, attempt, "
    "queue, outcome, duration). Applies where the app has not configured logging.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve this worker's Prometheus counters on /metrics, and /healthz and /readyz, "
    "on this port (needs the [prometheus] extra).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="The address --metrics-port listens on; 0.0.0.0 (or ::) for a scraper or a "
    "probe from outside the host or container.",
)
@click.option(
    "--health-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Touch this file on every heartbeat that went through: its age is the time since "
    "the worker last could claim.",
)
@clean_errors
def work_command(
    queues: tuple[str, ...],
    concurrency: int,
    burst: bool,
    poll_interval: float,
    grace: float,
    processes: int | None,
    max_jobs_per_child: int | None,
    max_memory_per_child: int | None,
    spare_children: int,
    claim_ahead: int,
    log_level: str,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    health_file: Path | None,
) -> None:
    """Run jobs until stopped.

    SIGTERM or Ctrl-C: claim nothing more, let running jobs finish within --grace
    seconds, hand unfinished ones back to pending, exit 0. A second signal exits at once.

    With --processes N, N child processes (each loading the app) run the jobs, one at a
    time each; a task's timeout kills its attempt, which counts as failed. Tasks declared
    with isolate=True run in a child process in either mode.

    \b
    Example:
      flask queue work --queue default --queue mail --concurrency 4
      flask queue work --processes 4 --max-jobs-per-child 1000
      flask queue work --processes 4 --max-memory-per-child 500
      flask queue work --processes 4 --spare-children 1
      flask queue work --metrics-port 9100 --metrics-host 0.0.0.0
    """
    for name in queues:
        check_options(queue=name)
    ctx = click.get_current_context()
    if processes and ctx.get_parameter_source("concurrency") is not ParameterSource.DEFAULT:
        raise click.UsageError("Give --processes or --concurrency, not both.")
    state = app_state(check_schema=False)
    state.check_worker_can_run()  # first: a worker's process may have no tables to check
    state.ensure_schema()
    isolated = any(task.isolate for task in state.registry.values())
    for flag, given in (
        ("--max-jobs-per-child", max_jobs_per_child),
        ("--max-memory-per-child", max_memory_per_child),
    ):
        if given and not (processes or isolated):
            raise click.UsageError(f"{flag} recycles child processes: give --processes N too.")
    if spare_children and not processes:
        raise click.UsageError("--spare-children keeps child processes: give --processes N too.")
    logcontext.configure(
        logging.getLevelNamesMapping()[log_level.upper()], json_lines=log_format == "json"
    )
    options = state.worker_options(
        queues=tuple(dict.fromkeys(queues)),
        concurrency=concurrency,
        poll_interval=poll_interval,
        grace=grace,
        processes=processes or 0,
        claim_ahead=claim_ahead,
        max_jobs_per_child=max_jobs_per_child or 0,
        max_memory_per_child=max_memory_per_child or 0,
        spare_children=spare_children,
    )
    loader = None
    if processes or isolated:
        from ..processes import AppLoader

        loader = AppLoader.from_script_info(ctx.ensure_object(ScriptInfo))
    app = resolve_app()
    worker = state.queue.worker(options, app, loader=loader)
    notifier = SystemdNotifier.from_environment()
    _watch_health(worker, notifier, health_file)
    # Bound before the first claim: a port in use stops the worker with nothing claimed.
    server = None if metrics_port is None else _serve(app, worker, metrics_host, metrics_port)

    def on_signal(signum: int) -> None:
        # On the signal watch's thread, never in a signal handler (cli/signalwatch.py).
        # Log records, not bare lines: with --log-format json every line parses.
        if worker.stopping:
            log.warning("second signal: exiting now")
            logging.shutdown()
            os._exit(1)
        log.info("%s: finishing running jobs (up to %gs)", signal.Signals(signum).name, grace)
        worker.stop()
        notifier.stopping()

    try:
        with SignalWatch(on_signal):
            worker.run(burst=burst)
    finally:
        notifier.stopping()
        if server is not None:
            server.close()


def _watch_health(worker: Worker, notifier: SystemdNotifier, health_file: Path | None) -> None:
    """Push the worker's healthy moments to the health file and to systemd."""
    if health_file is not None:
        try:
            health_file.open("a").close()  # writable? (its first touch is the first beat's)
        except OSError as exc:
            raise click.ClickException(
                f"cannot write the health file {health_file}: {exc.strerror}; "
                "give --health-file a path in a writable directory"
            ) from None
        worker.on_healthy(health_file.touch)
    if notifier.active:
        watchdog = notifier.watchdog_seconds()
        interval = worker.options.heartbeat_interval
        if watchdog is not None and watchdog < 2 * interval:
            log.warning(
                "WatchdogSec=%gs is less than two heartbeats (%gs each): systemd may kill a "
                "healthy worker; raise WatchdogSec or lower SQLQUEUE_STALE_AFTER",
                watchdog,
                interval,
            )
        worker.on_healthy(notifier.healthy)


def _serve(app: Flask, worker: Worker, host: str, port: int) -> WorkerServer:
    try:
        from ..metrics import serve_worker
    except ImportError as exc:  # its message names the extra to install
        raise click.ClickException(f"--metrics-port: {exc}") from None
    try:
        return serve_worker(app, worker.health, host, port)
    except OSError as exc:
        fix = (
            "give --metrics-port a free port"
            if exc.errno == errno.EADDRINUSE
            else "give --metrics-host an address of this host"
        )
        raise click.ClickException(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; {fix}"
        ) from None

"""Prometheus metrics for the queue. Needs ``pip install 'flask-sqlqueue[prometheus]'``.

Two sources, one registry:

- :class:`QueueCollector` reads the queue's tables at each scrape: jobs by queue and
  status, jobs eligible now (queue depth) and the age of the oldest eligible job. Any
  process can serve these (the web app, a sidecar).
- :class:`JobCounters` counts what the signals report in *this* process: enqueued jobs,
  attempts by outcome with their durations, retries, dead and rescued jobs. A worker
  serves its own with ``flask queue work --metrics-port PORT`` (:func:`serve_worker`,
  docs/operations.md), with its ``/healthz`` and ``/readyz``.

::

    from flask_sqlqueue.metrics import QueueMetrics

    metrics = QueueMetrics(app)                 # both, on a registry of its own
    app.register_blueprint(
        queue.metrics_blueprint(authorize=lambda: True), url_prefix="/queue-metrics"
    )                                           # GET /queue-metrics/metrics
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

try:
    from prometheus_client import CONTENT_TYPE_LATEST
    from prometheus_client import CollectorRegistry
    from prometheus_client import Counter
    from prometheus_client import Histogram
    from prometheus_client import ProcessCollector
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        "flask_sqlqueue.metrics needs prometheus_client, which is not installed; "
        "install it with: pip install 'flask-sqlqueue[prometheus]'"
    ) from exc

from flask import Blueprint
from flask import Flask
from flask import Response
from flask import current_app
from werkzeug.wrappers import Response as BaseResponse

from . import access
from .core import queries
from .core import signals
from .core.models import JobStatus
from .core.worker import Health
from .extension import queue_state

__all__ = [
    "JobCounters",
    "QueueCollector",
    "QueueMetrics",
    "WorkerServer",
    "create_blueprint",
    "metrics_for",
    "serve_worker",
]

#: Seconds; from a fast callback to a long report.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_EXTENSION_KEY = "sqlqueue_metrics"


class QueueCollector(Collector):
    """Gauges read from the queue's database at each scrape (two grouped queries)."""

    def __init__(self, app: Flask) -> None:
        self.app = app

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = queue_state(self.app).store
        now = store.now()
        with store.read() as conn:
            # The counts and the jobs due come from the one read that `flask queue
            # status` and the dashboard make, so the three never disagree.
            by_queue = queries.status(conn, now)
        counts = GaugeMetricFamily(
            "sqlqueue_jobs",
            "Jobs in the queue's table, by queue and status.",
            labels=["queue", "status"],
        )
        depth = GaugeMetricFamily(
            "sqlqueue_queue_depth", "Pending jobs eligible to run now.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "sqlqueue_oldest_eligible_age_seconds",
            "How long the oldest eligible pending job has waited (0 when none waits, NaN "
            "when its run_at holds what no timestamp can: a row edited by hand).",
            labels=["queue"],
        )
        for row in by_queue:
            for status in {*(s.value for s in JobStatus), *row.counts}:
                counts.add_metric([row.queue, status], row.counts.get(status, 0))
            depth.add_metric([row.queue], row.eligible)
            if row.oldest_unreadable is not None:
                oldest.add_metric([row.queue], math.nan)  # not 0: a job does wait
                continue
            age = (
                0.0 if row.oldest_eligible is None else (now - row.oldest_eligible).total_seconds()
            )
            oldest.add_metric([row.queue], max(age, 0.0))
        yield counts
        yield depth
        yield oldest


class JobCounters:
    """Counters and a duration histogram fed by the queue's signals in this process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["queue", "task"]
        self.enqueued = Counter(
            "sqlqueue_jobs_enqueued", "Jobs enqueued.", labels, registry=registry
        )
        self.attempts = Counter(
            "sqlqueue_attempts",
            "Attempts that ended, by outcome (succeeded, failed, cancelled).",
            [*labels, "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "sqlqueue_attempt_duration_seconds",
            "How long attempts ran, by outcome.",
            [*labels, "outcome"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.retried = Counter(
            "sqlqueue_jobs_retried", "Failed attempts retried.", labels, registry=registry
        )
        self.dead = Counter("sqlqueue_jobs_dead", "Jobs that went dead.", labels, registry=registry)
        self.rescued = Counter(
            "sqlqueue_jobs_rescued", "Jobs taken back from lost workers.", labels, registry=registry
        )
        self._started: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()
        self._receivers: list[tuple[Any, Callable[..., None]]] = []

    def connect(self, sender: Any = None) -> JobCounters:
        """Start counting (signals from ``sender`` only, or from any sender)."""
        pairs: list[tuple[Any, Callable[..., None]]] = [
            (signals.job_enqueued, self._on_enqueued),
            (signals.job_started, self._on_started),
            (signals.job_succeeded, self._ended("succeeded")),
            (signals.job_failed, self._ended("failed")),
            (signals.job_cancelled, self._ended("cancelled")),
            (signals.job_retried, self._count(self.retried)),
            (signals.job_dead, self._count(self.dead)),
            (signals.job_rescued, self._count(self.rescued)),
        ]
        for signal, receiver in pairs:
            if sender is None:
                signal.connect(receiver, weak=False)
            else:
                signal.connect(receiver, sender=sender, weak=False)
            self._receivers.append((signal, receiver))
        return self

    def disconnect(self) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()

    def _on_enqueued(self, _sender: Any, *, job: Any, **_: Any) -> None:
        self.enqueued.labels(job.queue, job.task).inc()

    def _on_started(self, _sender: Any, *, job: Any, **_: Any) -> None:
        with self._lock:
            self._started[(job.id, job.attempts)] = time.monotonic()

    def _ended(self, outcome: str) -> Callable[..., None]:
        def receiver(_sender: Any, *, job: Any, **_: Any) -> None:
            with self._lock:
                began = self._started.pop((job.id, job.attempts), None)
            self.attempts.labels(job.queue, job.task, outcome).inc()
            if began is not None:
                self.duration.labels(job.queue, job.task, outcome).observe(time.monotonic() - began)

        return receiver

    def _count(self, counter: Counter) -> Callable[..., None]:
        def receiver(_sender: Any, *, job: Any, **_: Any) -> None:
            if job is not None:
                counter.labels(job.queue, job.task).inc()

        return receiver


class QueueMetrics:
    """:class:`QueueCollector` and :class:`JobCounters` for ``app`` on one registry.

    :param registry: default: a registry of its own. Pass
        ``prometheus_client.REGISTRY`` to serve them with the process's other metrics.
    """

    def __init__(self, app: Flask, registry: CollectorRegistry | None = None) -> None:
        self.app = app
        self.registry = CollectorRegistry() if registry is None else registry
        self.collector = QueueCollector(app)
        self.registry.register(self.collector)
        self.counters = JobCounters(self.registry).connect(sender=app)

    def latest(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop counting and unregister everything from the registry."""
        self.counters.disconnect()
        self.registry.unregister(self.collector)
        for metric in (
            self.counters.enqueued,
            self.counters.attempts,
            self.counters.duration,
            self.counters.retried,
            self.counters.dead,
            self.counters.rescued,
        ):
            self.registry.unregister(metric)


def metrics_for(app: Flask) -> QueueMetrics:
    """The app's :class:`QueueMetrics`, made on first use (on a registry of its own)."""
    found = app.extensions.get(_EXTENSION_KEY)
    if found is None:
        found = app.extensions[_EXTENSION_KEY] = QueueMetrics(app)
    return found


def create_blueprint(authorize: access.Authorize | None = None) -> Blueprint:
    """A blueprint serving ``GET /metrics`` in Prometheus' text format.

    Closed by default like the admin (:mod:`flask_sqlqueue.access`): every request
    calls ``authorize()``; ``True`` lets it through, a response is sent as it is,
    anything else is a 403, and without ``authorize`` every request is a 403 saying how
    to configure it.
    """
    bp = Blueprint("sqlqueue_metrics", __name__)

    @bp.record_once
    def _start_counting(state: Any) -> None:
        metrics_for(state.app)

    @bp.before_request
    def _gate() -> BaseResponse | None:
        return access.gate(
            authorize, _refuse, what="queue metrics endpoint", factory="metrics_blueprint"
        )

    @bp.get("/metrics")
    def metrics() -> Response:
        app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        return Response(metrics_for(app).latest(), content_type=CONTENT_TYPE_LATEST)

    return bp


def _refuse(message: str) -> Response:
    return Response(message + "\n", status=403, content_type="text/plain; charset=utf-8")


# -- a worker's own port: its counters, its liveness and readiness -----------------------------


class WorkerServer(ThreadingHTTPServer):
    """The HTTP server of ``flask queue work --metrics-port``, on a thread of its own.

    ``GET /metrics``: this process's :class:`JobCounters` (every attempt the worker
    recorded, those its child processes ran included) and the process's CPU and memory;
    no database gauges, which would repeat in every worker (serve those from one place,
    :func:`create_blueprint`). ``GET /healthz``: 200 while the worker is live, else 503;
    ``GET /readyz``: 200 while it claims jobs, else 503 (:class:`~.core.worker.Health`).
    Neither touches the database. No ``authorize`` gate: bind it where only the scraper
    and the orchestrator can reach it.
    """

    daemon_threads = True
    #: Connections served at once (a thread each); one more is closed unanswered.
    max_connections = 32

    def __init__(self, address: tuple[str, int], app: Flask, health: Callable[[], Health]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.health = health
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.registry = CollectorRegistry()
        super().__init__(address, _WorkerHandler)  # binds first: nothing to undo if it fails
        ProcessCollector(registry=self.registry)
        self.counters = JobCounters(self.registry).connect(sender=app)
        self._thread = threading.Thread(
            target=self.serve_forever, name="sqlqueue-metrics", daemon=True
        )
        self._thread.start()

    def process_request(self, request: Any, client_address: Any) -> None:
        # A thread per connection, as many as max_connections: idle clients holding
        # connections open cannot pile threads up (each also times out, _WorkerHandler).
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Stop serving, close the socket and stop counting."""
        self.shutdown()
        self._thread.join(timeout=5)
        self.server_close()
        self.counters.disconnect()


def serve_worker(app: Flask, health: Callable[[], Health], host: str, port: int) -> WorkerServer:
    """Count ``app``'s jobs in this process and serve them on ``host:port`` from a daemon
    thread, with the worker's ``health`` (see :class:`WorkerServer`).

    :raises OSError: the address cannot be bound (a port in use, say); nothing was
        started then.
    """
    return WorkerServer((host, port), app, health)


class _WorkerHandler(BaseHTTPRequestHandler):
    server: WorkerServer
    #: Seconds a client may take to send its request (and to read the answer): a
    #: scraper or a probe sends it at once.
    timeout = 5

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.server.registry), content_type)
            return
        if path not in ("/healthz", "/readyz"):
            self._send(404, b"not found; try /metrics, /healthz or /readyz\n")
            return
        health = self.server.health()
        ok = health.live if path == "/healthz" else health.ready
        text = "ok" if ok else health.reason
        self._send(200 if ok else 503, f"{text}\n".encode())

    def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a scrape or a probe every few seconds would flood the worker's log."""

"""Pickup latency: how long a job waits for an idle worker, from commit to start.

    python benchmarks/latency.py --database-url URL [--samples 200] [--poll-interval 1]

Starts one real ``flask queue work`` process, lets it go idle, then enqueues one job at a
time from this process (another process, as a web app would be) and waits for it to
finish before the next. Latency is the job's ``started_at - created_at``, both taken from
the database's clock, so it includes the wake-up or poll, the claim and the dispatch.
For a server URL a fresh database is created and dropped; for SQLite a temporary file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos.harness import fresh_database  # noqa: E402  (needs ROOT on the path)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def measure(url: str, samples: int, poll_interval: float) -> dict[str, float]:
    from benchmarks import bench_app

    os.environ["BENCH_DATABASE_URI"] = url
    app = bench_app.create_app()
    bench_app.queue.upgrade_database(app=app)
    env = {
        **os.environ,
        "FLASK_APP": "benchmarks.bench_app:create_app",
        "PYTHONPATH": str(ROOT),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "flask", "queue", "work", "--poll-interval", str(poll_interval)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latencies: list[float] = []
    try:
        with app.app_context():
            warm = bench_app.noop.enqueue()
            _wait_done(bench_app.queue, warm.id, worker)
            for _ in range(samples):
                time.sleep(0.02)  # the worker is idle again, waiting
                job = bench_app.noop.enqueue()
                done = _wait_done(bench_app.queue, job.id, worker)
                assert done.started_at is not None
                latencies.append((done.started_at - done.created_at).total_seconds() * 1000)
    finally:
        worker.terminate()
        worker.wait(30)
        app.extensions["sqlqueue"].store.engine.dispose()
    return {
        "p50": percentile(latencies, 50),
        "p95": percentile(latencies, 95),
        "p99": percentile(latencies, 99),
        "max": max(latencies),
        "mean": statistics.fmean(latencies),
    }


def _wait_done(queue: object, job_id: int, worker: subprocess.Popen[bytes]) -> object:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = queue.get_job(job_id)  # type: ignore[attr-defined]
        if job is not None and job.finished_at is not None:
            return job
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode}")
        time.sleep(0.002)
    raise TimeoutError(f"job {job_id} was not picked up within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, action="append", dest="urls")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    print(
        f"Pickup latency, idle worker, {args.samples} jobs one at a time, "
        f"--poll-interval {args.poll_interval:g}; {os.cpu_count()} cores\n"
    )
    print("| database | p50 ms | p95 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for url in args.urls:
        with tempfile.TemporaryDirectory() as folder:
            with fresh_database(url, Path(folder), "latency") as fresh:
                figures = measure(fresh, args.samples, args.poll_interval)
        name = sa.make_url(url).get_backend_name()
        print(
            f"| {name} | {figures['p50']:.1f} | {figures['p95']:.1f} | "
            f"{figures['p99']:.1f} | {figures['max']:.1f} |"
        )


if __name__ == "__main__":
    main()

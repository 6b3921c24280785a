"""Drain throughput: how fast one real worker process empties a pre-filled queue.

    python benchmarks/drain.py --database-url sqlite:/// [--jobs 20000] [--concurrency 4]
    python benchmarks/drain.py --database-url postgresql+psycopg://postgres@127.0.0.1/test
    python benchmarks/drain.py --database-url sqlite:/// --profile py-spy --out prof.txt

Fills the queue with ``--jobs`` no-op jobs (``bench.noop`` from ``benchmarks/bench_app.py``)
with ``enqueue_many``, then runs ``flask queue work --burst --concurrency C`` as a real
process until it exits, and verifies that exactly ``--jobs`` rows are ``completed``.
``--concurrency`` and ``--runs`` may be given several times / as a count; each run gets a
fresh database (SQLite: a temp file; a server URL: a database created and dropped).

Figures:

- *drain jobs/s*: jobs / (last ``finished_at`` - first ``started_at``), both stamped by the
  queue's clock: the steady-state rate, without the process's start-up.
- *process jobs/s*: jobs / wall time of the whole worker process, start-up included.
- *fill jobs/s*: the ``enqueue_many`` rate of the fill, in batches of ``--batch``
  (``--jobs 20001 --batch 20000 --fill-only``: one call of 20,000 jobs, and no drain).

``--profile py-spy`` samples every thread of the worker (``py-spy record --threads
--format raw``) and prints the functions with the most samples, both "self" (the frame
on top of the stack) and "inclusive" (anywhere on the stack), as shares of the samples
in the job threads and the dispatcher; ``--out`` keeps the raw collapsed stacks.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.chaos.harness import fresh_database  # noqa: E402  (needs ROOT on the path)


def fill(url: str, jobs: int, batch: int) -> float:
    """Enqueue ``jobs`` no-op jobs; returns the seconds it took."""
    from benchmarks import bench_app

    os.environ["BENCH_DATABASE_URI"] = url
    app = bench_app.create_app()
    bench_app.queue.upgrade_database(app=app)
    try:
        with app.app_context():
            bench_app.noop.enqueue()  # the schema check, outside the timing
            bench_app.queue.state().store.engine.dispose()
            started = time.perf_counter()
            left = jobs - 1
            while left > 0:
                n = min(batch, left)
                if hasattr(bench_app.noop, "enqueue_many"):
                    bench_app.noop.enqueue_many([((), {})] * n)
                else:  # a flask_sqlqueue from before enqueue_many, for "before" figures
                    _fill_rows(bench_app.queue.state().store, n)
                left -= n
            return time.perf_counter() - started
    finally:
        app.extensions["sqlqueue"].store.engine.dispose()


def _fill_rows(store: Any, n: int) -> None:
    from flask_sqlqueue.core.models import jobs
    from flask_sqlqueue.core.options import EnqueueOptions
    from flask_sqlqueue.core.options import job_values

    payload = '{"args":[],"kwargs":{}}'
    row = job_values(
        "bench.noop", payload, EnqueueOptions(), default_max_attempts=5, now=store.now()
    )
    with store.write() as conn:
        conn.execute(sa.insert(jobs), [row] * n)


def drain(
    url: str, jobs: int, concurrency: int, profile: str | None, out: Path | None
) -> dict[str, Any]:
    env = {
        **os.environ,
        "FLASK_APP": "benchmarks.bench_app:create_app",
        "BENCH_DATABASE_URI": url,
        "PYTHONPATH": str(ROOT),
    }
    command = [
        sys.executable,
        "-m",
        "flask",
        "queue",
        "work",
        "--burst",
        "--concurrency",
        str(concurrency),
        "--poll-interval",
        "0.5",
    ]
    raw = None
    if profile == "py-spy":
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        raw = Path(tempfile.mkstemp(suffix=".txt")[1])
        command = [
            spy,
            "record",
            "--threads",
            "--format",
            "raw",
            "--rate",
            "250",
            "--output",
            str(raw),
            "--",
            *command,
        ]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the worker exited with {done.returncode}:\n{done.stderr[-3000:]}")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            completed, first, last = conn.execute(
                sa.text(
                    "SELECT count(*), min(started_at), max(finished_at) FROM sqlqueue_jobs "
                    "WHERE status = 'completed'"
                )
            ).one()
            total = conn.execute(sa.text("SELECT count(*) FROM sqlqueue_jobs")).scalar_one()
    finally:
        engine.dispose()
    if completed != jobs or total != jobs:
        raise RuntimeError(f"{completed} of {total} rows completed, expected {jobs} of {jobs}")
    if isinstance(first, str):  # SQLite keeps timestamps as text
        first, last = datetime.fromisoformat(first), datetime.fromisoformat(last)
    span = (last - first).total_seconds()
    figures = {"drain": jobs / span, "process": jobs / wall, "wall": wall}
    if raw is not None:
        figures["profile"] = summarize(raw.read_text())
        if out is not None:
            shutil.copy(raw, out)
        raw.unlink()
    return figures


def summarize(collapsed: str, top: int = 25) -> str:
    """Self and inclusive sample shares per function, over the worker's busy threads."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl_counts: collections.Counter[str] = collections.Counter()
    per_thread: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        per_thread[thread.split(" ")[0] + " " + " ".join(thread.split(" ")[2:3])] += count
        frames = frames[1:]
        if not frames:
            continue
        total += count
        self_counts[_short(frames[-1])] += count
        for name in {_short(f) for f in frames}:
            incl_counts[name] += count
    lines = [f"samples: {total}", "", "by thread:"]
    lines += [f"  {n:7d}  {name}" for name, n in per_thread.most_common(12)]
    lines += ["", "self (top of stack):"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in self_counts.most_common(top)]
    lines += ["", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {name}" for name, n in incl_counts.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


def _median(rates: list[float]) -> str:
    return f"{statistics.median(rates):,.0f}" if rates else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, action="append", dest="urls")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000, help="enqueue_many batch size")
    parser.add_argument("--concurrency", type=int, action="append", dest="concurrencies")
    parser.add_argument("--runs", type=int, default=1, help="runs per setting; median shown")
    parser.add_argument("--fill-only", action="store_true", help="time the fill, drain nothing")
    parser.add_argument("--profile", choices=["py-spy"], default=None)
    parser.add_argument("--out", type=Path, default=None, help="keep py-spy's raw stacks here")
    args = parser.parse_args()
    concurrencies = args.concurrencies or [1]
    print(
        f"Drain of {args.jobs} no-op jobs by one `flask queue work --burst` process; "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; "
        f"median of {args.runs} run(s)\n"
    )
    print("| database | concurrency | drain jobs/s | process jobs/s | fill jobs/s |")
    print("|---|---:|---:|---:|---:|")
    profiles = []
    for url in args.urls:
        name = sa.make_url(url).get_backend_name()
        for concurrency in concurrencies:
            drains, processes, fills = [], [], []
            for _ in range(args.runs):
                with (
                    tempfile.TemporaryDirectory() as folder,
                    fresh_database(url, Path(folder), "drain") as fresh,
                ):
                    fills.append(args.jobs / fill(fresh, args.jobs, args.batch))
                    if args.fill_only:
                        continue
                    figures = drain(fresh, args.jobs, concurrency, args.profile, args.out)
                drains.append(figures["drain"])
                processes.append(figures["process"])
                if "profile" in figures:
                    profiles.append((name, concurrency, figures["profile"]))
            each = ", ".join(f"{rate:,.0f}" for rate in fills)
            print(
                f"| {name} | {concurrency} | {_median(drains)} | {_median(processes)} | "
                f"{_median(fills)} ({each}) |",
                flush=True,
            )
    for name, concurrency, text in profiles:
        print(f"\n## py-spy, {name}, concurrency {concurrency}\n\n```\n{text}\n```")


if __name__ == "__main__":
    main()

"""flask_sqlqueue and its peers on the same job, in one run (issue 7).

    python -m benchmarks.peers [--section defaults|matched|all] [--runs 3] [--jobs 10000]
                               [--samples 100] [--only name,...] [--concurrency 1,4]
                               [--postgres URL] [--mysql URL] [--quick] [--output FILE]

Every system runs the same small job, ``write(i=..., email=...)``, which appends one line
to a file; finished jobs are counted as that file's lines, for every system alike, and
after every drain the file must hold each job exactly once.

Section 1, *at the defaults*: each system's worker started with exactly the command its
users type, nothing tuned (``flask queue work``, ``huey_consumer ...``, ``pgq run ...``,
``procrastinate ... worker``, ``rq worker ...``, ``celery ... worker``). Measured: the
one-commit enqueue (the timed fill of the queue), the drain with one worker process and
with two from their spawn (and from the first finished job, and the first job's delay),
the pickup latency of an idle worker, the worker's peak RSS; then flask_sqlqueue's targets,
each a ratio of figures of the same run, met or not.

Section 2, *at matched settings*: each system tuned as its docs recommend for throughput
at each ``--concurrency`` (default ``1,4``): ``flask queue work --concurrency N``, Huey
``-w N -k thread``, Procrastinate ``--concurrency N``, PgQueuer ``--batch-size N``,
Celery ``--pool threads --concurrency N``, RQ's ``SimpleWorker``; every worker's logging
quiet and Huey's SQLite fsynced as flask_sqlqueue's. An RQ worker process runs one job at
a time and the raw ceilings claim 100 jobs per transaction whatever the setting: they
are measured once and shown at each.

Needs the ``bench`` extra (``pip install -e '.[bench]'``), ``redis-server`` for RQ and
Celery (started here on a free loopback port, without persistence, and stopped at the
end), a PostgreSQL server for the PostgreSQL rows and a MariaDB server for the MariaDB
rows (each system gets a database of its own, created and dropped). Systems whose server
is missing are skipped with a note.
"""

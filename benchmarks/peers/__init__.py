"""flask_sqlqueue and its peers on the same workloads, in one run (issue 7).

    python -m benchmarks.peers [--jobs N] [--runs 3] [--only name,...] [--concurrency 1,4]
                               [--postgres URL] [--mysql URL] [--quick]
                               [--output benchmarks/results/peers.md]

Needs the ``bench`` extra (``pip install -e '.[bench]'``), ``redis-server`` for RQ and
Celery (started here on a free loopback port, without persistence, and stopped at the
end), a PostgreSQL server for the PostgreSQL rows and a MariaDB server for the MariaDB
rows (each system gets a database of its own, created and dropped). Systems whose server
is missing are skipped with a note.

Every worker runs at each ``--concurrency`` (default ``1,4``), the same for every system
that has the setting: ``flask queue work --concurrency N``, Huey ``-w N -k thread``,
Procrastinate ``--concurrency N``, PgQueuer ``--batch-size N``, Celery ``--pool threads
--concurrency N``. An RQ worker process runs one job at a time and the raw ceilings claim
100 jobs per transaction whatever the setting: they are measured once and shown at each.
"""

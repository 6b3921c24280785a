"""flask_sqlqueue and its peers on the same workloads, in one run (issue 7).

    python -m benchmarks.peers [--jobs N] [--runs 3] [--only name,...] [--postgres URL]
                               [--quick] [--output benchmarks/results/peers.md]

Needs the ``bench`` extra (``pip install -e '.[bench,postgres]'``), ``redis-server``
for RQ and Celery (started here on a free loopback port, without persistence, and stopped
at the end) and a PostgreSQL server for the PostgreSQL rows (each system gets a database
of its own, created and dropped). Systems whose server is missing are skipped with a note.
"""

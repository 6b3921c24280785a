"""The chaos suite: real ``flask queue work`` processes, real databases, real signals.

::

    python -m benchmarks.chaos --database-url sqlite:/// --duration 60 --scenario all
    python -m benchmarks.chaos --database-url sqlite:/// --duration 300 --scenario kill-storm
    python -m benchmarks.chaos --database-url sqlite:/// --duration 300 --scenario kill-storm \
        --signal term --grace 2
    python -m benchmarks.chaos --database-url postgresql+psycopg://postgres@127.0.0.1/test \\
        --duration 30 --scenario kill-storm

Scenarios (each on a database of its own; for a server URL the script creates a fresh
database and drops it afterwards, for SQLite it uses a new file in the work directory):

``kill-storm``
    N jobs, W workers x T threads; every ``--kill-every`` seconds a random worker is
    SIGKILLed and restarted, during ``--duration`` seconds or until every job is done,
    whichever comes first; then the queue is left to finish without kills.
    ``--kill-target ready`` picks only among workers that have started.
    ``--signal term``, a SIGTERM storm: the same loop, checks and analysis, but each tick
    sends SIGTERM (a graceful stop) to a random worker that has started and spawns its
    replacement at once, while the stopped one finishes within its ``--grace`` (2 s by
    default). ``--long-share`` of the jobs (5 % by default) last 1.5-3 x ``--grace``, so
    stops hand jobs back unfinished. Besides the kill storm's checks: every SIGTERMed
    worker exits 0 within ``--grace`` + 5 s (from the signal to the process's exit); no
    success is lost (a run that finished before its worker's SIGTERM is the run its job
    records); no run is recorded that finished more than ``--grace`` + 1 s after its
    worker's SIGTERM (kept past the grace); every re-run is explained by a hand-back,
    which spends no attempt (``attempts`` = runs - runs handed back, i.e. 1) and is
    counted in ``releases`` (their sum equals the hand-backs the workers logged); no job
    needed a rescue, and none was rescued from a live worker.
``paused``
    A worker is SIGSTOPped mid-job past STALE_AFTER; another rescues and completes the
    job; on SIGCONT the paused worker's late completion must change nothing.
``sigterm``
    SIGTERM with a short and a long job: the short one finishes, the long one is handed
    back with attempts unchanged and runs once more later; an idle worker exits within
    one poll interval.
``poison``
    Jobs that ``os._exit(1)``, SIGKILL their own worker, or exhaust memory each end
    ``dead`` after exactly max_attempts while healthy jobs beside them all complete
    (the harness restarts workers that die).
``busy``
    P producer processes x E enqueues, W workers and a ``flask queue status`` poller on
    one database: no "database is locked" reaches any process, every job runs exactly
    once, and SQLite's ``PRAGMA integrity_check`` is ok.
``outage``
    The database becomes unavailable for ``--outage`` seconds while workers run (SQLite:
    another connection holds ``BEGIN EXCLUSIVE``; PostgreSQL: connections refused and
    existing ones terminated; MariaDB: the database's own account locked and its
    connections killed): workers stay alive, no attempt is consumed, nothing is lost.

Tasks append ``start|done <job> <attempt> <pid> <time>`` lines to a side file (see
``benchmarks/chaos_app.py``); the harness compares them with the job rows, its own record
of every signal it sent, and each process's log. A scenario prints a Markdown table of
figures and the violations it found; the script exits 1 if any scenario found one.

Definitions used in the tables:

- *duplicate execution*: a start line of a job beyond its first.
- *explained by a kill*: the earlier start came from a worker the harness SIGKILLed after
  that start, and that run either wrote no ``done`` line or wrote it at most 10 s before
  the kill (the task finished but its completion was not yet committed).
- *rescue latency, kill -> rescued*: from the SIGKILL of a worker to the rescuing
  worker's log line ``job=N rescued from lost worker W``, for every job it held. It spans
  STALE_AFTER and the rescuer's heartbeat period.
- *rescue latency, kill -> next start*: from the SIGKILL to the next ``start`` line of each
  job the killed worker had started and not finished. It adds the wait for a free thread;
  a rescued job keeps its ``run_at``, so it goes ahead of jobs that became due later.
- *the attempt holding the claim*: a completed job's result names the pid and attempt of
  the run that recorded it, and must be its latest attempt (``attempts``), with a done line.
- *stop time* (SIGTERM storm): from the harness's SIGTERM to the worker process's exit,
  polled every 20 ms; held to ``--grace`` + 5 s (the release of unfinished jobs, the
  last outcomes, the worker's row, its threads and the interpreter's teardown). A worker
  still running 30 s past that is SIGKILLed and counted over the bound.
- *a success lost* (SIGTERM storm): a run with a done line written before its worker's
  SIGTERM that is not the run its job's row records (the job ran again, or ended
  otherwise). Runs finishing during the grace are counted apart, as recorded or not.
- *explained by a hand-back*: the earlier run's worker logged ``job=N released unfinished
  at shutdown`` for that job.

Every wait is bounded; every child process is killed on the way out (and, on Linux, by
the kernel if the harness itself dies: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

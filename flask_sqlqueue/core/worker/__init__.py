"""The worker: claims jobs, runs them on threads, records how each attempt ended.

:class:`Worker` is a façade that wires four parts, each a module with one job and
state of its own:

- ``dispatch``: the claim loop. It claims as many jobs as there are free threads, in one
  statement, hands them to job threads, and records the successes that finished since
  its last claim in the same transaction as its next one (one commit serves both).
- ``attempt``: one attempt's execution. An :class:`~.attempt.Attempt` is made once per
  claim; the runner runs its task on a job thread or in a child process (timeouts,
  cancellation, ``current_job``) and returns how it ended as a value.
- ``outcomes``: recording those outcomes: fenced writes, the group commit's batch,
  retries of writes a fault kept back, the short error that replaces one the database
  refuses, and the log lines and signals that follow each.
- ``upkeep``: the worker's row and heartbeat thread, and what rides on the heartbeat:
  rescue, retention, the SQLite file check, the unserved-jobs warning.

``slots`` counts the claimed jobs each thread holds; ``settings`` is
:class:`WorkerOptions`. Every transaction is short: none is open while a task runs.

Threads, in :meth:`Worker.run`: the caller's runs the dispatcher's loop; ``concurrency``
job threads run attempts and record their outcomes; the heartbeat thread (upkeep); a
listener that sets the wake-up when another process enqueues; the periodic scheduler.
Two locks guard what they share, each held only for a few dict and list updates:
``Outcomes`` guards the successes waiting for a claim and the writes to retry, ``Slots``
the claimed jobs. ``Outcomes`` may take ``Slots``' lock inside its own, never the
reverse. The dispatcher, the runner and upkeep need none: each keeps state that one
thread writes (upkeep's throttle of error lines aside, where a race costs a line).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from collections.abc import Mapping
from contextlib import AbstractContextManager
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from ...exceptions import ConfigurationError
from .. import logcontext
from .. import periodic
from ..features import retention
from ..isolation import RuntimeLoader
from ..store import Store
from ..tasks import Task
from .attempt import Attempt
from .attempt import Runner
from .dispatch import Dispatcher
from .outcomes import Outcomes
from .settings import WorkerOptions as WorkerOptions
from .slots import Slots
from .upkeep import Health as Health
from .upkeep import Upkeep

__all__ = ["Health", "Worker", "WorkerOptions"]

log = logging.getLogger("flask_sqlqueue.worker")


class Worker:
    """Runs the jobs of the tasks in ``registry`` from ``store``.

    :param job_context: called once per job; the job runs inside what it returns
        (the Flask extension passes ``app.app_context``).
    :param clock: returns the current aware UTC time (default: the database's clock).
    :param rng: the source of backoff jitter; injected for tests.
    :param loader: builds the app in child processes, for isolated tasks and
        ``processes=N`` (core/isolation.py).
    """

    def __init__(
        self,
        store: Store,
        registry: Mapping[str, Task[Any, Any]],
        options: WorkerOptions | None = None,
        *,
        job_context: Callable[[], AbstractContextManager[Any]] | None = None,
        clock: Callable[[], datetime] | None = None,
        rng: random.Random | None = None,
        loader: RuntimeLoader | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.options = options or WorkerOptions(stale_after=store.settings.stale_after)
        self.job_context = job_context or nullcontext
        if self.options.processes and loader is None:
            raise ConfigurationError(
                "processes=N runs jobs in child processes, which need a loader to build the "
                "app in each child; use `flask queue work --processes N`."
            )
        self.clock = clock or store.now
        self.rng = rng or random.Random()
        self.retention = retention.RetentionPolicy.from_settings(store.settings)
        logcontext.install()  # the app's log lines inside a task name the job
        # The claim filters on these on every poll: sort them once, not per claim.
        self._task_names = tuple(sorted(registry))
        # The two events every part shares: claim nothing more, and look for jobs now.
        self._stopping = threading.Event()
        self._asked_to_stop = False  # by stop(), rather than a --burst run's end
        self._wake = threading.Event()
        self._running = False  # between run()'s start and its end
        self._slots = Slots()
        self._outcomes = Outcomes(
            store,
            self.options,
            clock=self.clock,
            rng=self.rng,
            job_context=self.job_context,
            slots=self._slots,
            wake=self._wake,
            worker_id=self._current_id,
        )
        self._upkeep = Upkeep(
            store,
            registry,
            self.options,
            task_names=self._task_names,
            clock=self.clock,
            job_context=self.job_context,
            policy=self.retention,
            slots=self._slots,
            stop=self.stop,
            wake=self._wake,
            record_late=self._outcomes.record_late,
        )
        self._runner = Runner(
            store,
            registry,
            self.options,
            self.job_context,
            loader,
            worker_id=self._current_id,
            log_db_error=self._upkeep.log_db_error,
            clock=self.clock,
        )
        self._dispatcher = Dispatcher(
            store,
            self.options,
            tasks=self._task_names,
            # Concurrency and rate limits, enforced by the claim (see core/claim.py).
            limits={n: t.limits for n, t in registry.items() if t.limits is not None},
            clock=self.clock,
            slots=self._slots,
            runner=self._runner,
            outcomes=self._outcomes,
            upkeep=self._upkeep,
            stopping=self._stopping,
            wake=self._wake,
        )

    @property
    def id(self) -> str:
        """This worker's id in the workers table (a new one if it was declared dead)."""
        return self._upkeep.id

    def _current_id(self) -> str:
        return self._upkeep.id

    # -- public API -----------------------------------------------------------------------

    def run_once(self) -> bool:
        """Claim one eligible job and run it in this thread; ``False`` if there was none."""
        self._upkeep.register()
        attempts = self._claim(1)
        for attempt in attempts:
            self._dispatcher.execute(attempt)
        return bool(attempts)

    def run(self, *, burst: bool = False) -> None:
        """Work until :meth:`stop` is called, or with ``burst`` until nothing is eligible."""
        self._check_tasks()
        self._runner.start()
        self._upkeep.fatal = None
        self._upkeep.register()
        # Heartbeats go on through the grace period, until run() is done with every job.
        self._upkeep.start()
        # Every (non-burst) worker schedules periodic tasks; the database keeps each slot
        # to one job, so there is no leader to lose.
        scheduler = None if burst else self._scheduler().start(self._stopping)
        log.info(
            "worker %s started: queues=%s concurrency=%d mode=%s tasks=%s",
            self.id,
            ",".join(self.options.queues) or "*",
            self.options.concurrency,
            self._runner.mode(),
            ",".join(self._task_names),
        )
        self._upkeep.warn_unserved()
        self._running = True
        try:
            # Returns once every running job is recorded or handed back.
            self._dispatcher.run(burst)
        finally:
            self._running = False
            if self._upkeep.fatal is not None:
                why = f"the database failed ({self._upkeep.fatal})"
            else:
                why = "asked to stop" if self._asked_to_stop else "no job is eligible (--burst)"
            try:
                self._runner.close()  # after the hand-back: their jobs are released
                self._upkeep.stop()
                self._dispatcher.join()
                if scheduler is not None:
                    scheduler.join(timeout=5)
                if self._upkeep.fatal is None:
                    self._outcomes.record_late()
                self.close()
            finally:
                # Last: every outcome recorded meanwhile (and its log line) comes before it.
                log.info(
                    "worker %s stopped: %s; %d job(s) handed back to pending",
                    self.id,
                    why,
                    self._dispatcher.handed_back,
                )
        if self._upkeep.fatal is not None:
            raise self._upkeep.fatal

    def stop(self) -> None:
        """Claim nothing more; :meth:`run` returns once running jobs finish or the grace ends.

        Not from a signal handler: it sets events, whose locks the interrupted thread may
        hold. ``flask queue work`` acts on its signals on a thread of its own
        (``cli/signalwatch.py``)."""
        self._asked_to_stop = True
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def health(self) -> Health:
        """Whether :meth:`run` is alive and claiming, from what the worker's own threads
        last saw: no database round trip, so a probe may call it as often as it likes."""
        return self._upkeep.health(running=self._running, stopping=self.stopping)

    def on_healthy(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when :meth:`run` starts and after each heartbeat that went
        through, on the heartbeat thread: a health file's touch, a watchdog's ping. It
        must be quick; what it raises is logged."""
        self._upkeep.on_healthy.append(callback)

    def close(self) -> None:
        """Mark this worker's row stopped: it is no longer alive."""
        self._dispatcher.close()
        self._upkeep.unregister()

    def rescue(self) -> list[tuple[int, str, str]]:
        """Take back the running jobs of workers that stopped heartbeating.

        A worker on this machine's boot is judged by the boot clock; one elsewhere by
        the queue's time, and only once this worker has itself seen its heartbeat
        unchanged for ``stale_after`` seconds (core/liveness.py): no wall-clock step on
        any host makes a live worker look lost.
        """
        return self._upkeep.rescue()

    def prune(self) -> retention.Pruned:
        """One retention round now: delete finished jobs (and effect keys) older than
        ``SQLQUEUE_KEEP_*``, in batches of short transactions. Workers call it from their
        heartbeat every ``SQLQUEUE_PRUNE_INTERVAL`` seconds."""
        return self._upkeep.prune()

    def run_job(self, job_id: int) -> bool:
        """Claim one specific pending job and run it now, in this thread (eager mode)."""
        return self._dispatcher.run_job(job_id)

    # -- internals ------------------------------------------------------------------------

    def _claim(self, limit: int) -> list[Attempt]:
        """One claim outside :meth:`run`'s loop (``testing.drain()`` overrides it to see
        which jobs ran)."""
        return self._dispatcher.claim_once(limit)

    def _check_tasks(self) -> None:
        if not self.registry:
            raise ConfigurationError(
                "No tasks are registered, so this worker could never run a job; "
                "import the modules that define your tasks in the app factory."
            )

    def _scheduler(self) -> periodic.Scheduler:
        return periodic.Scheduler(self.store, self.registry, clock=self.clock)

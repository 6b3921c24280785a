"""The worker's parts on their own, without an app or a database: the attempt made at a
claim, the slots' accounting, the runner's outcome values and how a failure is recorded."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
from contextlib import contextmanager
from contextlib import nullcontext
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from flask_sqlqueue import PermanentFailure
from flask_sqlqueue import Retry
from flask_sqlqueue import current_job
from flask_sqlqueue.core.hooks import Hooks
from flask_sqlqueue.core.isolation import AttemptFailed
from flask_sqlqueue.core.worker import WorkerOptions
from flask_sqlqueue.core.worker.attempt import Attempt
from flask_sqlqueue.core.worker.attempt import Expired
from flask_sqlqueue.core.worker.attempt import NotRun
from flask_sqlqueue.core.worker.attempt import Raised
from flask_sqlqueue.core.worker.attempt import Returned
from flask_sqlqueue.core.worker.attempt import Runner
from flask_sqlqueue.core.worker.outcomes import Outcomes
from flask_sqlqueue.core.worker.outcomes import failure_of
from flask_sqlqueue.core.worker.slots import Slots


def claimed(**fields: Any) -> Any:
    """A claim's row, as the dialects return it (read by attribute)."""
    row = {
        "id": 7,
        "queue": "mail",
        "task": "shop.send",
        "payload": '{"args":[1],"kwargs":{"b":2}}',
        "attempts": 2,
        "max_attempts": 5,
        "priority": 0,
        "idempotency_key": None,
        "claim_token": "t0k",
        "expires_at": None,
        "snoozes": 0,
    }
    row.update(fields)
    return SimpleNamespace(**row)


# -- the attempt ---------------------------------------------------------------------------------


def test_an_attempt_derives_its_label_and_log_fields_from_its_claim() -> None:
    attempt = Attempt(claimed())
    assert attempt.label == "job=7 task=shop.send attempt=2/5"
    assert attempt.extra == {
        "sqlqueue_job_id": 7,
        "sqlqueue_task": "shop.send",
        "sqlqueue_attempt": 2,
        "sqlqueue_idempotency_key": None,
        "sqlqueue_queue": "mail",
    }
    assert attempt.token == "t0k"
    keyed = Attempt(claimed(idempotency_key="order-9"))
    assert keyed.label == "job=7 task=shop.send attempt=2/5 key=order-9"
    assert keyed.extra["sqlqueue_idempotency_key"] == "order-9"


def test_an_attempt_is_made_from_its_claim_alone_and_never_changes() -> None:
    with pytest.raises(TypeError):
        Attempt(claimed(), "a label of its own")  # type: ignore[call-arg]
    attempt = Attempt(claimed())
    with pytest.raises(dataclasses.FrozenInstanceError):
        attempt.job = claimed(id=8)  # type: ignore[misc]
    # The label is read from the claim; nothing can set one of its own.
    with pytest.raises((AttributeError, TypeError)):
        attempt.label = "other"  # type: ignore[misc]
    assert attempt.label == "job=7 task=shop.send attempt=2/5"


def test_an_attempts_context_is_its_claim_as_the_worker_running_it_sees_it() -> None:
    store: Any = SimpleNamespace()
    ctx = Attempt(claimed(idempotency_key="k")).context(store, "host:1:abc")
    assert (ctx.id, ctx.task, ctx.queue, ctx.attempts, ctx.max_attempts) == (
        7,
        "shop.send",
        "mail",
        2,
        5,
    )
    assert (ctx.idempotency_key, ctx.claim_token, ctx.worker_id) == ("k", "t0k", "host:1:abc")
    assert ctx.store is store
    assert Attempt(claimed(snoozes=4)).context(store, "w").snoozes == 4


# -- slots -------------------------------------------------------------------------------------


def test_a_slot_is_filled_from_the_claim_until_the_attempt_is_over() -> None:
    slots = Slots()
    slots.claimed("a", [1, 2])
    assert slots.count() == 2 and slots.unfinished() == {1: "a", 2: "a"}
    assert not slots.over([1, 2])
    assert slots.start(1, "a")
    slots.finished(1, "a")
    assert slots.count() == 1 and slots.ids() == [2]
    assert slots.over([1]) and not slots.over([1, 2])


def test_a_held_success_keeps_its_slot_until_recorded_but_is_over() -> None:
    slots = Slots()
    slots.claimed("a", [1, 2])
    assert slots.start(1, "a") and slots.start(2, "a")
    slots.hold(1, "a")
    slots.finished(1, "a")  # the job thread is done; the success waits for the next claim
    assert slots.count() == 2, "a held success still fills its slot"
    assert slots.over([1]), "a claim's linger does not wait for a held success"
    assert slots.unfinished() == {2: "a"}, "the shutdown does not hand a held job back"
    slots.release([1])
    assert slots.ids() == [2]
    slots.hold(2, "a")
    slots.claimed("b", [3], recorded=[2])  # the claim's transaction recorded job 2
    assert slots.unfinished() == {3: "b"} and slots.count() == 1


def test_a_success_recorded_before_its_thread_is_done_frees_its_slot_once() -> None:
    slots = Slots()
    slots.claimed("a", [1])
    assert slots.start(1, "a")
    slots.hold(1, "a")
    slots.release([1])  # the dispatcher recorded it first
    slots.finished(1, "a")
    slots.claimed("b", [1])  # the same job claimed again, after a retry
    assert slots.start(1, "b")
    slots.finished(1, "b")
    assert slots.count() == 0 and slots.over([1])


def test_a_job_claimed_again_before_its_last_thread_is_done_still_runs() -> None:
    """A failure makes the job pending before its thread is done with it; the next
    claim may take it at once. The old attempt's end must not forget the new claim,
    or the new attempt would never start, its job left running."""
    slots = Slots()
    slots.claimed("a", [3])
    assert slots.start(3, "a")
    slots.claimed("b", [3])  # the failure is written; the job is claimed again
    slots.finished(3, "a")  # then the old attempt's thread is done
    assert slots.unfinished() == {3: "b"}
    assert slots.start(3, "b"), "the new attempt must run"
    assert slots.longest() >= 0 and slots.count() == 1
    slots.finished(3, "b")
    assert slots.count() == 0 and slots.take_back() == {}


def test_taking_back_the_waiting_jobs_stops_them_from_starting() -> None:
    slots = Slots()
    slots.claimed("a", [1, 2, 3])
    assert slots.start(1, "a")
    assert slots.take_back() == {2: "a", 3: "a"}
    assert not slots.start(2, "a") and slots.waiting() == 0 and slots.count() == 1
    slots.restore({2: "a"})  # the hand-back failed: it is this worker's again
    assert slots.start(2, "a")


# -- running an attempt ------------------------------------------------------------------------


def runner(tasks: dict[str, Any], job_context: Any = None) -> Runner:
    store: Any = SimpleNamespace(signal_sender=None, hooks=Hooks())
    return Runner(
        store,
        tasks,
        WorkerOptions(),
        job_context or contextmanager(lambda: (yield)),
        None,
        worker_id=lambda: "w",
        log_db_error=lambda what, exc: None,
    )


def task(fn: Any) -> Any:
    # Arguments as stored are the values: a task without typed parameters.
    return SimpleNamespace(
        fn=fn,
        timeout=None,
        isolate=False,
        backoff=None,
        decode=lambda *call: call,
        version=1,
        upcast=lambda _stored, *call: call,
    )


def test_the_runner_returns_what_the_task_returned_and_how_long_it_took() -> None:
    seen = []

    def send(a: int, b: int) -> int:
        seen.append(current_job.id)
        return a + b

    outcome = runner({"shop.send": task(send)}).run(Attempt(claimed()))
    assert isinstance(outcome, Returned) and outcome.value == 3 and outcome.elapsed >= 0
    assert seen == [7]
    assert not current_job, "current_job is reset once the task returned"


@pytest.mark.parametrize("error", [ValueError("no"), SystemExit(3), KeyboardInterrupt()])
def test_the_runner_returns_what_the_task_raised_even_a_system_exit(error: BaseException) -> None:
    def send(a: int, b: int) -> None:
        raise error

    the_task = task(send)
    outcome = runner({"shop.send": the_task}).run(Attempt(claimed()))
    assert isinstance(outcome, Raised)
    assert outcome.error is error and outcome.task is the_task


def test_a_job_context_that_fails_to_open_is_a_failed_attempt() -> None:
    class Broken(Exception):
        pass

    @contextmanager
    def broken() -> Any:
        raise Broken("no app")
        yield

    ran = []
    outcome = runner({"shop.send": task(lambda a, b: ran.append(1))}, broken).run(
        Attempt(claimed())
    )
    assert isinstance(outcome, Raised) and isinstance(outcome.error, Broken)
    assert ran == []


def test_a_job_that_cannot_start_is_not_run(caplog: pytest.LogCaptureFixture) -> None:
    ran = []
    tasks = {"shop.send": task(lambda *a, **k: ran.append(1))}
    caplog.set_level(logging.ERROR, logger="flask_sqlqueue.worker")
    bad = runner(tasks).run(Attempt(claimed(payload="{not json")))
    assert isinstance(bad, NotRun) and (bad.kind, bad.dead) == ("MalformedPayload", True)
    assert "job=7 task=shop.send attempt=2/5: malformed payload, job is dead" in caplog.text
    unknown = runner(tasks).run(Attempt(claimed(task="shop.gone")))
    assert unknown == NotRun("UnknownTask", "shop.gone", dead=False)
    assert ran == []


def test_a_job_whose_expiry_passed_before_its_attempt_starts_is_not_run() -> None:
    ran = []
    tasks = {"shop.send": task(lambda *a, **k: ran.append(1))}
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    running = runner(tasks)
    running._clock = lambda: now
    assert running.run(Attempt(claimed(expires_at=now))) == Expired(now)
    assert ran == []
    later = now + timedelta(microseconds=1)  # not yet expired: it runs
    assert isinstance(running.run(Attempt(claimed(expires_at=later))), Returned)
    assert ran == [1]


# -- recording ---------------------------------------------------------------------------------


def test_successes_recorded_without_a_claim_free_their_slots_and_wake_the_dispatcher(
    caplog: pytest.LogCaptureFixture,
) -> None:
    completed = {7}  # what the fenced write finds still claimed: job 8 was rescued
    told: list[int] = []  # the jobs whose waiters on this host are told they finished
    store: Any = SimpleNamespace(
        run_write=lambda fn, within: completed,
        value_size=lambda text: None,
        signal_sender=None,
        finished=told.extend,
    )
    slots, wake = Slots(), threading.Event()
    outcomes = Outcomes(
        store,
        WorkerOptions(),
        clock=lambda: datetime.now(UTC),
        rng=random.Random(7),
        job_context=nullcontext,
        slots=slots,
        wake=wake,
        worker_id=lambda: "w",
    )
    outcomes.start_batching()
    slots.claimed("t0k", [7, 8])
    caplog.set_level(logging.INFO, logger="flask_sqlqueue.worker")
    for job_id in (7, 8):
        assert slots.start(job_id, "t0k")
        outcomes.record(Attempt(claimed(id=job_id)), Returned(None, 0.25))
        slots.finished(job_id, "t0k")
    assert slots.count() == 2 and slots.unfinished() == {}, "held for the next claim"
    assert not wake.is_set() and "completed" not in caplog.text
    outcomes.flush()
    assert slots.count() == 0 and wake.is_set()
    assert "job=7 task=shop.send attempt=2/5: completed in 0.250s" in caplog.text
    assert "job=8 task=shop.send attempt=2/5: lost its claim" in caplog.text
    assert told == [7]
    assert outcomes.take_batch() == []


# -- how a failure is recorded -----------------------------------------------------------------


class _Backoff:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 42.0


class ShopError(Exception):
    pass


def test_an_ordinary_error_retries_after_the_backoff() -> None:
    backoff = _Backoff()
    try:
        raise ShopError("out of stock")
    except ShopError as exc:
        failed = failure_of(exc, backoff)
    assert (failed.kind, failed.message) == (f"{__name__}.ShopError", "out of stock")
    assert (failed.dead, failed.delay, backoff.calls) == (False, 42.0, 1)
    assert "Traceback" in failed.text and "out of stock" in failed.text
    assert failure_of(ValueError("x"), backoff).kind == "ValueError"


def test_a_permanent_failure_is_dead_and_a_retry_brings_its_own_delay() -> None:
    backoff = _Backoff()
    dead = failure_of(PermanentFailure("card declined"), backoff)
    assert (dead.dead, dead.message) == (True, "card declined")
    retry = failure_of(Retry(5, "busy"), backoff)
    assert (retry.dead, retry.delay) == (False, 5.0)
    assert backoff.calls == 0, "the backoff (and its jitter) is drawn only when used"


def test_a_failure_in_a_child_process_is_recorded_as_the_child_saw_it() -> None:
    backoff = _Backoff()
    failed = failure_of(AttemptFailed("JobTimeout", "stopped after 2s", "child traceback"), backoff)
    assert (failed.kind, failed.message, failed.text) == (
        "JobTimeout",
        "stopped after 2s",
        "child traceback",
    )
    assert (failed.dead, failed.delay) == (False, 42.0)

"""The claim of ``core/claim.py`` on a bare :class:`Store`, without Flask, on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flask_sqlqueue.core import claim as claim_module
from flask_sqlqueue.core import pausing
from flask_sqlqueue.core.claim import ClaimRequest
from flask_sqlqueue.core.claim import claim
from flask_sqlqueue.core.claim import claim_job
from flask_sqlqueue.core.models import utcnow
from flask_sqlqueue.core.options import EnqueueOptions
from flask_sqlqueue.core.payload import encode_payload
from flask_sqlqueue.core.producing import enqueue
from flask_sqlqueue.core.store import Store


def _add(store: Store, task: str = "t", **options: object) -> int:
    made = enqueue(store, task, [(encode_payload([], {}), None, None)], EnqueueOptions(**options))  # type: ignore[arg-type]
    return made[0].id


def _request(store: Store, limit: int, **fields: object) -> ClaimRequest:
    values: dict[str, object] = {"tasks": ("t",), **fields}
    return ClaimRequest("w", "token", store.now(), limit, **values)  # type: ignore[arg-type]


def _claim(store: Store, limit: int, **fields: object) -> list[int]:
    with store.write() as conn:
        return [row.id for row in claim(conn, store.ops, _request(store, limit, **fields))]


# -- the request ---------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_a_claim_request_takes_at_least_one_job(limit: object) -> None:
    with pytest.raises(ValueError, match=r"A claim takes 1 or more jobs, not limit="):
        ClaimRequest("w", "t", utcnow(), limit)  # type: ignore[arg-type]


def test_a_claim_request_holds_tuples_so_its_statements_can_be_cached() -> None:
    request = ClaimRequest("w", "t", utcnow(), 1, queues=["a"], tasks=["x", "y"])
    assert request.queues == ("a",) and request.tasks == ("x", "y")
    assert hash(request) == hash(ClaimRequest("w", "t", request.now, 1, ("a",), ("x", "y")))


def test_the_plain_claim_is_built_once_per_queues_and_tasks() -> None:
    built = claim_module._plain_candidates(("a",), ("x",))
    assert claim_module._plain_candidates(("a",), ("x",)) is built
    assert claim_module._plain_candidates(("b",), ("x",)) is not built


# -- what a claim takes ------------------------------------------------------------------------


def test_a_claim_takes_by_priority_then_id_up_to_its_limit(core_store: Store) -> None:
    low, high, low_too = _add(core_store), _add(core_store, priority=5), _add(core_store)
    assert _claim(core_store, 2) == [high, low]
    assert _claim(core_store, 5) == [low_too]
    assert _claim(core_store, 5) == []


def test_a_claim_marks_its_jobs_running_with_its_token(core_store: Store) -> None:
    job_id = _add(core_store)
    with core_store.write() as conn:
        (row,) = claim(conn, core_store.ops, _request(core_store, 1))
    assert (row.id, row.task, row.attempts, row.claim_token) == (job_id, "t", 1, "token")
    job = core_store.get_job(job_id)
    assert job is not None and (job.status, job.worker_id) == ("running", "w")


def test_a_claim_takes_only_its_queues_and_tasks_and_nothing_not_yet_due(core_store: Store) -> None:
    mail = _add(core_store, queue="mail")
    _add(core_store, queue="other")
    _add(core_store, "unknown.task", queue="mail")
    _add(core_store, queue="mail", delay=timedelta(hours=1))
    assert _claim(core_store, 5, queues=("mail",)) == [mail]
    assert _claim(core_store, 5, queues=("mail",)) == []


def test_a_claim_leaves_the_jobs_of_a_paused_queue(core_store: Store) -> None:
    paused = _add(core_store, queue="paused")
    active = _add(core_store, queue="active")
    with core_store.write() as conn:
        pausing.pause(conn, "paused", core_store.now())
    assert _claim(core_store, 5) == [active]
    with core_store.write() as conn:
        pausing.resume(conn, "paused", core_store.now())
    assert _claim(core_store, 5) == [paused]


# -- eager mode's claim of one job ---------------------------------------------------------------


def test_claim_job_takes_a_pending_job_whatever_its_due_time_once(core_store: Store) -> None:
    job_id = _add(core_store, delay=timedelta(hours=1))
    with core_store.write() as conn:
        row = claim_job(
            conn, core_store.ops, job_id, worker_id="eager", token="tok", now=core_store.now()
        )
    assert row is not None and (row.id, row.attempts, row.claim_token) == (job_id, 1, "tok")
    with core_store.write() as conn:
        again = claim_job(
            conn, core_store.ops, job_id, worker_id="eager", token="t2", now=core_store.now()
        )
        missing = claim_job(
            conn, core_store.ops, job_id + 1, worker_id="e", token="t3", now=utcnow()
        )
    assert again is None and missing is None

"""``current_job``: what a running task knows about itself, kept in a ``ContextVar``."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..exceptions import ClaimLost
from ..exceptions import NoJobContext
from .enqueue import check_key
from .lifecycle import holds_claim

if TYPE_CHECKING:
    from .store import Store


@dataclass(frozen=True, slots=True)
class JobContext:
    """The attempt a task is running in."""

    id: int
    task: str
    queue: str
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    worker_id: str
    claim_token: str
    store: Store

    def reserve_effect(self, key: str | None = None) -> bool:
        """Record ``key`` as done by this job; ``True`` only for the first caller ever.

        Guard each external side effect with it: ``if current_job.reserve_effect("mail:42"):
        send()``. The reservation is committed before this returns, and only while this
        attempt still owns the job.

        :param key: 1-255 characters; ``None`` means the job's ``idempotency_key``.
        :raises ValueError: no key was given and the job has no idempotency key.
        :raises ClaimLost: the job was taken from this attempt (for example rescued).
        """
        if key is None:
            if self.idempotency_key is None:
                raise ValueError(
                    f"Job {self.id} has no idempotency_key; pass reserve_effect(key) explicitly."
                )
            key = self.idempotency_key
        check_key(key, "effect key")
        store = self.store

        def reserve(conn: object) -> bool:
            if not holds_claim(conn, self.id, self.claim_token):  # type: ignore[arg-type]
                raise ClaimLost(self.id)
            return store.ops.insert_effect(conn, key, self.id, store.now())  # type: ignore[arg-type]

        return bool(store.run_write(reserve))


_current: ContextVar[JobContext | None] = ContextVar("sqlqueue_current_job", default=None)


def get_current() -> JobContext:
    job = _current.get()
    if job is None:
        raise NoJobContext("current_job is only available while a task runs in a worker.")
    return job


class _CurrentJob:
    """A proxy to the running job's :class:`JobContext`."""

    __slots__ = ()

    @property
    def id(self) -> int:
        return get_current().id

    @property
    def task(self) -> str:
        return get_current().task

    @property
    def queue(self) -> str:
        return get_current().queue

    @property
    def attempts(self) -> int:
        """Attempts started so far, this one included."""
        return get_current().attempts

    @property
    def max_attempts(self) -> int:
        return get_current().max_attempts

    @property
    def idempotency_key(self) -> str | None:
        return get_current().idempotency_key

    def reserve_effect(self, key: str | None = None) -> bool:
        return get_current().reserve_effect(key)

    def __bool__(self) -> bool:
        return _current.get() is not None

    def __repr__(self) -> str:
        job = _current.get()
        return "<current_job: none>" if job is None else f"<current_job {job.id} {job.task}>"


current_job = _CurrentJob()
current_job.reserve_effect.__func__.__doc__ = JobContext.reserve_effect.__doc__  # type: ignore[attr-defined]

"""The :class:`Job` users see: a plain snapshot of one row, re-read with :meth:`Job.refresh`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from typing import Any
from typing import Protocol

from .models import JobStatus
from .payload import decode_payload
from .payload import decode_value


@dataclass(eq=False)
class Job:
    """One job as it was when read. Not live: call :meth:`refresh` to see changes."""

    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    #: A :class:`JobStatus`, or the raw text if the row holds a status this version
    #: does not know (edited by hand).
    status: JobStatus | str
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    worker_id: str | None = None
    last_error: str | None = None
    result: Any = None
    idempotency_key: str | None = None
    #: One dict per failed attempt: ``attempt``, ``type``, ``message``, ``traceback``,
    #: ``worker``, ``at``.
    errors: list[dict[str, Any]] = field(default_factory=list)
    rescues: int = 0
    releases: int = 0
    #: When cancellation of the running job was asked for (it stops if its task checks).
    cancel_requested_at: datetime | None = None
    #: The task's own report: a fraction from 0 to 1, and a short message.
    progress: float | None = None
    progress_message: str | None = None
    #: Why ``args``/``kwargs`` are empty, when the stored payload could not be decoded.
    payload_error: str | None = None
    #: The batch it is a member or a callback of (docs/workflows.md), if any.
    batch_id: int | None = None
    _loader: Callable[[int], Job | None] | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: Any, loader: Callable[[int], Job | None] | None = None) -> Job:
        payload_error = None
        try:
            args, kwargs = decode_payload(row.payload)
        except ValueError as exc:
            args, kwargs, payload_error = [], {}, f"malformed payload: {exc}"
        try:
            status: JobStatus | str = JobStatus(row.status)
        except ValueError:
            status = row.status
        return cls(
            id=row.id,
            queue=row.queue,
            task=row.task,
            args=args,
            kwargs=kwargs,
            status=status,
            attempts=row.attempts,
            max_attempts=row.max_attempts,
            priority=row.priority,
            run_at=row.run_at,
            created_at=row.created_at,
            updated_at=row.updated_at,
            started_at=row.started_at,
            finished_at=row.finished_at,
            worker_id=row.worker_id,
            last_error=row.last_error,
            result=_decode_or_text(row.result),
            idempotency_key=row.idempotency_key,
            errors=_decode_or_text(row.errors) or [],
            rescues=row.rescues,
            releases=row.releases,
            # A just-inserted job (not read back) has none of these yet.
            cancel_requested_at=getattr(row, "cancel_requested_at", None),
            progress=getattr(row, "progress", None),
            progress_message=getattr(row, "progress_message", None),
            payload_error=payload_error,
            batch_id=getattr(row, "batch_id", None),
            _loader=loader,
        )

    def refresh(self) -> Job:
        """Re-read this job from the database, in place; returns ``self``.

        :raises LookupError: the job no longer exists (it was deleted or purged).
        """
        if self._loader is None:
            raise RuntimeError("This Job was not read from a queue and cannot be refreshed.")
        fresh = self._loader(self.id)
        if fresh is None:
            raise LookupError(f"Job {self.id} no longer exists.")
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        return self


def _decode_or_text(text: str | None) -> Any:
    try:
        return decode_value(text)
    except ValueError:
        return text


class ClaimedJob(Protocol):
    """A job as a claim returns it (the claim's own row, read by attribute; never
    copied): what a worker needs to run one attempt of it."""

    @property
    def id(self) -> int: ...
    @property
    def queue(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def payload(self) -> str: ...
    #: The attempt this claim started (counted at the claim).
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def idempotency_key(self) -> str | None: ...
    #: Fences every write that finishes this attempt.
    @property
    def claim_token(self) -> str: ...

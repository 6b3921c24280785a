"""The admin's request input, parsed and checked before anything is read or written:
query parameters, form fields and job ids. Bad input raises :class:`BadRequest` (a 400
page with its message), never a 500 and never a half-done change.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from flask import abort
from flask import request

from ..core import queries
from ..core.features.tags import check_tag
from ..core.models import JobStatus
from ..exceptions import InvalidTransition

if TYPE_CHECKING:
    from ..core.jobs import Job

STATUSES = [status.value for status in JobStatus]
MAX_ID = 2**63 - 1
PER_PAGE = 50
MAX_PER_PAGE = 200


class BadRequest(Exception):
    """A malformed query parameter or form field: a 400 page with this message."""


@dataclass(frozen=True, slots=True)
class Filters:
    status: str = ""
    queue: str = ""
    task: str = ""
    q: str = ""
    tag: str = ""

    @classmethod
    def parse(cls, values: Any) -> Filters:
        status = values.get("status", "").strip()
        if status and status not in STATUSES:
            raise BadRequest(f"Unknown status {status!r}; use one of {', '.join(STATUSES)}.")
        tag = values.get("tag", "").strip()
        if tag:
            try:
                check_tag(tag)
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        return cls(
            status=status,
            queue=values.get("queue", "").strip(),
            task=values.get("task", "").strip(),
            q=values.get("q", "").strip(),
            tag=tag,
        )

    def query(self, **override: str) -> queries.JobFilter:
        values = {**self.args(), **override}
        return queries.JobFilter(
            status=values.get("status") or None,
            queue=values.get("queue") or None,
            task=values.get("task") or None,
            text=values.get("q") or None,
            tag=values.get("tag") or None,
        )

    def args(self) -> dict[str, Any]:
        """The non-empty filters, as query parameters for ``url_for``."""
        return {
            k: v
            for k, v in (
                ("status", self.status),
                ("queue", self.queue),
                ("task", self.task),
                ("q", self.q),
                ("tag", self.tag),
            )
            if v
        }


@dataclass(frozen=True, slots=True)
class Bulk:
    """The job list's bulk form: the list's filters (to go back to), the chosen jobs and
    what to do to them."""

    filters: Filters
    ids: list[int]
    #: One of the actions offered, checked only when jobs were chosen (none chosen is a
    #: message on the list, not a bad request).
    action: str

    @classmethod
    def parse(cls, form: Any, actions: Collection[str]) -> Bulk:
        filters = Filters.parse(form)
        ids = job_ids(form.getlist("ids"))
        action = form.get("action", "")
        if ids and action not in actions:
            raise BadRequest(f"Unknown action {action!r}; use retry, cancel or delete.")
        return cls(filters, ids, action)


@dataclass(frozen=True, slots=True)
class Edit:
    """The job page's edit form: new arguments, queue and priority (``None``: left out)."""

    args: list[Any] | None
    kwargs: dict[str, Any] | None
    queue: str | None
    priority: int | None

    @classmethod
    def parse(cls) -> Edit:
        return cls(
            args=json_field("args", list, "array"),
            kwargs=json_field("kwargs", dict, "object"),
            queue=request.form.get("queue", "").strip() or None,
            priority=int_field("priority"),
        )

    def changes(self, job: Job) -> dict[str, Any]:
        """What differs from ``job``: only what was changed is replayed, so a job of a task
        this app does not register can still move to another queue."""
        return {
            "args": None if self.args == job.args else self.args,
            "kwargs": None if self.kwargs == job.kwargs else self.kwargs,
            "queue": self.queue,
            "priority": self.priority,
        }


@contextmanager
def refused_as_bad_request(*kinds: type[Exception]) -> Iterator[None]:
    """Turn an operation's refusal of the input (``kinds``) into a 400 with its message;
    an :class:`InvalidTransition` stays a 409 (a job not in a state for it)."""
    try:
        yield
    except kinds as exc:
        if isinstance(exc, InvalidTransition):
            raise
        raise BadRequest(str(exc)) from None


@contextmanager
def missing_as_not_found(*kinds: type[Exception]) -> Iterator[None]:
    """Turn an operation's "no such thing" (``kinds``: a schedule name no task has) into
    a 404 with its message."""
    try:
        yield
    except kinds as exc:
        abort(404, str(exc))


def _digits(text: str) -> bool:
    # str.isdigit() is also true of "²", which int() refuses.
    return text.isascii() and text.isdigit()


def int_arg(name: str, low: int, high: int) -> int | None:
    """A whole-number query parameter from ``low`` to ``high`` (``None`` if left out)."""
    raw = request.args.get(name, "").strip()
    if not raw:
        return None
    if not _digits(raw) or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, not {raw!r}.")
    return int(raw)


def choice(name: str, choices: dict[str, Any], default: str) -> str:
    """A query parameter that is one of ``choices``' keys (``default`` if left out)."""
    raw = request.args.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}, not {raw!r}.")
    return raw


def job_ids(values: Sequence[str]) -> list[int]:
    ids = []
    for raw in values:
        if not _digits(raw.strip()) or not 1 <= int(raw) <= MAX_ID:
            raise BadRequest(f"{raw!r} is not a job id.")
        ids.append(int(raw))
    return ids


def json_field(name: str, kind: type, what: str) -> Any:
    """A form field holding a JSON ``what`` (``None`` if left out)."""
    raw = request.form.get(name)
    if raw is None:
        return None
    raw = raw.strip() or ("[]" if kind is list else "{}")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"{name} is not valid JSON ({exc}); nothing was changed.") from None
    if not isinstance(value, kind):
        raise BadRequest(f"{name} must be a JSON {what}, not {raw!r}; nothing was changed.")
    return value


def int_field(name: str) -> int | None:
    raw = request.form.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {raw!r}.") from None


def well_formed() -> None:
    """Refuse a request with a NUL in any value a page or action may put in a query, checked
    once for all of them: PostgreSQL refuses NUL in text, so one would fail its statement
    with a 500. A job id past the largest is a 404 (no such job), not an overflow."""
    given = [*request.args.items(multi=True), *(request.view_args or {}).items()]
    if request.method == "POST":
        given += request.form.items(multi=True)
    for name, value in given:
        if isinstance(value, str) and "\x00" in value:
            raise BadRequest(
                f"{name} holds a NUL character (%00), which no queue, task, key or "
                "error can contain; remove it from the address or the form."
            )
    job_id = (request.view_args or {}).get("job_id")
    if isinstance(job_id, int) and job_id > MAX_ID:
        abort(404, f"There is no job {job_id}: job ids stop at {MAX_ID}.")

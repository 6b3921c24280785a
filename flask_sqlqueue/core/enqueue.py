"""Turning calls into job rows: the one path every producer takes.

:func:`enqueue` serves ``Task.enqueue``, ``.using(...).enqueue``, ``SQLQueue.enqueue`` by
name, both ``enqueue_many``, ``flask queue enqueue``, the periodic scheduler and the test
helpers. Everything is checked before anything is written, so a refusal writes nothing:
the task name, the options, each call's arguments against the task's signature (and
those of typed parameters against their annotations: core/features/arguments.py), the arguments
as JSON that round-trips, their size against what the database stores in one value, the
concurrency key, and ``run_at`` against the times every backend stores.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Protocol

from ..exceptions import PayloadError
from ..exceptions import PayloadTooLarge
from ..exceptions import UnknownTask
from . import producing
from .hooks import Enqueueing
from .jobs import Job
from .options import NO_MACHINERY
from .options import Call as Call
from .options import CallLike as CallLike
from .options import EnqueueOptions as EnqueueOptions
from .options import Machinery
from .options import check_key
from .options import check_options as check_options
from .options import check_task_name
from .options import misfit
from .payload import encode_payload
from .producing import Encoded
from .store import Store
from .tasks import Task

# Call, CallLike, EnqueueOptions and check_options are re-exported (imported "as"
# themselves): a call's vocabulary lives below the store, in options.py, and producers
# (the extension, the CLI) find it here, beside enqueue().

# -- the one path from calls to jobs ---------------------------------------------------------


class RunsJobs(Protocol):
    """What eager mode needs: a worker that runs one job now (``Worker.run_job``)."""

    def run_job(self, job_id: int) -> bool: ...


def enqueue(
    store: Store,
    task: Task[Any, Any] | str,
    calls: Iterable[CallLike],
    options: EnqueueOptions | None = None,
    *,
    registry: Mapping[str, Task[Any, Any]] | None = None,
    many: bool = False,
    unregistered: bool = False,
    encoded: bool = False,
    eager: RunsJobs | None = None,
    machinery: Machinery = NO_MACHINERY,
) -> list[Job]:
    """Check every call, then write one job per call in one transaction; committed on
    return unless ``options.session`` is given.

    :param task: a task, or a task name looked up in ``registry``. A registered task's
        defaults apply, and each call must fit its signature.
    :param calls: each a :class:`Call` or an ``(args, kwargs)`` tuple; a call's own
        idempotency key wins over ``options.idempotency_key``.
    :param many: errors name the index of the call (``calls[3]: ...``), and
        ``options.idempotency_key`` and ``options.unique`` are refused.
    :param unregistered: write a name that ``registry`` does not hold as it is, for a
        worker that registers it (no signature or concurrency key then).
    :param encoded: the arguments of typed parameters are given in their stored forms
        (``job.args``, the command line's JSON): each is decoded by its annotation to
        check it, and stored in its canonical form.
    :param eager: run each job of a registered task at once with this worker, and
        return it as it is then.
    :param machinery: what the queue itself sets on the jobs (a batch's, say).
    :returns: the jobs, in the order of ``calls``; a call whose idempotency key is held
        already (or repeats an earlier call's) gives the job that holds it, and so does
        one whose ``options.unique`` key a job holds in scope (docs/uniqueness.md).
    :raises UnknownTask: ``task`` names no task in ``registry``, without ``unregistered``.
    :raises TypeError: a call does not fit the task's signature, or a value is not JSON.
    :raises ValueError: a value would not round-trip, the arguments are larger than the
        database stores (:class:`PayloadTooLarge`), or the job would be due at a time
        the queue cannot store.
    """
    if isinstance(task, str):
        name = check_task_name(task)
        found = (registry or {}).get(name)
        if found is None and not unregistered:
            raise UnknownTask(name, known=registry or ())
    else:
        found, name = task, task.name
    options = options or EnqueueOptions()
    if found is not None:
        options = found.options.merged(options)
    if many and options.idempotency_key is not None:
        raise ValueError(
            "enqueue_many writes many jobs, and one idempotency_key cannot name them all; "
            "give each job its own with Call(args, kwargs, idempotency_key=...)."
        )
    if many and options.unique is not None:
        raise ValueError(
            "enqueue_many does not take unique= (each job could meet a different holder "
            "of its key); enqueue each call with .using(unique=...).enqueue(...)."
        )
    version = _version(found, name, options.version)
    hooks = store.hooks
    if not hooks.enqueue:
        made = _write(store, found, name, calls, options, many, encoded, version, machinery)
    else:
        meta = dict(options.meta or {})
        queue = options.queue or "default"
        enqueueing = Enqueueing(store.signal_sender, name, queue, many, dict(meta))
        with hooks.around_enqueue(enqueueing):
            if enqueueing.meta != meta:  # a hook added to it (a trace context, say)
                options = dataclasses.replace(options, meta=enqueueing.meta)
            made = _write(store, found, name, calls, options, many, encoded, version, machinery)
            enqueueing.jobs = made
    if eager is not None and found is not None:
        for job in dict.fromkeys(made):  # a key repeated in the batch is one job
            eager.run_job(job.id)
            job.refresh()
    return made


def _write(
    store: Store,
    found: Task[Any, Any] | None,
    name: str,
    calls: Iterable[CallLike],
    options: EnqueueOptions,
    many: bool,
    encoded: bool,
    version: int,
    machinery: Machinery,
) -> list[Job]:
    """Check and encode every call, then write their jobs (see :func:`enqueue`)."""
    rows = _encode_calls(store, found, calls, many, options.idempotency_key, encoded, version)
    unique = options.unique
    if unique is not None:  # one call (enqueue_many refuses unique=)
        token = unique.token(name, rows[0][0], _signature(found))
        machinery = dataclasses.replace(machinery, unique_key=token)
    return producing.enqueue(store, name, rows, options, machinery)


def encode_arguments(
    store: Store,
    task: Task[Any, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    encoded: bool = False,
) -> tuple[str, str | None]:
    """Check one call of ``task`` exactly as :func:`enqueue` checks it (the signature,
    typed arguments, JSON that round-trips, the size the database stores) without
    writing anything; for a job whose arguments are edited before it is replayed.

    :param encoded: as for :func:`enqueue`: typed arguments are given in their stored forms.
    :returns: the payload and the concurrency key the job gets.
    :raises TypeError: the call does not fit the task's signature, or a value is not JSON.
    :raises ValueError: a value would not round-trip, or the payload is too large.
    """
    payload, _key, limit = _encode_call(
        store, task, Call(args, kwargs), None, encoded, task.version
    )
    return payload, limit


def _signature(task: Task[Any, Any] | None) -> inspect.Signature | None:
    return None if task is None else task.signature


def _encode_calls(
    store: Store,
    task: Task[Any, Any] | None,
    calls: Iterable[CallLike],
    many: bool,
    default_key: str | None,
    encoded: bool = False,
    version: int = 1,
) -> list[Encoded]:
    """Check and encode every call before anything is written; the first bad call
    raises (naming its index with ``many``)."""
    if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, Iterable):
        raise TypeError(
            f"enqueue_many takes a list of calls, each Call(args, kwargs) or an "
            f"(args, kwargs) tuple; got {calls!r}."
        )
    rows = []
    for index, item in enumerate(calls):
        where = f"calls[{index}]" if many else ""
        if isinstance(item, Call):
            call = item
        elif isinstance(item, tuple) and len(item) == 2:
            call = Call(*item)
        else:
            raise TypeError(
                f"{where or 'call'} = {item!r} is not a call: pass Call(args, kwargs) or an "
                "(args, kwargs) tuple."
            )
        try:
            rows.append(_encode_call(store, task, call, default_key, encoded, version))
        except (TypeError, ValueError) as exc:
            if where:
                _name_the_call(exc, where)
            raise
    if not many and len(rows) != 1:
        raise TypeError(f"enqueue writes one job; got {len(rows)} calls.")
    return rows


def _encode_call(
    store: Store,
    task: Task[Any, Any] | None,
    call: Call,
    default_key: str | None,
    encoded: bool = False,
    version: int = 1,
) -> Encoded:
    args, kwargs, key = call.args, call.kwargs, call.idempotency_key
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"args must be a list of arguments, got {args!r}.")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict of keyword arguments, got {kwargs!r}.")
    key = default_key if key is None else check_key(key, "idempotency_key")
    codec = None if task is None else task.codec
    if codec is None:
        payload = encode_payload(args, kwargs, version)
    else:
        # The signature check and the concurrency key see the values the task will get.
        if encoded:
            args, kwargs = codec.decode(args, kwargs)
        payload = encode_payload(*codec.encode(args, kwargs), version)
    if task is None:
        limit = None
    else:
        reason = misfit(task.signature, args, kwargs)
        if reason is not None:
            raise TypeError(
                f"Task {task.name!r} does not take these arguments ({reason}); it takes "
                f"{_parameters(task.signature)}. Nothing was enqueued."
            )
        limits = task.limits
        limit = None if limits is None else limits.key_for(task.name, tuple(args), kwargs)
    size = store.value_size(payload)
    if size is not None:
        raise PayloadTooLarge(size, store.value_limit, store.ops.value_limit_source)
    return payload, key, limit


def _version(task: Task[Any, Any] | None, name: str, given: int | None) -> int:
    """The version of ``name`` a call's arguments are written for: a registered task's
    own, or ``given`` (1 if not) for a name this app does not register."""
    if given is not None and (type(given) is not int or given < 1):
        raise ValueError(f"version must be a positive int (1, 2, ...), got {given!r}.")
    if task is None:
        return 1 if given is None else given
    if given is not None and given != task.version:
        raise ValueError(
            f"Task {name!r} is version {task.version} here, and the call says version "
            f"{given}: its arguments must be version {task.version}'s; leave version out."
        )
    return task.version


def _parameters(signature: inspect.Signature | None) -> str:
    """``(a, b=2, *args)``: a signature without its annotations, which may be mere strings."""
    assert signature is not None
    bare = [p.replace(annotation=p.empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=signature.empty))


def _name_the_call(exc: BaseException, where: str) -> None:
    """Say which call of a batch ``exc`` is about: the same error, its message prefixed."""
    if isinstance(exc, PayloadError):
        exc.path = f"{where}.{exc.path}"
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{where}: {exc.args[0]}", *exc.args[1:])

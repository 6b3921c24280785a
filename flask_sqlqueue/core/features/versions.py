"""Versioned tasks: a job keeps the version of the task its arguments were written for,
and a worker brings old arguments up to the task's version with its upcasters before the
attempt runs (docs/versions.md).

``@queue.task(version=3, upcast={1: v1_to_v2, 2: v2_to_v3})``: each upcaster takes the
stored ``(args, kwargs)`` of its version, as plain JSON, and returns those of the next.
The row is never rewritten: each attempt upcasts what is stored, so a replay after a
fixed upcaster runs the fixed one.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...exceptions import ConfigurationError
from ...exceptions import NewerVersion
from ...exceptions import PayloadError
from ...exceptions import UpcastError
from ..payload import check

#: ``(args, kwargs) -> (args, kwargs)``: the arguments of one version as those of the next.
Upcaster = Callable[[list[Any], dict[str, Any]], "tuple[list[Any], dict[str, Any]]"]


def check_versions(task: str, version: object, upcast: object) -> dict[int, Upcaster]:
    """The upcasters of a task declared with ``version`` and ``upcast``, checked.

    :raises ConfigurationError: ``version`` is not a positive int, or ``upcast`` is not a
        dict of callables keyed by earlier versions.
    """
    if type(version) is not int or version < 1:
        raise ConfigurationError(
            f"Task {task!r}: version must be a positive int (1, 2, ...), got {version!r}."
        )
    if upcast is None:
        return {}
    if not isinstance(upcast, Mapping):
        raise ConfigurationError(
            f"Task {task!r}: upcast must be a dict {{old_version: function}}, got {upcast!r}."
        )
    checked: dict[int, Upcaster] = {}
    for old, fn in upcast.items():
        if type(old) is not int or not 1 <= old < version:
            raise ConfigurationError(
                f"Task {task!r} is version {version}: upcast keys are the versions before "
                f"it (1 to {version - 1}), each mapped to the function that turns its "
                f"arguments into the next version's; got key {old!r}."
            )
        if not callable(fn):
            raise ConfigurationError(
                f"Task {task!r}: upcast[{old}] must be a function "
                f"(args, kwargs) -> (args, kwargs), got {fn!r}."
            )
        checked[old] = fn
    return checked


def upcast_call(
    task: str,
    version: int,
    upcasters: Mapping[int, Upcaster],
    stored: int,
    args: list[Any],
    kwargs: dict[str, Any],
) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs``, written for version ``stored`` of the task, as version
    ``version`` of it takes them: each upcaster from ``stored`` on, in turn.

    :raises NewerVersion: ``stored`` is later than ``version``.
    :raises UpcastError: an upcaster is missing, raises, or returns something else than
        a list and a dict.
    """
    if stored > version:
        raise NewerVersion(
            f"written for version {stored} of task {task!r}, and this worker has version "
            f"{version}; it waits for a worker with version {stored} or later"
        )
    for step in range(stored, version):
        fn = upcasters.get(step)
        if fn is None:
            raise UpcastError(
                f"written for version {stored} of task {task!r}, which is version {version} "
                f"now, and no upcaster turns version {step} arguments into version "
                f"{step + 1}'s: add upcast={{{step}: ...}} to the task"
            )
        try:
            result = fn(list(args), dict(kwargs))
        except Exception as exc:
            raise UpcastError(
                f"task {task!r}: upcast[{step}] raised {type(exc).__name__}: {exc}"
            ) from exc
        if (
            not isinstance(result, tuple)
            or len(result) != 2
            or not isinstance(result[0], list)
            or not isinstance(result[1], dict)
        ):
            raise UpcastError(
                f"task {task!r}: upcast[{step}] must return (args: list, kwargs: dict), "
                f"got {result!r}"
            )
        args, kwargs = result
        try:
            check(args, "args")
            check(kwargs, "kwargs")
        except PayloadError as exc:
            raise UpcastError(f"task {task!r}: upcast[{step}] returned {exc}") from exc
    return args, kwargs


@dataclass(frozen=True, slots=True)
class Upcast:
    """What a job written for an earlier version of its task runs with now (shown
    before a replay): the arguments its upcasters give, or why they give none."""

    stored: int
    version: int
    args: list[Any]
    kwargs: dict[str, Any]
    #: Why the job cannot run as this version (``args`` and ``kwargs`` are empty then).
    error: str | None = None


def preview(
    task: str,
    version: int,
    upcasters: Mapping[int, Upcaster],
    stored: int,
    args: list[Any],
    kwargs: dict[str, Any],
) -> Upcast | None:
    """What :func:`upcast_call` makes of a job's arguments; ``None`` for arguments of
    the task's own version, which run as they are."""
    if stored == version:
        return None
    try:
        new_args, new_kwargs = upcast_call(task, version, upcasters, stored, args, kwargs)
    except (NewerVersion, UpcastError) as exc:
        return Upcast(stored, version, [], {}, str(exc))
    return Upcast(stored, version, new_args, new_kwargs)

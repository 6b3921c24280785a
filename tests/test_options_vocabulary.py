"""The enqueue and task options are declared once, as TypedDicts (core/options.py,
core/tasks.py): every public signature that takes them unpacks one, none spells an option
out beside it, and the TypedDicts match the :class:`EnqueueOptions` they fill. A place
that drifted from the vocabulary fails here; tests/type_check/check_options.py shows that
mypy catches a misspelled option at a call site."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import Any
from typing import Unpack

import pytest

from flask_sqlqueue import SQLQueue
from flask_sqlqueue.core.options import ByNameOptions
from flask_sqlqueue.core.options import CallOptions
from flask_sqlqueue.core.options import EnqueueByName
from flask_sqlqueue.core.options import EnqueueManyByName
from flask_sqlqueue.core.options import EnqueueOptions
from flask_sqlqueue.core.options import UsingOptions
from flask_sqlqueue.core.tasks import Task
from flask_sqlqueue.core.tasks import TaskOptions

DOORS: list[tuple[Callable[..., Any], Any]] = [
    (Task.using, UsingOptions),
    (SQLQueue.enqueue, EnqueueByName),
    (SQLQueue.enqueue_many, EnqueueManyByName),
    (SQLQueue.task, TaskOptions),
    *((overload, TaskOptions) for overload in typing.get_overloads(SQLQueue.task)[1:]),
    (SQLQueue.periodic, TaskOptions),
]


def _keys(vocabulary: Any) -> set[str]:
    return set(vocabulary.__annotations__)


def _annotation(vocabulary: Any, key: str) -> str:
    """A TypedDict's annotation as written (a ForwardRef under postponed evaluation)."""
    value = vocabulary.__annotations__[key]
    return str(getattr(value, "__forward_arg__", value))


@pytest.mark.parametrize(("fn", "vocabulary"), DOORS, ids=lambda d: getattr(d, "__qualname__", ""))
def test_each_door_unpacks_its_vocabulary(fn: Callable[..., Any], vocabulary: Any) -> None:
    parameters = inspect.signature(fn).parameters.values()
    (var,) = [p for p in parameters if p.kind is p.VAR_KEYWORD]
    hints = typing.get_type_hints(fn, include_extras=True)
    assert hints[var.name] == Unpack[vocabulary]
    spelled = {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
    assert not spelled & _keys(vocabulary), "an option spelled out beside the vocabulary"


def test_the_vocabulary_is_what_enqueue_options_hold() -> None:
    fields = {f.name: str(f.type) for f in dataclasses.fields(EnqueueOptions)}
    public = _keys(UsingOptions) | {"version"}
    assert set(fields) == public
    for vocabulary in (UsingOptions, EnqueueByName, EnqueueManyByName):
        for key in _keys(vocabulary) & set(fields):
            assert _annotation(vocabulary, key) == fields[key], key
    assert _keys(EnqueueByName) == _keys(UsingOptions) | _keys(ByNameOptions)
    assert _keys(EnqueueManyByName) == _keys(CallOptions) | _keys(ByNameOptions)
    # Many jobs cannot share one key: each Call carries its own.
    assert not {"idempotency_key", "unique"} & _keys(EnqueueManyByName)


def test_the_machinery_has_no_public_door() -> None:
    machinery = {"concurrency_key", "require", "batch_id", "unique_key"}
    assert not machinery & {f.name for f in dataclasses.fields(EnqueueOptions)}
    for _fn, vocabulary in DOORS:
        assert not (machinery - {"concurrency_key"}) & _keys(vocabulary)


def test_every_task_option_is_documented_at_task() -> None:
    doc = inspect.getdoc(SQLQueue.task) or ""
    names = {part.split(":", 1)[0] for part in doc.split(":param ")[1:]}
    assert _keys(TaskOptions) | {"name"} == names


def test_an_unknown_option_is_refused_at_every_door() -> None:
    queue = SQLQueue()

    @queue.task
    def add(a: int, b: int) -> int:
        return a + b

    refusals: list[tuple[Callable[[], object], str]] = [
        (lambda: add.using(queu="x"), "Task.using"),
        (lambda: queue.enqueue("add", [1, 2], queu="x"), "QueueExtension.enqueue"),
        (lambda: queue.enqueue_many("add", [], idempotency_key="k"), "enqueue_many"),
        (lambda: queue.enqueue_many("add", [], unique=None), "enqueue_many"),
        (lambda: queue.task(retries=3), "QueueExtension.task"),
        (lambda: queue.periodic("* * * * *", retries=3)(lambda: None), "QueueExtension.task"),
    ]
    for call, where in refusals:
        with pytest.raises(TypeError, match=rf"{where}\(\) got an unexpected keyword argument"):
            call()

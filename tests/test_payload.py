"""Job arguments are plain JSON: refused values name their path and write nothing.

The app fixtures are conftest's ``sq_app`` and ``ctx``.
"""

from __future__ import annotations

import math
from datetime import UTC
from datetime import datetime
from decimal import Decimal
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import PayloadError
from tests import sample_app
from tests.conftest import query


def _count_jobs(database_uri: str) -> int:
    """Rows in the jobs table, read on a fresh connection of its own."""
    ((count,),) = query(database_uri, "SELECT count(*) FROM sqlqueue_jobs")
    return int(count)


class _Colour(IntEnum):
    RED = 1


class _Thing:
    def __repr__(self) -> str:
        return "<Thing>"


def _cycle() -> list[Any]:
    looped: list[Any] = [1]
    looped.append(looped)
    return looped


# (args, kwargs, the path the message must name, the bad value's repr in the message)
REFUSED: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("nan", (1, float("nan")), {}, "args[1] = nan"),
    ("inf", (), {"limit": float("inf")}, "kwargs['limit'] = inf"),
    ("-inf nested", ([1.5, {"x": -math.inf}],), {}, "args[0][1]['x'] = -inf"),
    ("nul in string", ("ok", "a\x00b"), {}, "args[1] = 'a\\x00b'"),
    ("nul in nested string", ([["fine", "bad\x00"]],), {}, "args[0][0][1]"),
    ("nul in dict key", ({"k\x00ey": 1},), {}, "args[0] key = 'k\\x00ey'"),
    ("nul in kwargs value", (), {"name": "\x00"}, "kwargs['name']"),
    ("tuple nested", ([1, (2, 3)],), {}, "args[0][1] = (2, 3)"),
    ("tuple in kwargs", (), {"point": (1, 2)}, "kwargs['point'] = (1, 2)"),
    ("set", ({1, 2},), {}, "args[0] = {1, 2}"),
    ("frozenset in dict", ({"tags": frozenset({"a"})},), {}, "args[0]['tags']"),
    ("bytes", (b"raw",), {}, "args[0] = b'raw'"),
    ("bytearray", (), {"blob": bytearray(b"x")}, "kwargs['blob']"),
    ("datetime", (), {"when": datetime(2026, 1, 1, tzinfo=UTC)}, "kwargs['when'] = datetime"),
    ("object", (1, 2, _Thing()), {}, "args[2] = <Thing>"),
    ("decimal", (Decimal("1.10"),), {}, "args[0] = Decimal('1.10')"),
    ("int enum", (_Colour.RED,), {}, "args[0] = <_Colour.RED: 1>"),
    ("str subclass", (), {"path": Path("/tmp")}, "kwargs['path']"),
    ("int dict key", ({1: "one"},), {}, "args[0] key = 1"),
    ("none dict key", ([{None: 1}],), {}, "args[0][0] key = None"),
    ("tuple dict key", ({(1, 2): "pair"},), {}, "args[0] key = (1, 2)"),
    ("lone surrogate", ("\ud800",), {}, "args[0] = '\\ud800'"),
    ("lone surrogate in key", ({"\udfff": 1},), {}, "args[0] key = '\\udfff'"),
    ("lone surrogate in kwargs", (), {"text": "ok \udc80"}, "kwargs['text']"),
    ("circular list", (_cycle(),), {}, "args[0][1] = [1, [...]]"),
]


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_refused_value_names_its_path_and_writes_nothing(
    ctx: Flask, database_uri: str, args: tuple[Any, ...], kwargs: dict[str, Any], named: str
) -> None:
    sample_app.echo.enqueue("a job that is fine")
    assert _count_jobs(database_uri) == 1

    with pytest.raises((TypeError, ValueError)) as info:
        sample_app.echo.enqueue(*args, **kwargs)

    assert isinstance(info.value, PayloadError)
    assert named in str(info.value)
    assert _count_jobs(database_uri) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (float("nan"), ValueError),
        ("\x00", ValueError),
        ("\ud800", ValueError),
        ((1,), TypeError),
        ({1}, TypeError),
        (b"", TypeError),
    ],
    ids=["nan", "nul", "surrogate", "tuple", "set", "bytes"],
)
def test_refusal_is_the_builtin_the_contract_names(
    ctx: Flask, database_uri: str, value: object, expected: type[Exception]
) -> None:
    with pytest.raises(expected, match=r"args\[0\]"):
        sample_app.echo.enqueue(value)
    assert _count_jobs(database_uri) == 0


def test_refusal_by_name_writes_nothing(ctx: Flask, queue: Any, database_uri: str) -> None:
    with pytest.raises(TypeError, match=r"kwargs key = 1"):
        queue.enqueue("echo", kwargs={1: "x"})
    with pytest.raises(ValueError, match=r"args\[2\]\['deep'\]\[0\] = nan"):
        queue.enqueue("echo", args=[1, 2, {"deep": [float("nan")]}])
    with pytest.raises(TypeError, match=r"args\[0\] = datetime"):
        queue.enqueue("not.registered", args=[datetime.now(UTC)])
    assert _count_jobs(database_uri) == 0


def test_refused_with_a_session_writes_nothing_in_that_transaction(
    sq_app: Flask, database_uri: str
) -> None:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    engine = sa.create_engine(database_uri)
    try:
        with sq_app.app_context(), Session(engine) as session:
            sample_app.echo.using(session=session).enqueue("kept")
            with pytest.raises(TypeError, match=r"kwargs\['at'\]"):
                sample_app.echo.using(session=session).enqueue(at=object())
            session.commit()
        assert _count_jobs(database_uri) == 1
    finally:
        engine.dispose()


PLAIN: list[tuple[str, list[Any], dict[str, Any]]] = [
    ("empty", [], {}),
    ("scalars", [0, -1, True, False, None, "", "text"], {"flag": False, "nothing": None}),
    ("floats", [0.1, -0.0, 1e308, 5e-324, -2.5, 1.0], {"third": 1 / 3}),
    ("big ints", [2**63, -(2**63) - 1, 10**40, 2**53 + 1], {"huge": 7**77}),
    (
        "unicode",
        ["é", "日本語", "🎉", "\u2028\u2029", 'quote " and \\ backslash', "\t\n\r"],
        {"ключ": "значение", "emoji 🎉": "\U0010ffff"},
    ),
    (
        "nested",
        [[1, [2, [3, [4, []]]]], {"a": {"b": {"c": [{}, [], None]}}}],
        {"rows": [{"id": 1, "tags": ["x", "y"]}, {"id": 2, "tags": []}]},
    ),
    ("ordered keys", [{"z": 1, "a": 2, "m": 3}], {"zeta": 1, "alpha": 2}),
]


@pytest.mark.parametrize(
    ("args", "kwargs"), [case[1:] for case in PLAIN], ids=[case[0] for case in PLAIN]
)
def test_plain_json_round_trips_unchanged(
    ctx: Flask, queue: Any, args: list[Any], kwargs: dict[str, Any]
) -> None:
    job = sample_app.echo.enqueue(*args, **kwargs)
    stored = queue.get_job(job.id)

    assert stored is not None
    _assert_same(stored.args, args)
    _assert_same(stored.kwargs, kwargs)
    assert list(stored.kwargs) == list(kwargs)  # key order survives too


def test_negative_zero_keeps_its_sign(ctx: Flask, queue: Any) -> None:
    job = sample_app.echo.enqueue(-0.0, [0.0])
    stored = queue.get_job(job.id)
    assert stored is not None
    assert math.copysign(1.0, stored.args[0]) == -1.0
    assert math.copysign(1.0, stored.args[1][0]) == 1.0


def test_shared_but_not_circular_values_are_accepted(ctx: Flask, queue: Any) -> None:
    shared = [1, 2]
    job = sample_app.echo.enqueue([shared, shared], {"a": shared, "b": shared})
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.args == [[[1, 2], [1, 2]], {"a": [1, 2], "b": [1, 2]}]


def test_payload_is_stored_as_json_text(ctx: Flask, database_uri: str) -> None:
    job = sample_app.echo.enqueue("é", 1, key=[True, None])
    ((payload,),) = query(
        database_uri, "SELECT payload FROM sqlqueue_jobs WHERE id = :id", id=job.id
    )
    assert payload == '{"args":["é",1],"kwargs":{"key":[true,null]}}'


def _assert_same(got: Any, want: Any) -> None:
    """Equal, and of the same types all the way down (so True never comes back as 1)."""
    assert type(got) is type(want), (got, want)
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            _assert_same(got[key], want[key])
    elif isinstance(want, float):
        assert got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    else:
        assert got == want


def test_deep_nesting_is_refused_with_a_clear_error(sq_app: Any) -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(200):
        inner.append([])
        inner = inner[0]
    with sq_app.app_context():
        with pytest.raises(ValueError, match="nested more than 100 levels"):
            sample_app.echo.enqueue(deep)

"""Job arguments are plain JSON: refused values name their path and write nothing.

The app fixtures are conftest's ``sq_app`` and ``ctx``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from datetime import UTC
from datetime import datetime
from decimal import Decimal
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import PayloadError
from flask_sqlqueue import PayloadTooLarge
from flask_sqlqueue.core.payload import encode_payload
from flask_sqlqueue.exceptions import PayloadValueError
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


def _nested(depth: int, kind: type = list) -> Any:
    """A list (or a dict under key "k") nested ``depth`` levels deep, built without recursion."""
    inner: Any = [] if kind is list else {}
    for _ in range(depth - 1):
        inner = [inner] if kind is list else {"k": inner}
    return inner


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
    ("huge int", (1, 10**5000), {}, "args[1] = <an int of 16,610 bits> has more than 4300 digits"),
    ("huge int nested", (), {"n": [-(10**4300)]}, "kwargs['n'][0] = <an int of 14,285 bits>"),
    ("lone surrogate in a kwargs key", (), {"\ud800": 1}, "kwargs key = '\\ud800'"),
    ("nul in a kwargs key", (), {"a\x00": 1}, "kwargs key = 'a\\x00'"),
    ("deep lists", (_nested(200),), {}, "nested more than 100 levels deep (the limit)"),
    ("deep dicts", ({"top": _nested(200, dict)},), {}, "args[0]['top']['k']['k']"),
    ("far too deep to show", (_nested(50_000),), {}, "[0][0] = <list object> is nested more"),
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
        queue.enqueue("not.registered", args=[datetime.now(UTC)], unregistered=True)
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
    ("the longest ints", [10**4299, -(10**4299)], {"n": [int("9" * 4300)]}),
    ("nested to the limit", [_nested(99)], {"d": _nested(99, dict)}),
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


def test_an_int_too_long_for_this_process_is_refused_too(ctx: Flask, database_uri: str) -> None:
    # A process may lower Python's limit on int digits; its own encoder must not fail then.
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with pytest.raises(ValueError, match=r"args\[0\] = .* has more than 640 digits"):
            sample_app.echo.enqueue(10**700)
    finally:
        sys.set_int_max_str_digits(before)
    assert _count_jobs(database_uri) == 0


# -- the size the database stores ---------------------------------------------------------------

_MARIADB_ESCAPED = "\\'\"\x00\n\r\x1a"


def _counted(payload: str, backend: str) -> int:
    """The bytes a payload takes as the database counts them, worked out apart from the
    queue's own code: its UTF-8, and on MariaDB a backslash more per escaped character
    (PyMySQL writes values into the statement's text)."""
    size = len(payload.encode("utf-8"))
    if backend == "mysql":
        size += sum(payload.count(char) for char in _MARIADB_ESCAPED)
    return size


@pytest.fixture
def value_limit(ctx: Flask, queue: Any, database_uri: str, backend: str) -> Iterator[int]:
    """The most bytes one value may take: MariaDB's own (its 16 MiB packet, less 64 KiB
    for the statement); lowered elsewhere, since SQLite's and PostgreSQL's 1 GB would be
    too much to allocate in a test."""
    store = queue.state().store
    queue.state().ensure_schema()  # reads the server's limit, once
    if backend == "mysql":
        ((packet,),) = query(database_uri, "SELECT @@max_allowed_packet")
        assert store.value_limit == int(packet) - 64 * 1024
    else:
        store.value_limit = 100_000
    yield store.value_limit


def test_arguments_larger_than_the_database_stores_are_refused(
    ctx: Flask, queue: Any, database_uri: str, backend: str, value_limit: int
) -> None:
    overhead = _counted(encode_payload(["x"], {}), backend) - 1
    fits = "x" * (value_limit - overhead)
    assert _counted(encode_payload([fits], {}), backend) == value_limit
    job = sample_app.echo.enqueue(fits)  # the largest there is: stored, and read back whole
    stored = queue.get_job(job.id)
    assert stored is not None and stored.args == [fits]

    too_big = fits + "x"
    refusals = [
        lambda: sample_app.echo.enqueue(too_big),
        lambda: queue.enqueue("echo", args=[too_big]),
        lambda: queue.enqueue("elsewhere.task", args=[too_big], unregistered=True),
    ]
    for enqueue in refusals:
        with pytest.raises(PayloadTooLarge) as info:
            enqueue()
        assert isinstance(info.value, PayloadValueError)  # a ValueError, as the contract says
        assert f"take {value_limit + 1:,} bytes as JSON, over the {value_limit:,} bytes" in (
            str(info.value)
        )
    with pytest.raises(PayloadTooLarge, match=r"^calls\[1\]: The job's arguments take"):
        sample_app.echo.enqueue_many([(["small"], {}), ([too_big], {})])
    assert _count_jobs(database_uri) == 1


def test_the_size_is_counted_as_the_database_counts_it(
    ctx: Flask, queue: Any, database_uri: str, backend: str, value_limit: int
) -> None:
    # JSON writes a quote as two characters; MariaDB's statement escapes both again.
    quotes = '"' * (value_limit // 3)
    payload = encode_payload([quotes], {})
    assert len(payload.encode()) < value_limit
    if backend == "mysql":
        assert _counted(payload, backend) > value_limit
        with pytest.raises(PayloadTooLarge, match="MariaDB"):
            sample_app.echo.enqueue(quotes)
        assert _count_jobs(database_uri) == 0
    else:
        job = sample_app.echo.enqueue(quotes)
        stored = queue.get_job(job.id)
        assert stored is not None and stored.args == [quotes]

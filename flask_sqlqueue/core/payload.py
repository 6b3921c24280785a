"""JSON encoding of job payloads and results that refuses anything that would not round-trip.

Payloads are never pickled: a row can only ever hold plain JSON, so reading a job can
never run code. Values are checked before anything is written, so a refusal writes nothing.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import cast

from ..exceptions import PayloadError
from ..exceptions import PayloadValueError

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_loads = json.loads

#: Lists and dicts may be nested this deep.
MAX_DEPTH = 100
#: The most digits an int may have: Python's default limit for reading one from text
#: (``sys.get_int_max_str_digits``), which a worker started with defaults applies.
MAX_INT_DIGITS = 4300
# Ints this small have fewer than 640 digits, which Python converts whatever its limit.
_SMALL_INT_BITS = 2100
#: What the row of a job holds when its payload is kept outside it, in
#: ``sqlqueue_payloads`` (core/features/bigpayloads.py). No payload is ever this text, and its
#: ``args`` are no list: read in place of the real one, it is refused as malformed,
#: never taken for a call without arguments.
OUTSIDE = '{"args":null,"kwargs":null,"outside":"sqlqueue_payloads"}'


def check(value: object, path: str, _parents: frozenset[int] = frozenset()) -> None:
    """Raise :class:`PayloadError` naming the first value below ``path`` that is not plain JSON."""
    kind = type(value)
    if value is None or kind is bool:
        return
    if kind is int:
        if value.bit_length() > _SMALL_INT_BITS:  # type: ignore[attr-defined]
            _check_int(value, path)  # type: ignore[arg-type]
        return
    if (kind is list or kind is dict) and len(_parents) >= MAX_DEPTH:
        # MariaDB's JSON functions stop at depth 100; deeper would also exhaust the stack.
        raise PayloadValueError(
            path, value, f"is nested more than {MAX_DEPTH} levels deep (the limit)"
        )
    if (kind is list or kind is dict) and id(value) in _parents:
        # Without this a list that contains itself recurses until RecursionError.
        raise PayloadValueError(path, value, "contains itself (a circular reference)")
    if kind is str:
        _check_str(value, path)  # type: ignore[arg-type]
    elif kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise PayloadValueError(path, value, "is not a finite number (JSON has no NaN)")
    elif kind is list:
        parents = _parents | {id(value)}
        for i, item in enumerate(cast("list[Any]", value)):
            check(item, f"{path}[{i}]", parents)
    elif kind is dict:
        parents = _parents | {id(value)}
        for key, item in cast("dict[Any, Any]", value).items():
            if type(key) is not str:
                raise PayloadError(f"{path} key", key, "is not a string (JSON keys are strings)")
            _check_str(key, f"{path} key")
            check(item, f"{path}[{key!r}]", parents)
    elif kind is tuple:
        raise PayloadError(path, value, "is a tuple, which JSON returns as a list; pass a list")
    else:
        raise PayloadError(path, value, f"is a {kind.__name__}, not JSON-serialisable")


def _int_digits_limit() -> int:
    here = sys.get_int_max_str_digits()  # 0: no limit in this process
    return MAX_INT_DIGITS if here == 0 else min(here, MAX_INT_DIGITS)


def _check_int(value: int, path: str) -> None:
    limit = _int_digits_limit()
    if abs(value) >= 10**limit:
        raise PayloadValueError(
            path,
            value,
            f"has more than {limit} digits, the most Python reads back from JSON; "
            "pass it as a string",
        )


def is_unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode: no lone surrogate (what ``surrogateescape``
    makes of a command line's undecodable bytes), so that every database stores it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_str(value: str, path: str) -> None:
    if "\x00" in value:
        raise PayloadValueError(path, value, "contains a NUL character, which databases refuse")
    if not is_unicode(value):
        raise PayloadValueError(path, value, "is not valid Unicode text")


def encode_payload(args: Sequence[Any], kwargs: Mapping[str, Any], version: int = 1) -> str:
    """Check and encode a call's arguments as one JSON document; ``version`` is the
    version of the task they were written for (docs/versions.md), stored only when it
    is not 1, so the payload of an unversioned task is what it always was."""
    args = list(args)
    kwargs = dict(kwargs)
    for i, item in enumerate(args):
        check(item, f"args[{i}]")
    for key, item in kwargs.items():
        if type(key) is not str:
            raise PayloadError("kwargs key", key, "is not a string")
        _check_str(key, "kwargs key")
        check(item, f"kwargs[{key!r}]")
    if version == 1:
        return _dumps({"args": args, "kwargs": kwargs})
    return _dumps({"args": args, "kwargs": kwargs, "v": version})


def decode_payload(text: str) -> tuple[list[Any], dict[str, Any]]:
    """Decode a stored payload; raises ``ValueError`` for a row that was edited into nonsense."""
    args, kwargs, _version = decode_call(text)
    return args, kwargs


def decode_call(text: str) -> tuple[list[Any], dict[str, Any], int]:
    """A stored payload's arguments and the version of the task they were written for
    (1 when it names none: every payload written before tasks had versions)."""
    if text == OUTSIDE:
        raise ValueError("the payload is kept in sqlqueue_payloads and was not found there")
    data = _loads(text)
    if not isinstance(data, dict):
        raise ValueError("payload is not a JSON object")
    args = data.get("args", [])
    kwargs = data.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("payload args must be a JSON array and kwargs a JSON object")
    version = data.get("v", 1)
    if type(version) is not int or version < 1:
        raise ValueError(f"payload version {version!r} is not a positive integer")
    return args, kwargs, version


def encode_value(value: object, path: str = "result") -> str:
    """Check and encode one value (a result, an error record)."""
    check(value, path)
    return _dumps(value)


def dumps_trusted(value: object) -> str:
    """Encode a value built by the queue itself (error records): no checks needed."""
    return _dumps(value)


def decode_value(text: str | None) -> Any:
    return None if text is None else _loads(text)

"""Typed task arguments: values JSON has no type for, stored and restored by the task's
annotations (docs/arguments.md).

A parameter annotated ``datetime``, ``date``, ``time``, ``UUID``, ``Decimal``, an ``Enum``
or a dataclass, or ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]`` or ``X | None`` of
them, has its argument encoded at enqueue into a plain JSON value (ISO 8601 text; the
UUID's and the Decimal's text; the member's value; an object of the dataclass's fields)
and decoded in the worker before the task runs. The row only ever holds JSON: decoding
calls nothing but the constructors of the types the task's own annotations name.

A task gets its :class:`ArgumentCodec` once, when it is declared, and only if one of its
parameters has such an annotation; every other parameter, and every task without one,
goes through exactly as before (plain JSON, checked by :mod:`.payload`). Annotations
are read with :func:`typing.get_type_hints`, so ``from __future__ import annotations``
works; a name that cannot be resolved yet (a dataclass declared below the task, say) is
tried once more at the first enqueue or run, and is plain JSON if it still cannot.

Refusals name the argument, its place and its parameter: at enqueue an
:class:`~flask_sqlqueue.exceptions.ArgumentTypeError` (a ``TypeError``), for a stored value
that does not decode an :class:`~flask_sqlqueue.exceptions.ArgumentDecodeError` (also a
``ValueError``).
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import sys
import types
import typing
import uuid
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from datetime import date
from datetime import datetime
from datetime import time
from decimal import Decimal
from decimal import InvalidOperation
from typing import Any
from typing import NamedTuple

from ...exceptions import ArgumentDecodeError
from ...exceptions import ArgumentTypeError
from ...exceptions import PayloadError
from ..payload import MAX_DEPTH
from ..payload import check

__all__ = ["ArgumentCodec", "codec_for"]


class _Mismatch(Exception):
    """A value that does not fit its converter; the containers it bubbles through add
    their step (``"[%r]"`` and a key, ``".%s"`` and a field...) to ``where``, innermost
    first, formatted only if the message is made."""

    def __init__(self, value: object, expects: str, text: str, fix: str | None = None) -> None:
        self.value = value
        self.expects = expects
        #: Encoding: what is wrong with the value ("is a str, not a datetime"); decoding:
        #: why it does not decode.
        self.text = text
        #: What to do, where passing another value would not help.
        self.fix = fix
        self.where: list[tuple[str, object]] = []


def _a(name: str) -> str:
    return f"an {name}" if name[:1] in tuple("aeioAEIO") else f"a {name}"


def _wrong_type(value: object, expects: str) -> _Mismatch:
    kind = "None" if value is None else _a(type(value).__qualname__)
    return _Mismatch(value, expects, f"is {kind}, not {expects}")


_JSON_KINDS = {str: "a string", int: "a number", float: "a number", bool: "true or false"}


def _not_stored(value: object, expects: str, stored: str) -> _Mismatch:
    if value is None:
        kind = "null"
    elif isinstance(value, list):
        kind = "an array"
    elif isinstance(value, dict):
        kind = "an object"
    else:
        kind = _JSON_KINDS.get(type(value), _a(type(value).__qualname__))
    return _Mismatch(value, expects, f"it is {kind}, and {expects} is stored as {stored}")


def _step(
    convert: Callable[[Any, int], Any], value: Any, depth: int, step: str, key: object
) -> Any:
    """``convert`` one level down, at ``step % key`` below the value being converted."""
    try:
        return convert(value, depth + 1)
    except _Mismatch as exc:
        exc.where.append((step, key))
        raise


def _too_deep(value: object, expects: str) -> _Mismatch:
    return _Mismatch(
        value,
        expects,
        f"is nested more than {MAX_DEPTH} levels deep (the limit)",
        "pass a value nested less deeply, and one that does not contain itself",
    )


# -- converters: one per annotation, built once ----------------------------------------------


class _Converter:
    """Turns one annotated value into plain JSON and back; raises :class:`_Mismatch`."""

    #: What a value must be, as a message says it ("a datetime").
    expects = ""

    def encode(self, value: Any, depth: int) -> Any:
        raise NotImplementedError

    def decode(self, value: Any, depth: int) -> Any:
        raise NotImplementedError


class _Text(_Converter):
    """A value stored as text: ``datetime``, ``date``, ``time``, ``UUID``, ``Decimal``."""

    def __init__(
        self,
        expects: str,
        stored: str,
        fits: Callable[[Any], bool],
        to_text: Callable[[Any], str],
        from_text: Callable[[str], Any],
    ) -> None:
        self.expects = expects
        self._stored = stored
        self._fits = fits
        self._to_text = to_text
        self._from_text = from_text

    def encode(self, value: Any, depth: int) -> Any:
        if not self._fits(value):
            raise _wrong_type(value, self.expects)
        return self._to_text(value)

    def decode(self, value: Any, depth: int) -> Any:
        if type(value) is not str:
            raise _not_stored(value, self.expects, self._stored)
        try:
            return self._from_text(value)
        except ValueError as exc:
            raise _Mismatch(value, self.expects, str(exc)) from None


def _decimal(text: str) -> Decimal:
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise ValueError("it is not a decimal number") from None
    if not number.is_finite():
        raise ValueError("it is not a finite number")
    return number


_ISO = "ISO 8601 text"
_TEXTS: dict[object, _Text] = {
    datetime: _Text(
        "a datetime",
        _ISO,
        lambda v: isinstance(v, datetime),
        datetime.isoformat,
        datetime.fromisoformat,
    ),
    date: _Text(
        "a date",
        _ISO,
        lambda v: isinstance(v, date) and not isinstance(v, datetime),
        date.isoformat,
        date.fromisoformat,
    ),
    time: _Text("a time", _ISO, lambda v: isinstance(v, time), time.isoformat, time.fromisoformat),
    uuid.UUID: _Text("a UUID", "its text", lambda v: isinstance(v, uuid.UUID), str, uuid.UUID),
    Decimal: _Text(
        "a finite Decimal",
        'its text, like "12.50"',
        lambda v: isinstance(v, Decimal) and v.is_finite(),
        str,
        _decimal,
    ),
}


class _Member(_Converter):
    """An ``Enum`` member, stored as its value."""

    def __init__(self, cls: type[enum.Enum]) -> None:
        self._cls = cls
        members = list(cls)
        example = f" such as {cls.__qualname__}.{members[0].name}" if members else ""
        self.expects = f"{_a(cls.__qualname__)} member{example}"
        #: Why its members cannot be stored, if a value is not plain JSON.
        self._unstorable: str | None = None
        for member in members:
            try:
                check(member.value, "value")
            except PayloadError:
                self._unstorable = (
                    f"cannot be stored: {cls.__qualname__}.{member.name} has the value "
                    f"{member.value!r}, which is not plain JSON"
                )
                break

    def encode(self, value: Any, depth: int) -> Any:
        if not isinstance(value, self._cls):
            raise _wrong_type(value, self.expects)
        if self._unstorable is not None:
            fix = f"give {self._cls.__qualname__} plain JSON values (str, int...)"
            raise _Mismatch(value, self.expects, self._unstorable, fix)
        return value.value

    def decode(self, value: Any, depth: int) -> Any:
        try:
            return self._cls(value)
        except (ValueError, TypeError):
            known = [member.value for member in self._cls][:6]
            raise _Mismatch(
                value,
                self.expects,
                f"no {self._cls.__qualname__} member has this value (they have {known!r})",
            ) from None


class _Fields(_Converter):
    """A dataclass, stored as an object of its ``__init__`` fields, each by its own
    annotation. Only that exact class: a subclass could hold fields it would lose."""

    def __init__(self, cls: type[Any]) -> None:
        self._cls = cls
        self.expects = _a(cls.__qualname__)
        #: ``(name, converter or None for plain JSON, required)``; set by :func:`_compile`
        #: once the converter is known, so a dataclass can hold itself.
        self.fields: tuple[tuple[str, _Converter | None, bool], ...] = ()
        self._names: frozenset[str] = frozenset()
        #: Why it cannot be stored and what to do, if its ``__init__`` needs more than
        #: its fields (an ``InitVar`` without a default, say).
        self.unstorable: tuple[str, str] | None = None

    def set_fields(self, fields: Sequence[tuple[str, _Converter | None, bool]]) -> None:
        self.fields = tuple(fields)
        self._names = frozenset(name for name, _, _ in fields)

    def encode(self, value: Any, depth: int) -> Any:
        if type(value) is not self._cls:
            raise _wrong_type(value, self.expects)
        if self.unstorable is not None:
            raise _Mismatch(value, self.expects, *self.unstorable)
        if depth > MAX_DEPTH:
            raise _too_deep(value, self.expects)
        out = {}
        for name, converter, _ in self.fields:
            item = getattr(value, name)
            if converter is not None:
                item = _step(converter.encode, item, depth, ".%s", name)
            out[name] = item
        return out

    def decode(self, value: Any, depth: int) -> Any:
        if type(value) is not dict:
            raise _not_stored(value, self.expects, "an object of its fields")
        if depth > MAX_DEPTH:
            raise _too_deep(value, self.expects)
        extra = sorted(str(key) for key in value.keys() - self._names)
        if extra:
            raise _Mismatch(value, self.expects, f"it has no field {extra[0]!r}")
        fields = {}
        for name, converter, required in self.fields:
            if name not in value:
                if required:
                    raise _Mismatch(value, self.expects, f"its field {name!r} is missing")
                continue
            item = value[name]
            if converter is not None:
                item = _step(converter.decode, item, depth, ".%s", name)
            fields[name] = item
        try:
            return self._cls(**fields)
        except Exception as exc:  # its __post_init__ refusing the values, say
            raise _Mismatch(
                value, self.expects, f"{self._cls.__qualname__}(...) raised {exc!r}"
            ) from None


class _List(_Converter):
    """``list[X]``, stored as an array."""

    expects = "a list"

    def __init__(self, item: _Converter) -> None:
        self._item = item

    def encode(self, value: Any, depth: int) -> Any:
        if type(value) is not list:
            raise _wrong_type(value, self.expects)
        return _each(self._item.encode, value, depth, self.expects)

    def decode(self, value: Any, depth: int) -> Any:
        if type(value) is not list:
            raise _not_stored(value, self.expects, "an array")
        return _each(self._item.decode, value, depth, self.expects)


class _Tuple(_Converter):
    """``tuple[X, ...]`` or ``tuple[X, Y]``, stored as an array; decoded as a tuple."""

    expects = "a tuple"

    def __init__(self, items: Sequence[_Converter | None] | None, rest: _Converter | None) -> None:
        #: One converter (or ``None``: plain JSON) per place; ``None`` for ``tuple[X, ...]``.
        self._items = None if items is None else tuple(items)
        self._rest = rest
        if items is not None:
            self.expects = f"a tuple of {len(items)}"

    def _convert(self, value: Any, depth: int, encoding: bool) -> list[Any]:
        if depth > MAX_DEPTH:
            raise _too_deep(value, self.expects)
        items = self._items
        if items is None:
            assert self._rest is not None
            convert = self._rest.encode if encoding else self._rest.decode
            return _each(convert, value, depth, self.expects)
        if len(value) != len(items):
            raise _Mismatch(value, self.expects, f"it has {len(value)} items, not {len(items)}")
        out = list(value)
        for index, converter in enumerate(items):
            if converter is not None:
                convert = converter.encode if encoding else converter.decode
                out[index] = _step(convert, out[index], depth, "[%d]", index)
        return out

    def encode(self, value: Any, depth: int) -> Any:
        if not isinstance(value, tuple):
            raise _wrong_type(value, self.expects)
        return self._convert(value, depth, encoding=True)

    def decode(self, value: Any, depth: int) -> Any:
        if type(value) is not list:
            raise _not_stored(value, self.expects, "an array")
        return tuple(self._convert(value, depth, encoding=False))


class _Dict(_Converter):
    """``dict[str, X]``, stored as an object."""

    expects = "a dict with str keys"

    def __init__(self, item: _Converter) -> None:
        self._item = item

    def encode(self, value: Any, depth: int) -> Any:
        if not isinstance(value, dict):
            raise _wrong_type(value, self.expects)
        for key in value:
            if type(key) is not str:
                raise _Mismatch(value, self.expects, f"has the key {key!r}, which is not a str")
        return self._convert(self._item.encode, value, depth)

    def decode(self, value: Any, depth: int) -> Any:
        if type(value) is not dict:
            raise _not_stored(value, self.expects, "an object")
        return self._convert(self._item.decode, value, depth)

    def _convert(
        self, convert: Callable[[Any, int], Any], value: dict[str, Any], depth: int
    ) -> dict[str, Any]:
        if depth > MAX_DEPTH:
            raise _too_deep(value, self.expects)
        return {key: _step(convert, item, depth, "[%r]", key) for key, item in value.items()}


class _Optional(_Converter):
    """``X | None``: ``None`` as it is, anything else as ``X``."""

    def __init__(self, inner: _Converter) -> None:
        self._inner = inner
        self.expects = f"{inner.expects} or None"

    def encode(self, value: Any, depth: int) -> Any:
        return None if value is None else self._inner.encode(value, depth)

    def decode(self, value: Any, depth: int) -> Any:
        return None if value is None else self._inner.decode(value, depth)


def _each(
    convert: Callable[[Any, int], Any], values: Sequence[Any], depth: int, expects: str
) -> list[Any]:
    if depth > MAX_DEPTH:
        raise _too_deep(values, expects)
    return [_step(convert, item, depth, "[%d]", index) for index, item in enumerate(values)]


# -- reading annotations ---------------------------------------------------------------------


class _Unresolved:
    """An annotation whose names cannot be found (yet)."""


_UNRESOLVED: Any = _Unresolved()


class _Holder:
    """One annotation, as :func:`typing.get_type_hints` reads an object's."""

    def __init__(self, annotation: object) -> None:
        self.__annotations__ = {"a": annotation}


def _resolve(annotation: object, namespace: dict[str, Any]) -> Any:
    """``annotation`` evaluated (a string, or one holding strings) in ``namespace``."""
    try:
        return typing.get_type_hints(_Holder(annotation), globalns=namespace)["a"]
    except Exception:  # NameError above all; evaluating user text can raise anything
        return _UNRESOLVED


def _namespace(module: str | None) -> dict[str, Any]:
    found = sys.modules.get(module or "")
    return vars(found) if found is not None else {}


class _Compiler:
    """Builds converters for annotations; notes whether any name was unresolved."""

    def __init__(self) -> None:
        self.unresolved = False
        self._dataclasses: dict[type[Any], _Fields] = {}

    def resolve(self, annotation: object, namespace: dict[str, Any]) -> Any:
        resolved = _resolve(annotation, namespace)
        if resolved is _UNRESOLVED:
            self.unresolved = True
        return resolved

    def compile(self, annotation: Any) -> _Converter | None:
        """The converter of ``annotation``, or ``None`` if its values are plain JSON."""
        while isinstance(annotation, typing.NewType):
            annotation = annotation.__supertype__
        origin = typing.get_origin(annotation)
        if origin is None:
            if not isinstance(annotation, type):
                return None
            if annotation in _TEXTS:
                return _TEXTS[annotation]
            if issubclass(annotation, enum.Enum):
                return _Member(annotation)
            if dataclasses.is_dataclass(annotation):
                return self._dataclass(annotation)
            return None
        args = typing.get_args(annotation)
        if origin is list and len(args) == 1:
            item = self.compile(args[0])
            return None if item is None else _List(item)
        if origin is dict and len(args) == 2 and args[0] is str:
            item = self.compile(args[1])
            return None if item is None else _Dict(item)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                rest = self.compile(args[0])
                return None if rest is None else _Tuple(None, rest)
            items = [self.compile(arg) for arg in args]
            return _Tuple(items, None) if any(items) else None
        if origin is typing.Union or origin is types.UnionType:
            others = [arg for arg in args if arg is not type(None)]
            if len(others) == 1 and len(args) == 2:
                inner = self.compile(others[0])
                return None if inner is None else _Optional(inner)
        return None

    def _dataclass(self, cls: type[Any]) -> _Fields:
        known = self._dataclasses.get(cls)
        if known is not None:
            return known
        converter = self._dataclasses[cls] = _Fields(cls)
        fields = []
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            # Each field's annotation is read in the module of the class that declared it.
            owner = next(
                (c for c in cls.__mro__ if field.name in inspect.get_annotations(c)),
                cls,
            )
            annotation = self.resolve(field.type, _namespace(owner.__module__))
            required = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            fields.append((field.name, self.compile(annotation), required))
        converter.set_fields(fields)
        names = {name for name, _, _ in fields}
        try:
            needed = [
                p.name
                for p in inspect.signature(cls).parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            ]
        except (TypeError, ValueError):
            needed = []
        for name in needed:
            if name not in names:
                converter.unstorable = (
                    f"cannot be stored: {cls.__qualname__}() needs {name!r}, which is not "
                    "one of its fields",
                    f"give {name!r} a default, or make it a field",
                )
                break
        return converter


# -- a task's codec --------------------------------------------------------------------------


class _Param(NamedTuple):
    name: str
    #: The annotation as a message shows it.
    shown: str
    converter: _Converter


class _Plan(NamedTuple):
    """Which argument goes through which converter."""

    #: By position, for the parameters a call can fill positionally (``None``: plain).
    positional: tuple[_Param | None, ...]
    #: ``*args``, each item, if typed.
    star: _Param | None
    #: By name, the typed parameters a call can pass by keyword.
    keyword: Mapping[str, _Param]
    #: Every name a call can pass by keyword; any other goes to ``**kwargs``.
    named: frozenset[str]
    #: ``**kwargs``, each value, if typed.
    star_star: _Param | None


def _shown(annotation: Any) -> str:
    """``list[Order] | None``: an annotation as written, without module names."""
    if annotation is type(None):
        return "None"
    if annotation is Ellipsis:
        return "..."
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(_shown(arg) for arg in args)
    if origin is not None and args:
        return f"{_shown(origin)}[{', '.join(_shown(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return inspect.formatannotation(annotation)


def _plan(fn: Callable[..., Any], signature: inspect.Signature) -> tuple[_Plan, bool, bool]:
    """The plan of ``fn``; whether any parameter is typed; whether a name was unresolved."""
    compiler = _Compiler()
    target = inspect.unwrap(fn)
    namespace = getattr(target, "__globals__", None)
    if namespace is None:
        namespace = _namespace(getattr(target, "__module__", None))
    positional: list[_Param | None] = []
    keyword: dict[str, _Param] = {}
    named: set[str] = set()
    star: _Param | None = None
    star_star: _Param | None = None
    typed = False
    for parameter in signature.parameters.values():
        param = None
        if parameter.annotation is not parameter.empty:
            annotation = compiler.resolve(parameter.annotation, namespace)
            converter = compiler.compile(annotation)
            if converter is not None:
                param = _Param(parameter.name, _shown(annotation), converter)
                typed = True
        kind = parameter.kind
        if kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            positional.append(param)
        if kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            named.add(parameter.name)
            if param is not None:
                keyword[parameter.name] = param
        if kind is parameter.VAR_POSITIONAL:
            star = param
        elif kind is parameter.VAR_KEYWORD:
            star_star = param
    plan = _Plan(tuple(positional), star, keyword, frozenset(named), star_star)
    return plan, typed, compiler.unresolved


class ArgumentCodec:
    """Encodes a task's typed arguments at enqueue and decodes them for its run.

    Made by :func:`codec_for` when the task is declared. Each method takes a call's
    ``args`` and ``kwargs`` and returns new ones, converting only the arguments of
    typed parameters (of ``*args`` and ``**kwargs`` too: each item by the annotation).
    """

    def __init__(
        self, fn: Callable[..., Any], signature: inspect.Signature, plan: _Plan, pending: bool
    ) -> None:
        self._fn = fn
        self._signature = signature
        self._plan = plan
        #: An annotation could not be resolved at declaration: try once more at first use.
        self._pending = pending

    def encode(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The stored (plain JSON) forms of a call's arguments.

        :raises ArgumentTypeError: an argument does not fit its parameter's annotation.
        """
        return self._convert(args, kwargs, decoding=False)

    def decode(
        self, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """The values the task is called with, from their stored forms.

        :raises ArgumentDecodeError: a stored value does not decode by its annotation.
        """
        return self._convert(args, kwargs, decoding=True)

    def _ready(self) -> _Plan:
        if self._pending:
            plan, _, _ = _plan(self._fn, self._signature)
            self._plan, self._pending = plan, False
        return self._plan

    def _convert(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], *, decoding: bool
    ) -> tuple[list[Any], dict[str, Any]]:
        plan = self._ready()
        args = list(args)
        kwargs = dict(kwargs)
        positional = plan.positional
        for index, value in enumerate(args):
            param = positional[index] if index < len(positional) else plan.star
            if param is not None:
                args[index] = _one(param, value, decoding, f"args[{index}]")
        for name, value in list(kwargs.items()):
            param = plan.keyword.get(name)
            if param is None and name not in plan.named:
                param = plan.star_star
            if param is not None:
                kwargs[name] = _one(param, value, decoding, f"kwargs[{name!r}]")
        return args, kwargs


def _one(param: _Param, value: Any, decoding: bool, path: str) -> Any:
    converter = param.converter
    try:
        return converter.decode(value, 1) if decoding else converter.encode(value, 1)
    except _Mismatch as exc:
        steps = [step % key for step, key in reversed(exc.where)]
        if len(steps) > 8:  # nested too deeply: its start and its end say where
            steps = [*steps[:4], "...", *steps[-2:]]
        where = path + "".join(steps)
        if decoding:
            raise ArgumentDecodeError(
                where,
                exc.value,
                f"cannot be decoded as {exc.expects} for parameter {param.name!r} "
                f"({param.shown}): {exc.text}",
            ) from None
        fix = exc.fix or f"pass {exc.expects}{' there' if exc.where else ''}"
        raise ArgumentTypeError(
            where,
            exc.value,
            f"{exc.text}: parameter {param.name!r} is annotated {param.shown}, so {fix}",
        ) from None


def codec_for(fn: Callable[..., Any], signature: inspect.Signature | None) -> ArgumentCodec | None:
    """The codec of a task whose function is ``fn``; ``None`` if no parameter has an
    annotation that needs one (then arguments are plain JSON, as they always were)."""
    if signature is None:
        return None
    plan, typed, unresolved = _plan(fn, signature)
    if not typed and not unresolved:
        return None
    return ArgumentCodec(fn, signature, plan, pending=unresolved)

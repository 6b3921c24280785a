"""A Griffe extension for the API reference: ``**options: Unpack[UsingOptions]`` shown as
the keyword parameters it stands for, so that each option's ``:param:`` in the docstring
has its parameter in the signature.

The options are declared once, as TypedDicts that build on each other
(``flask_sqlqueue/core/options.py``); Griffe's own ``unpack_typeddict`` reads a
TypedDict's own keys only, not those of its bases. Loaded by mkdocs.yml.
"""

from __future__ import annotations

from typing import Any

import griffe

_UNPACK = {"typing.Unpack", "typing_extensions.Unpack"}


class UnpackOptions(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for func in _functions(pkg):
            _expand(func)


def _functions(obj: griffe.Object) -> list[griffe.Function]:
    found: list[griffe.Function] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Function):
            found.append(member)
        elif isinstance(member, griffe.Module | griffe.Class):
            found += _functions(member)
    return found


def _expand(func: griffe.Function) -> None:
    for parameter in func.parameters:
        annotation = parameter.annotation
        if (
            parameter.kind is griffe.ParameterKind.var_keyword
            and isinstance(annotation, griffe.ExprSubscript)
            and annotation.canonical_path in _UNPACK
        ):
            break
    else:
        return
    typed_dict = func.modules_collection[annotation.slice.canonical_path]
    del func.parameters[parameter.name]
    for name, attribute in _keys(typed_dict).items():
        func.parameters[name] = griffe.Parameter(
            name,
            annotation=attribute.annotation,
            kind=griffe.ParameterKind.keyword_only,
            default="...",
        )


def _keys(cls: griffe.Class) -> dict[str, griffe.Attribute]:
    """The keys of a TypedDict, its bases' first (as ``__annotations__`` orders them)."""
    keys: dict[str, griffe.Attribute] = {}
    for base in cls.bases:
        path = getattr(base, "canonical_path", "")
        if path.startswith("flask_sqlqueue."):
            keys.update(_keys(cls.modules_collection[path]))
    for name, member in cls.members.items():
        if not member.is_alias and isinstance(member, griffe.Attribute):
            keys[name] = member
    return keys

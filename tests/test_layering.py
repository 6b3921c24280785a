"""What import-linter cannot check about the layering (its contracts, in pyproject.toml,
run in ``make lint``; see docs/architecture.md).

- No module cycle at all: its ``acyclic_siblings`` contract finds cycles between the
  siblings of each package, not one through a package's ``__init__`` and a module of
  that package. Here, with grimp (import-linter's graph library), any cycle is found.
- Only the dialect modules and the models import ``sqlalchemy.dialects``: the linter
  sees an outside package as one module, ``sqlalchemy``.
- Only they spell a database's name or a PRAGMA in code.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "flask_sqlqueue"
CORE_DIR = PACKAGE_DIR / "core"
#: The only places that may name a database: the dialect modules and the column types.
DIALECT_HOMES = {CORE_DIR / "dialects", CORE_DIR / "models.py"}
DATABASE_NAMES = {"sqlite", "postgresql", "mysql", "mariadb"}


# -- no cycle, counting every import statement ------------------------------------------------


def _cycles(graph: grimp.ImportGraph) -> Iterator[list[str]]:
    """Each import that closes a cycle, as the cycle: ``[a, b, ..., a]``."""
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                yield [importer, *back]


def _ignored_by_the_linter() -> set[tuple[str, str]]:
    """The imports the linter's no-cycles contract is told to ignore, ignored here too."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "no-cycles"]
    pairs = (line.split("->") for line in contract.get("ignore_imports", []))
    return {(importer.strip(), imported.strip()) for importer, imported in pairs}


def test_the_package_has_no_import_cycle() -> None:
    # grimp counts every import statement: at module level, inside functions, and
    # under TYPE_CHECKING.
    graph = grimp.build_graph("flask_sqlqueue", cache_dir=None)
    for importer, imported in _ignored_by_the_linter():
        if graph.direct_import_exists(importer=importer, imported=imported):
            graph.remove_import(importer=importer, imported=imported)
    found = [" -> ".join(cycle) for cycle in _cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_cycle_check_counts_imports_in_functions_and_for_type_checking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "cyclic"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        # A cycle through a function-level import...
        "a.py": "def f():\n    from . import b\n",
        "b.py": "from . import a\n",
        # ...one through a TYPE_CHECKING import...
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n",
        "d.py": "from . import c\n",
        # ...and one through a package's __init__, which no sibling check can see.
        "sub/__init__.py": "from . import leaf\n",
        "sub/leaf.py": "from .. import sub\n",
        "e.py": "from . import a\n",  # reaches a cycle, is in none
    }
    for name, source in files.items():
        (package / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic", cache_dir=None)
    closing = {(cycle[0], cycle[1]) for cycle in _cycles(graph)}
    assert closing == {
        ("cyclic.a", "cyclic.b"),
        ("cyclic.b", "cyclic.a"),
        ("cyclic.c", "cyclic.d"),
        ("cyclic.d", "cyclic.c"),
        ("cyclic.sub", "cyclic.sub.leaf"),
        ("cyclic.sub.leaf", "cyclic.sub"),
    }


def test_the_linter_ignores_only_the_extensions_imports_of_adapters() -> None:
    # The one exception to the layers and to acyclicity, until the extension stops
    # reaching the adapters: no other import may be silenced.
    adapters = {"cli", "admin", "metrics", "testing"}
    for importer, imported in sorted(_ignored_by_the_linter()):
        assert importer == "flask_sqlqueue.extension", (importer, imported)
        assert imported.removeprefix("flask_sqlqueue.") in adapters, (importer, imported)


# -- database names ------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    return _imports_of(path.read_text(), _module_name(path), path.name == "__init__.py")


def _imports_of(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` imports, relative imports resolved to absolute names.

    ``from x import y`` yields both ``x`` and ``x.y``, since ``y`` may be a module.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def _names_a_dialect(name: str) -> bool:
    return name == "sqlalchemy.dialects" or name.startswith("sqlalchemy.dialects.")


def _outside_the_dialect_homes() -> list[Path]:
    paths = [
        path
        for path in sorted(PACKAGE_DIR.rglob("*.py"))
        if not any(path == home or path.is_relative_to(home) for home in DIALECT_HOMES)
    ]
    assert len(paths) >= 30, "the package moved; update this test"
    return paths


def test_dialect_imports_only_in_the_dialect_modules_and_models() -> None:
    for path in _outside_the_dialect_homes():
        dialects = sorted(name for name in _imports(path) if _names_a_dialect(name))
        assert not dialects, f"{path.relative_to(PACKAGE_DIR)} imports {dialects}"


def test_the_dialect_modules_are_where_the_dialects_are() -> None:
    # Guards the test above against passing vacuously: the walker does see these imports.
    for name in ("sqlite", "postgresql", "mysql"):
        found = _imports(CORE_DIR / "dialects" / f"{name}.py")
        assert f"sqlalchemy.dialects.{name}" in found


def _names_a_database(source: str) -> list[str]:
    """String constants in code that name a database or run a PRAGMA (a docstring or a
    comment may mention them)."""
    return [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in DATABASE_NAMES or node.value.lstrip().upper().startswith("PRAGMA"))
    ]


def test_only_the_dialect_modules_and_models_name_a_database() -> None:
    for path in _outside_the_dialect_homes():
        named = _names_a_database(path.read_text())
        assert not named, f"{path.relative_to(PACKAGE_DIR)} names {named}: use DialectOps"
    sqlite = (CORE_DIR / "dialects" / "sqlite.py").read_text()
    assert "sqlite" in _names_a_database(sqlite) and "PRAGMA busy_timeout" in sqlite


def test_the_import_walker_resolves_every_form() -> None:
    source = (
        "import flask.cli\n"
        "from sqlalchemy.dialects import sqlite\n"
        "from ...extension import SQLQueue\n"
        "from .. import models\n"
        "from . import base\n"
        "def f():\n"
        "    import sqlalchemy.dialects.mysql\n"
    )
    found = _imports_of(source, "flask_sqlqueue.core.dialects.example")
    assert {"flask.cli", "sqlalchemy.dialects.sqlite", "sqlalchemy.dialects.mysql"} <= found
    assert "flask_sqlqueue.extension" in found
    assert "flask_sqlqueue.core.models" in found
    assert "flask_sqlqueue.core.dialects.base" in found
    assert "flask_sqlqueue.core.thing" in _imports_of(
        "from . import thing", "flask_sqlqueue.core", True
    )

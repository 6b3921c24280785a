"""The module layering of STYLE.md, as tests that fail when an import crosses a layer."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "flask_sqlqueue"
CORE_DIR = PACKAGE_DIR / "core"
FRAMEWORK = {"flask", "click", "jinja2", "werkzeug"}
#: The only places that may name a database: the dialect modules and the column types.
DIALECT_HOMES = {CORE_DIR / "dialects", CORE_DIR / "models.py"}
#: What core may reach in the package outside core/: the stdlib-only layer 0.
CORE_MAY_IMPORT = {"flask_sqlqueue.bounds", "flask_sqlqueue.config", "flask_sqlqueue.exceptions"}


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


def _roots(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def _core_files() -> list[Path]:
    files = sorted(CORE_DIR.rglob("*.py"))
    assert len(files) >= 10, "the core package moved; update this test"
    return files


def test_core_imports_no_framework() -> None:
    for path in _core_files():
        bad = _roots(_imports(path)) & FRAMEWORK
        assert not bad, f"{path.relative_to(PACKAGE_DIR)} imports {sorted(bad)}"


def test_core_reaches_no_glue_module() -> None:
    # A relative import of ..extension or ..cli would bring Flask in through the back door.
    for path in _core_files():
        for name in _imports(path):
            if name.startswith("flask_sqlqueue.") and not name.startswith("flask_sqlqueue.core"):
                assert any(name == ok or name.startswith(ok + ".") for ok in CORE_MAY_IMPORT), (
                    f"{path.relative_to(PACKAGE_DIR)} imports {name}"
                )


def _names_a_dialect(name: str) -> bool:
    return name == "sqlalchemy.dialects" or name.startswith("sqlalchemy.dialects.")


def test_dialect_imports_only_in_the_dialect_modules_and_models() -> None:
    checked = 0
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if any(path == home or path.is_relative_to(home) for home in DIALECT_HOMES):
            continue
        dialects = sorted(name for name in _imports(path) if _names_a_dialect(name))
        assert not dialects, f"{path.relative_to(PACKAGE_DIR)} imports {dialects}"
        checked += 1
    assert checked >= 15


def test_the_dialect_modules_are_where_the_dialects_are() -> None:
    # Guards the test above against passing vacuously: the walker does see these imports.
    for name in ("sqlite", "postgresql", "mysql"):
        found = _imports(CORE_DIR / "dialects" / f"{name}.py")
        assert f"sqlalchemy.dialects.{name}" in found


def test_the_import_walker_resolves_every_form() -> None:
    source = (
        "import flask.cli\n"
        "from click import echo\n"
        "from sqlalchemy.dialects import sqlite\n"
        "from ...extension import SQLQueue\n"
        "from .. import models\n"
        "from . import base\n"
        "def f():\n"
        "    import werkzeug\n"
    )
    found = _imports_of(source, "flask_sqlqueue.core.dialects.example")
    assert _roots(found) & FRAMEWORK == {"flask", "click", "werkzeug"}
    assert _names_a_dialect("sqlalchemy.dialects.sqlite") and "sqlalchemy.dialects.sqlite" in found
    assert "flask_sqlqueue.extension" in found
    assert "flask_sqlqueue.core.models" in found
    assert "flask_sqlqueue.core.dialects.base" in found
    assert "flask_sqlqueue.core.thing" in _imports_of(
        "from . import thing", "flask_sqlqueue.core", True
    )

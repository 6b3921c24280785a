"""All database-specific SQL, behind one small object chosen once per database.

Each database's module is imported the first time the queue meets that database: it
loads SQLAlchemy's dialect for it, which a queue on another database never needs.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa

from ...exceptions import UnsupportedDatabase
from ..models import use_dialect
from .base import DialectOps

#: The class of each dialect's operations, as ``module:class`` under this package.
_OPS: dict[str, str] = {
    "sqlite": "sqlite:SQLiteOps",
    "postgresql": "postgresql:PostgresOps",
    "mysql": "mysql:MySQLOps",
    "mariadb": "mysql:MySQLOps",
}


def _ops_class(name: str) -> type[DialectOps]:
    module, _, cls = _OPS[name].partition(":")
    found: type[DialectOps] = getattr(importlib.import_module(f"{__name__}.{module}"), cls)
    return found


def for_dialect(name: str) -> DialectOps:
    """The operations for a SQLAlchemy dialect name, or :class:`UnsupportedDatabase`."""
    try:
        ops = _ops_class(name)
    except KeyError:
        raise UnsupportedDatabase(
            name, supported=["mariadb", "mysql", "postgresql", "sqlite"]
        ) from None
    use_dialect(name)
    return ops()


def database_identity(url: sa.URL) -> str:
    """A key that is equal for two URLs naming the same database (on any database, the
    queue's or not: a caller's session is compared with it)."""
    backend = url.get_backend_name()
    return (_ops_class(backend) if backend in _OPS else DialectOps).identity(url)


__all__ = ["DialectOps", "database_identity", "for_dialect"]

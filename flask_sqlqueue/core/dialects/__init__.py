"""All database-specific SQL, behind one small object chosen once per database."""

from __future__ import annotations

from ...exceptions import UnsupportedDatabase
from .base import DialectOps
from .mysql import MySQLOps
from .postgresql import PostgresOps
from .sqlite import SQLiteOps

_OPS: dict[str, type[DialectOps]] = {
    "sqlite": SQLiteOps,
    "postgresql": PostgresOps,
    "mysql": MySQLOps,
    "mariadb": MySQLOps,
}


def for_dialect(name: str) -> DialectOps:
    """The operations for a SQLAlchemy dialect name, or :class:`UnsupportedDatabase`."""
    try:
        return _OPS[name]()
    except KeyError:
        raise UnsupportedDatabase(
            name, supported=["mariadb", "mysql", "postgresql", "sqlite"]
        ) from None


__all__ = ["DialectOps", "for_dialect"]

"""All database-specific SQL, behind one small object chosen once per database."""

from __future__ import annotations

import sqlalchemy as sa

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


def database_identity(url: sa.URL) -> str:
    """A key that is equal for two URLs naming the same database (on any database, the
    queue's or not: a caller's session is compared with it)."""
    return _OPS.get(url.get_backend_name(), DialectOps).identity(url)


__all__ = ["DialectOps", "database_identity", "for_dialect"]

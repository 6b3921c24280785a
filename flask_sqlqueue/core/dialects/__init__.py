"""All database-specific SQL, behind one small object chosen once per database.

Each database's module is imported the first time the queue meets that database: it
loads SQLAlchemy's dialect for it, which a queue on another database never needs.
"""

from __future__ import annotations

import importlib

import sqlalchemy as sa

from ...exceptions import ConfigurationError
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


#: Schemes people write that SQLAlchemy does not know, and the one it does.
_SCHEMES = {"postgres": "postgresql+psycopg"}
#: By backend: the URL scheme with the driver the queue's extras install, and the extra.
_DRIVERS = {
    "postgresql": ("postgresql+psycopg", "postgres"),
    "mysql": ("mysql+pymysql", "mysql"),
    "mariadb": ("mariadb+pymysql", "mysql"),
}


def check_scheme(url: sa.URL) -> None:
    """Refuse a URL scheme SQLAlchemy does not know, naming the one to write.

    :raises ConfigurationError: ``postgres://`` (Heroku's and libpq's spelling).
    """
    backend = url.get_backend_name()
    if backend in _SCHEMES:
        raise ConfigurationError(
            f"{backend}:// is not a database URL scheme SQLAlchemy knows; write "
            f"{_SCHEMES[backend]}://... (SQLQUEUE_DATABASE_URI)."
        )


def in_folder(uri: str, folder: str) -> str:
    """``uri`` with a relative SQLite path read from ``folder`` (the app's instance
    folder), as Flask-SQLAlchemy reads ``SQLALCHEMY_DATABASE_URI``; any other URL as it is.

    :raises ConfigurationError: the relative path names no file in ``folder`` but one
        in the working directory, where earlier releases read it (moving on in silence
        would leave that file's jobs behind).
    """
    url = sa.make_url(uri)
    check_scheme(url)
    placed = for_dialect(url.get_backend_name()).in_folder(url, folder)
    return uri if placed is url else placed.render_as_string(hide_password=False)


def in_memory(uri: str) -> bool:
    """Whether ``uri`` is a database that lives in one connection of this process
    (SQLite's ``sqlite://``): see :meth:`DialectOps.in_memory`."""
    url = sa.make_url(uri)
    backend = url.get_backend_name()
    return backend in _OPS and _ops_class(backend)().in_memory(url)


def driver_missing(url: sa.URL, exc: ImportError) -> ConfigurationError:
    """The error for a URL whose driver module is not installed: the scheme of a driver
    the queue's extras install, and the extra."""
    backend = url.get_backend_name()
    scheme, extra = _DRIVERS.get(backend, (f"{backend}+<driver>", None))
    install = f" (pip install 'flask-sqlqueue[{extra}]')" if extra else ""
    return ConfigurationError(
        f"The database URL {url.render_as_string(hide_password=True)!r} needs the "
        f"driver module {exc.name!r}, which is not installed; write {scheme}://..."
        f"{install}, or install that driver."
    )


def database_identity(url: sa.URL) -> str:
    """A key that is equal for two URLs naming the same database (on any database, the
    queue's or not: a caller's session is compared with it)."""
    backend = url.get_backend_name()
    return (_ops_class(backend) if backend in _OPS else DialectOps).identity(url)


__all__ = ["DialectOps", "check_scheme", "database_identity", "driver_missing", "for_dialect"]

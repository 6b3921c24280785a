"""The guard of a SQLite database file: writes refused once the file has gone.

A SQLite connection keeps the file it opened, whatever happens at its path: deleted, or
replaced by another file (a restored backup, a test's fresh database), the old file
lives on for the connections that have it open, and every write to it is lost or never
seen. The store asks :meth:`FileGuard.check` before each write transaction.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from ..exceptions import DatabaseFileChanged


class FileGuard:
    """Watches the file at ``path`` that ``engine``'s connections open."""

    def __init__(self, engine: Engine, path: str) -> None:
        self._path = path
        # The file the first connection opened, and whether it has gone since
        # (deleted: True, replaced: False).
        self._file: tuple[int, int] | None = None
        self._gone: bool | None = None
        event.listen(engine, "connect", self._opened)

    def check(self) -> None:
        """Raise if the file at the database's path is no longer the one this store's
        connections opened (it was deleted, or another moved over it): they would go on
        with the old file, where every write is lost or never seen.

        :raises DatabaseFileChanged: it is not.
        """
        if self._file is None:
            return  # nothing opened yet
        if self._gone is None:
            found = _file_identity(self._path)
            if found == self._file:
                return
            self._gone = found is None
        raise DatabaseFileChanged(self._path, deleted=self._gone)

    def _opened(self, _dbapi_connection: Any, _record: Any) -> None:
        found = _file_identity(self._path)
        if self._file is None:
            self._file = found
        elif found != self._file and self._gone is None:
            # A connection opened on what is at the path now, beside the pooled ones
            # on the old file: writes would land in either.
            self._gone = found is None


def _file_identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``; ``None`` if there is none."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)

"""Same-host wake-ups for databases that cannot notify (SQLite, MariaDB): a worker claims
a new job at once instead of at its next poll, without polling the database in a tight
loop. Workers on other hosts (MariaDB) still poll.

Each idle worker binds a Unix datagram socket in a folder private to this user and this
database; after a commit, an enqueue sends one byte to every socket there. It is a hint
only: a lost datagram costs one poll interval, never a job.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import tempfile
import threading
import uuid
from pathlib import Path

log = logging.getLogger("flask_sqlqueue.worker")


def wake_dir(database: str) -> Path | None:
    """The folder of wake-up sockets for a database (``database`` names it: a file's
    real path, a server's address and database); ``None`` without Unix sockets."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    digest = hashlib.sha256(database.encode()).hexdigest()[:16]
    # Short on purpose: a socket path must fit in about 100 bytes.
    return Path(tempfile.gettempdir()) / f"sqlqueue-{os.getuid()}" / digest


def broadcast(folder: Path | None) -> None:
    """Wake every worker listening on this database."""
    if folder is None:
        return
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for name in names:
            path = folder / name
            try:
                sender.sendto(b"!", str(path))
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):  # a worker that died without cleaning up
                    path.unlink()
            except OSError:
                pass  # a full buffer means it is already awake


def listen(folder: Path | None, wake: threading.Event, stop: threading.Event) -> None:
    """Set ``wake`` for every datagram until ``stop`` is set. Runs on its own thread."""
    if folder is None:
        return
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.parent.chmod(0o700)
    except OSError as exc:
        log.warning("no same-host wake-ups (%s); polling only", exc)
        return
    path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        try:
            receiver.bind(str(path))
        except OSError as exc:
            log.warning("no same-host wake-ups (%s); polling only", exc)
            return
        # Short: a stopping worker (the end of every --burst run) waits for this thread.
        receiver.settimeout(0.1)
        try:
            while not stop.is_set():
                try:
                    receiver.recv(64)
                except TimeoutError:
                    continue
                wake.set()
        finally:
            with contextlib.suppress(OSError):
                path.unlink()

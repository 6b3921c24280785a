"""Same-host wake-ups for databases that cannot notify (SQLite, MariaDB), and the waiters
of :meth:`Job.wait` on every database.

Workers: each idle worker binds a Unix datagram socket in a folder private to this user
and this database; after a commit, an enqueue sends one byte to every socket there, so a
worker claims a new job at once instead of at its next poll. Workers on other hosts
(MariaDB) still poll.

Waiters: a process that waits for jobs to finish binds one socket in a second folder
beside the first (:func:`waiters_dir`); after a commit that finishes jobs, the writer
sends their ids to every socket there (:func:`tell_finished`). With no waiter on this
host that folder is empty or absent, and the writer sends nothing. :class:`Waiters`
keeps a process's waiters, and runs the one listener that wakes them (a socket here, or
PostgreSQL's LISTEN: ``DialectOps.listen_finished``) while anyone waits.

Every wake-up is a hint only: a lost datagram costs a worker one poll interval and a
waiter one recheck of the database, never a job or a result.
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
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("flask_sqlqueue.worker")

#: What a listener tells :class:`Waiters`: the ids of jobs that finished, or ``None``
#: when any job may have (it has just started listening, and missed what came before).
Finished = Callable[["Iterable[int] | None"], None]
#: Ids per datagram (or per notification), well below what either carries.
IDS_PER_MESSAGE = 400


def wake_dir(database: str) -> Path | None:
    """The folder of wake-up sockets for a database (``database`` names it: a file's
    real path, a server's address and database); ``None`` without Unix sockets."""
    if not hasattr(socket, "AF_UNIX"):
        return None
    digest = hashlib.sha256(database.encode()).hexdigest()[:16]
    # Short on purpose: a socket path must fit in about 100 bytes.
    return Path(tempfile.gettempdir()) / f"sqlqueue-{os.getuid()}" / digest


def waiters_dir(folder: Path | None) -> Path | None:
    """The folder of the waiters' sockets for the database whose workers' folder is
    ``folder`` (:func:`wake_dir`): a sibling, so a wake-up for workers never reaches a
    waiter, nor the reverse."""
    return None if folder is None else folder.with_name(f"{folder.name}-w")


def beats_dir(database: str) -> Path:
    """The folder of the workers' beat files (core/liveness.py) for a database
    (``database`` names it, as for :func:`wake_dir`); not a wake-up folder, where every
    name is taken for a socket."""
    digest = hashlib.sha256(database.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"sqlqueue-{os.getuid()}" / f"{digest}-b"


def broadcast(folder: Path | None) -> None:
    """Wake every worker listening on this database."""
    _send(folder, _sockets(folder), [b"!"])


def tell_finished(folder: Path | None, ids: Collection[int]) -> None:
    """Tell every process waiting on this host (its socket in ``folder``, a
    :func:`waiters_dir`) that the jobs ``ids`` finished. When no process waits, this is
    one look at the folder: no message is made, no socket opened."""
    if not ids:
        return
    sockets = _sockets(folder)
    if sockets:
        _send(folder, sockets, list(encode_ids(ids)))


def encode_ids(ids: Iterable[int]) -> Iterator[bytes]:
    """``ids`` as messages of at most :data:`IDS_PER_MESSAGE` ids: ``b"1,2,3"``."""
    part: list[str] = []
    for job_id in ids:
        part.append(str(job_id))
        if len(part) == IDS_PER_MESSAGE:
            yield ",".join(part).encode()
            part = []
    if part:
        yield ",".join(part).encode()


def decode_ids(message: bytes | str) -> list[int] | None:
    """The ids of a message of :func:`encode_ids`; ``None`` (any job) if it is not one."""
    try:
        text = message.decode() if isinstance(message, bytes) else message
        return [int(part) for part in text.split(",")]
    except ValueError:
        return None


def _sockets(folder: Path | None) -> list[str]:
    """The names of the sockets in ``folder`` (none if it does not exist)."""
    if folder is None:
        return []
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def _send(folder: Path | None, names: list[str], messages: list[bytes]) -> None:
    """Send each of ``messages`` to each socket ``names`` in ``folder``."""
    if folder is None or not names:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for name in names:
            path = os.path.join(folder, name)
            try:
                for message in messages:
                    sender.sendto(message, path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):  # a process that died without cleaning up
                    os.unlink(path)
            except OSError:
                pass  # a full buffer means it is already awake


def listen(folder: Path | None, wake: threading.Event, stop: threading.Event) -> None:
    """Set ``wake`` for every datagram until ``stop`` is set. Runs on its own thread."""
    _receive(folder, lambda _message: wake.set(), stop)


def listen_finished(folder: Path | None, finished: Finished, stop: threading.Event) -> None:
    """Pass the ids of every datagram of :func:`tell_finished` to ``finished`` until
    ``stop`` is set (and ``None`` once the socket is bound: anything may have finished
    before). Runs on its own thread."""
    _receive(folder, lambda message: finished(decode_ids(message)), stop, ready=finished)


def _receive(
    folder: Path | None,
    received: Callable[[bytes], None],
    stop: threading.Event,
    *,
    ready: Finished | None = None,
) -> None:
    """Bind a socket in ``folder`` and pass each datagram to ``received`` until ``stop``
    is set; the socket is removed when it returns."""
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
            if ready is not None:
                ready(None)
            while not stop.is_set():
                try:
                    message = receiver.recv(65536)
                except TimeoutError:
                    continue
                received(message)
        finally:
            with contextlib.suppress(OSError):
                path.unlink()


class Waiters:
    """The jobs this process waits for, each with the events of its waiters; and the
    one listener thread that sets them, running while anyone waits.

    :param listen: ``listen(finished, stop)``, run on the listener thread: passes what
        it hears to ``finished`` (see :data:`Finished`) until ``stop`` is set.
    """

    def __init__(self, listen: Callable[[Finished, threading.Event], None]) -> None:
        self._listen = listen
        self._lock = threading.Lock()
        self._events: dict[int, set[threading.Event]] = {}
        self._stop: threading.Event | None = None
        #: Set while the listener listens: a job that finishes now wakes its waiters at
        #: once, not at their next recheck. For tests of the wake-ups.
        self.listening = threading.Event()

    @contextlib.contextmanager
    def watch(self, job_id: int, event: threading.Event) -> Iterator[None]:
        """Set ``event`` whenever job ``job_id`` may have finished, for the block."""
        with self._lock:
            self._events.setdefault(job_id, set()).add(event)
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(
                    target=self._listen,
                    args=(self.finished, self._stop),
                    name="sqlqueue-wait-listen",
                    daemon=True,
                ).start()
        try:
            yield
        finally:
            with self._lock:
                events = self._events.get(job_id, set())
                events.discard(event)
                if not events:
                    self._events.pop(job_id, None)
                if not self._events and self._stop is not None:
                    # The last waiter is gone: the listener stops (within 0.1 s).
                    self._stop.set()
                    self._stop = None
                    self.listening.clear()

    def finished(self, ids: Iterable[int] | None) -> None:
        """Wake the waiters of ``ids`` (every waiter with ``None``)."""
        with self._lock:
            if ids is None:
                if self._stop is not None:
                    self.listening.set()
                events = [event for group in self._events.values() for event in group]
            else:
                events = [event for job_id in ids for event in self._events.get(job_id, ())]
        for event in events:
            event.set()

    def forked(self) -> None:
        """In a forked child: the parent's waiters and listener are not here."""
        self._lock = threading.Lock()
        self._events = {}
        self._stop = None
        self.listening = threading.Event()

"""What ``flask queue work`` tells a supervisor without a database round trip of its own:
a health file's modification time, and systemd's notification protocol.

Both are pushed from the worker's heartbeat thread after each heartbeat that went
through (:meth:`~flask_sqlqueue.core.worker.Worker.on_healthy`), so they go quiet when the
worker stops claiming. docs/operations.md shows the systemd, container and Kubernetes
setups that read them.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("flask_sqlqueue.worker")


class SystemdNotifier:
    """systemd's ``sd_notify`` protocol: datagrams to ``$NOTIFY_SOCKET``.

    ``READY=1`` with the first healthy moment (``Type=notify``), ``WATCHDOG=1`` with each
    one after it (``WatchdogSec=``), ``STOPPING=1`` once the worker is asked to stop (or
    its run ends). Sends nothing
    when ``$NOTIFY_SOCKET`` is unset, i.e. when not run by systemd as ``Type=notify``.
    """

    def __init__(self, address: str | None) -> None:
        # "@name" is Linux's abstract namespace, spelt with a NUL byte on the wire.
        self.address = None if not address else "\0" + address[1:] if address[0] == "@" else address
        self._ready = False
        self._stopping = False

    @classmethod
    def from_environment(cls) -> SystemdNotifier:
        return cls(os.environ.get("NOTIFY_SOCKET"))

    @property
    def active(self) -> bool:
        return self.address is not None

    def watchdog_seconds(self) -> float | None:
        """``WatchdogSec=`` as systemd passes it on (``$WATCHDOG_USEC``), if it does."""
        usec = os.environ.get("WATCHDOG_USEC", "")
        return int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 else None

    def healthy(self) -> None:
        """The worker's heartbeat went through: ``READY=1`` the first time, then
        ``WATCHDOG=1``."""
        if self._ready:
            self.send("WATCHDOG=1")
        else:
            self._ready = self.send("READY=1\nSTATUS=claiming jobs")

    def stopping(self) -> None:
        """The worker stops (asked to, or its run ended): ``STOPPING=1``, once."""
        if not self._stopping:
            self._stopping = True
            self.send("STOPPING=1")

    def send(self, message: str) -> bool:
        """Send one notification; ``False`` (logged) if it could not go."""
        if self.address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode(), self.address)
        except OSError as exc:
            log.warning("could not notify systemd at %s: %s", self.address, exc)
            return False
        return True

"""``flask queue ...``: a thin click layer over the core. Errors are one line, exit 1.

``flask_sqlqueue.SQLQueue.init_app`` adds :data:`queue_cli` to the app's commands. A
module per theme adds its commands to the group: ``work``, ``inspecting`` (status, list,
show, doctor), ``acting`` (retry, cancel, purge, rescue, pause, resume, enqueue),
``schedules`` (list, disable, enable, run; ``periodic``, its deprecated old name) and
``db``.
"""

from __future__ import annotations

from . import acting as acting
from . import db as db
from . import inspecting as inspecting
from . import schedules as schedules
from . import work as work
from .base import db_cli as db_cli
from .base import queue_cli as queue_cli

__all__ = ["db_cli", "queue_cli"]

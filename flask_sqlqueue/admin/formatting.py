"""How the admin's templates show times, durations and payloads (template helpers)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any


def absolute(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime | None, now: datetime) -> str:
    """``"3 min ago"`` or ``"in 20 s"``."""
    if value is None:
        return ""
    seconds = (now - value).total_seconds()
    return f"{duration(abs(seconds))} ago" if seconds >= 0 else f"in {duration(-seconds)}"


def duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return (
                f"{seconds / size:.0f} {unit}"
                if seconds < size * 10
                else (f"{int(seconds // size)} {unit}")
            )
    return f"{seconds:.0f} s"


def pretty(value: Any) -> str:
    """JSON, indented, non-ASCII kept as is (the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=repr)


def seconds(value: float | None) -> str:
    """A duration for the metrics table: ``"850 ms"``, ``"12.4 s"``, ``"3.2 min"``."""
    if value is None:
        return "\u2013"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 100:
        return f"{value:.1f} s"
    if value < 6000:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"

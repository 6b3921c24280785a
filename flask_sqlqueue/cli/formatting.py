"""How the commands show things: tables, ages, times, progress bars."""

from __future__ import annotations

import re
from datetime import datetime
from datetime import timedelta

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"1h30m"``, ``"90s"`` as a timedelta."""
    parts = _AGE.findall(text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != text.strip().lower():
        raise ValueError(
            f"{text!r} is not an age; use a number and s, m, h, d or w, like 7d or 12h."
        )
    try:
        return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))
    except OverflowError:
        raise ValueError(f"{text!r} is too long an age.") from None


def format_age(delta: timedelta) -> str:
    seconds = int(max(delta.total_seconds(), 0))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join(lines)


def first_line(text: str | None, width: int = 60) -> str:
    if not text:
        return ""
    line = text.splitlines()[0] if text.splitlines() else text
    return line if len(line) <= width else line[: width - 3] + "..."


def format_time(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def progress_bar(fraction: float | None, message: str | None, width: int = 20) -> str:
    """``[#########-----------]  45%  page 9 of 20``, or ``-``."""
    if fraction is None:
        return "-"
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    bar = f"[{'#' * filled}{'-' * (width - filled)}] {fraction * 100:3.0f}%"
    return f"{bar}  {first_line(message, 60)}" if message else bar


def indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())

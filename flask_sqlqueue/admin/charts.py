"""The dashboard's charts, drawn as inline SVG here so the page needs no script: stacked
bars of completed jobs and failed attempts, and the waiting jobs as an area."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from markupsafe import Markup
from markupsafe import escape

from ..core import queries


@dataclass(frozen=True, slots=True)
class Span:
    """A span the dashboard's charts can show."""

    length: timedelta
    step: timedelta
    title: str
    per: str
    #: Axis labels at the left edge and the middle.
    start: str
    middle: str
    #: Seconds between auto-refreshes.
    refresh: int


SPANS = {
    "1h": Span(
        timedelta(hours=1),
        timedelta(minutes=1),
        "last hour",
        "per minute",
        "\u221260 min",
        "\u221230 min",
        5,
    ),
    "24h": Span(
        timedelta(days=1),
        timedelta(minutes=10),
        "last day",
        "per 10 minutes",
        "\u221224 h",
        "\u221212 h",
        60,
    ),
}


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    completed_y: float
    completed_h: float
    failed_y: float
    failed_h: float
    label: str


def _slots(data: queries.Activity, width: int) -> tuple[float, float]:
    slot = width / max(len(data.starts), 1)
    return slot, round(max(slot - 1, 0.5), 2)


def _when(data: queries.Activity, i: int) -> str:
    start = data.starts[i]
    return f"{start:%H:%M}\u2013{start + data.step:%H:%M} UTC"


def activity_chart(data: queries.Activity, width: int = 960, height: int = 120) -> dict[str, Any]:
    """Stacked bars (completed jobs, failed attempts) for an inline SVG, computed here so
    the page needs no script."""
    totals = [c + f for c, f in zip(data.completed, data.failed, strict=True)]
    top = max([*totals, 1])
    slot, bar_width = _slots(data, width)
    bars = []
    for i in range(len(data.starts)):
        c_h = height * data.completed[i] / top
        f_h = height * data.failed[i] / top
        bars.append(
            Bar(
                x=round(i * slot + 0.5, 2),
                width=bar_width,
                completed_y=round(height - c_h, 2),
                completed_h=round(c_h, 2),
                failed_y=round(height - c_h - f_h, 2),
                failed_h=round(f_h, 2),
                label=(
                    f"{_when(data, i)}: {data.completed[i]} completed, "
                    f"{data.failed[i]} failed attempt{'s' if data.failed[i] != 1 else ''}"
                ),
            )
        )
    return {
        "width": width,
        "height": height,
        "bars": bars,
        "svg": _bars_svg(bars, height),
        "top": top,
        "completed": sum(data.completed),
        "failed": sum(data.failed),
        "partial": data.failed_partial,
        "first": data.starts[0] if data.starts else None,
    }


def depth_chart(data: queries.Activity, width: int = 960, height: int = 80) -> dict[str, Any]:
    """The waiting jobs at each bucket's end as an area under a line, for an inline SVG."""
    top = max([*data.waiting, 1])
    slot, bar_width = _slots(data, width)
    points = [
        (round((i + 1) * slot, 2), round(height - height * n / top, 2))
        for i, n in enumerate(data.waiting)
    ]
    if points:
        points.insert(0, (0.0, points[0][1]))
    line = " ".join(f"{x},{y}" for x, y in points)
    slots = [
        {
            "x": round(i * slot + 0.5, 2),
            "width": bar_width,
            "label": f"{_when(data, i)}: {n} waiting at the end",
        }
        for i, n in enumerate(data.waiting)
    ]
    return {
        "width": width,
        "height": height,
        "top": top,
        "line": line,
        "area": f"0,{height} {line} {width},{height}" if points else "",
        "now": data.waiting[-1] if data.waiting else 0,
        "peak": max(data.waiting, default=0),
        "slots": slots,
        "svg": Markup(
            "".join(
                f'<g><title>{escape(s["label"])}</title><rect class="slot" x="{s["x"]}" y="0"'
                f' width="{s["width"]}" height="{height}"></rect></g>'
                for s in slots
            )
        ),
    }


# The charts' elements are joined here rather than looped over in the template: a
# day's chart has ~300 of them, and escaping each number in the template cost as much
# as the page's queries. Only the labels are text; everything else is a number.
def _bars_svg(bars: list[Bar], height: int) -> Markup:
    parts = []
    for bar in bars:
        rects = "".join(
            f'<rect class="{kind}" x="{bar.x}" y="{y}" width="{bar.width}" height="{h}"></rect>'
            for kind, y, h in (
                ("completed", bar.completed_y, bar.completed_h),
                ("failed", bar.failed_y, bar.failed_h),
            )
            if h
        )
        parts.append(
            f'<g><title>{escape(bar.label)}</title><rect class="slot" x="{bar.x}" y="0"'
            f' width="{bar.width}" height="{height}"></rect>{rects}</g>'
        )
    return Markup("".join(parts))

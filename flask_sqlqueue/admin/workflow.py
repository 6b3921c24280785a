"""The picture of a workflow on the admin's workflow page: jobs in columns, edges as curves.

A job's column is one past the furthest of its dependencies (the first column holds the
jobs that depend on none in the picture), so every edge points right; within a column
jobs are in id order. The page draws it as an inline SVG, without script or style.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.features.dependencies import Workflow

#: A job's box, and the gaps between columns and rows, in SVG units.
BOX_WIDTH = 190
BOX_HEIGHT = 36
COLUMN_GAP = 60
ROW_GAP = 14
MARGIN = 10


@dataclass(frozen=True, slots=True)
class Node:
    id: int
    task: str | None  # None: the job is gone (purged)
    status: str | None
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    """A curve from a dependency's right side to its dependent's left side."""

    dependency: int
    dependent: int
    path: str


@dataclass(frozen=True, slots=True)
class Picture:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


def columns(flow: Workflow) -> dict[int, int]:
    """Each job's column: 0 for a job with no dependency in the workflow, else one past
    the furthest of its dependencies."""
    before: dict[int, list[int]] = {job_id: [] for job_id in flow.jobs}
    for dependency, dependent in flow.edges:
        before[dependent].append(dependency)
    column: dict[int, int] = {}
    for start in sorted(flow.jobs):
        # Depth first, without recursion: a chain of thousands would pass Python's limit.
        stack = [start]
        while stack:
            job_id = stack[-1]
            if job_id in column:
                stack.pop()
                continue
            missing = [d for d in before[job_id] if d not in column]
            if missing:
                stack.extend(missing)  # the graph has no cycle: each is placed once
                continue
            column[job_id] = 1 + max((column[d] for d in before[job_id]), default=-1)
            stack.pop()
    return column


def draw(flow: Workflow) -> Picture:
    """Where each job and edge of ``flow`` goes in the picture."""
    placed = columns(flow)
    rows: dict[int, int] = {}
    nodes: list[Node] = []
    for job_id in sorted(flow.jobs, key=lambda i: (placed[i], i)):
        col = placed[job_id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        member = flow.jobs[job_id]
        x = MARGIN + col * (BOX_WIDTH + COLUMN_GAP)
        y = MARGIN + row * (BOX_HEIGHT + ROW_GAP)
        task, status = member if member is not None else (None, None)
        nodes.append(Node(job_id, task, status, x, y))
    at = {node.id: node for node in nodes}
    edges = []
    for dependency, dependent in flow.edges:
        a, b = at[dependency], at[dependent]
        x1, y1 = a.x + BOX_WIDTH, a.y + BOX_HEIGHT // 2
        x2, y2 = b.x, b.y + BOX_HEIGHT // 2
        bend = (x2 - x1) // 2
        path = f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
        edges.append(Edge(dependency, dependent, path))
    width = MARGIN * 2 + (max(placed.values(), default=0) + 1) * (BOX_WIDTH + COLUMN_GAP)
    height = MARGIN * 2 + max(rows.values(), default=1) * (BOX_HEIGHT + ROW_GAP)
    return Picture(nodes, edges, width - COLUMN_GAP, height - ROW_GAP)

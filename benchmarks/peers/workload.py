"""The job every system runs, and how the harness counts the jobs that ran.

The task is ``write(i: int, email: str)``, called with keyword arguments: it appends the
line ``f"{i} {email}\\n"`` to the file ``$BENCH_OUTPUT`` names (one file per measurement).
A real small job, the same in every system, whose effect the harness can read without
asking any system's store: Huey at its defaults records nothing of a finished task, so
finished jobs are the lines of that file, for every system alike.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import BinaryIO

from .common import BenchError

OUTPUT = "BENCH_OUTPUT"


def email_of(i: int) -> str:
    """The ``email`` argument of job ``i``."""
    return f"user{i}@example.com"


def write(i: int, email: str) -> None:
    """Append one line to the measurement's output file: open, write, close, as a small
    job that leaves a trace would. Appends of one short line do not interleave."""
    with open(os.environ[OUTPUT], "a") as out:
        out.write(f"{i} {email}\n")


class Output:
    """One measurement's output file, counted as it grows: the reader keeps its place, so
    each count reads only the bytes appended since the last one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()
        self._file: BinaryIO | None = None  # opened at the first count
        self._lines = 0

    def count(self) -> int:
        """Lines written so far: the jobs finished."""
        if self._file is None:
            self._file = open(self.path, "rb")
        self._lines += self._file.read().count(b"\n")
        return self._lines

    def check(self, enqueued: int, *, complete: bool = True) -> None:
        """Every line is one of the jobs ``0 .. enqueued - 1``, with its own email, and no
        job ran twice; with ``complete``, every job ran. A wrong file is an error, so a
        figure never stands on jobs that were lost or run twice."""
        lines = self.path.read_bytes().decode().splitlines()
        seen: Counter[int] = Counter()
        for line in lines:
            i_text, _, email = line.partition(" ")
            if not i_text.isdigit() or email != email_of(int(i_text)):
                raise BenchError(f"{self.path.name}: a line that no job writes: {line!r}")
            seen[int(i_text)] += 1
        twice = sorted(i for i, n in seen.items() if n > 1)
        if twice:
            raise BenchError(f"{len(twice)} job(s) ran more than once (i = {twice[:5]})")
        unknown = sorted(i for i in seen if i >= enqueued)
        if unknown:
            raise BenchError(f"lines for jobs never enqueued (i = {unknown[:5]})")
        if complete and len(seen) != enqueued:
            missing = sorted(set(range(enqueued)) - set(seen))
            raise BenchError(
                f"{len(seen)} distinct jobs in the file of {enqueued} enqueued "
                f"(missing i = {missing[:5]})"
            )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

"""Benchmarks and the chaos suite (``python -m benchmarks.chaos --help``)."""

from __future__ import annotations

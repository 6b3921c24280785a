"""Benchmarks and the chaos suite (``python benchmarks/chaos.py --help``)."""

from __future__ import annotations

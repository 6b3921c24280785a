"""The dependency range pyproject.toml claims is the one `make test-lowest` tests: each
direct dependency's lower bound is pinned in constraints-lowest.txt, and nothing else."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def lower_bounds() -> dict[str, Version]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        (lowest,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        bounds[canonicalize_name(requirement.name)] = Version(lowest)
    return bounds


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "constraints-lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            found[canonicalize_name(name)] = Version(version)
    return found


def test_every_direct_dependency_is_pinned_at_its_lower_bound() -> None:
    assert pins() == lower_bounds()


def test_the_ci_runs_the_lowest_versions() -> None:
    assert "make test-lowest" in (ROOT / ".ci" / "run").read_text()

"""The documentation site builds with no warning, and its references cover the code.

``make docs`` builds the site with ``mkdocs build --strict``; this builds it the same way
in ``make test``, so a broken link, a page missing from the nav, a docstring the API
reference cannot render or a config key the reference lacks fails the suite.
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from flask_sqlqueue import config
from flask_sqlqueue.cli import queue_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("the docs tools are missing: pip install -e '.[dev,docs]' (make test does)")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    output = build.stdout + build.stderr
    assert build.returncode == 0, output
    assert "WARNING" not in output, output
    return out


def _text(page: Path) -> str:
    """A built page's text, tags dropped and entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _commands(group: click.Group, path: str) -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append((f"{path} {name}", command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{path} {name}")
    return found


def test_the_site_builds_without_a_warning(site: Path) -> None:
    assert (site / "index.html").is_file()
    # The API reference was rendered from the docstrings, not left as a directive.
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "::: flask_sqlqueue" not in api
    assert "enqueue_many" in api


def test_every_cli_command_and_option_is_in_the_reference(site: Path) -> None:
    text = _text(site / "reference" / "cli" / "index.html")
    for full, command in _commands(queue_cli, "flask queue"):
        assert full in text, full
        for param in command.params:
            if isinstance(param, click.Option):
                for opt in param.opts:
                    assert opt in text, f"{full} {opt}"


def test_every_config_key_is_in_the_reference(site: Path) -> None:
    text = _text(site / "reference" / "configuration" / "index.html")
    missing = [key for key in config.KEYS if key not in text]
    assert not missing, missing


def test_the_readme_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]


def test_the_project_files_exist() -> None:
    for name in ["LICENSE", "CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md"]:
        assert (ROOT / name).read_text().strip(), name
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_no_page_sends_readers_to_a_readme_section_that_is_not_there() -> None:
    """The README is two commands and a tour: a page that points into it names one of
    its sections, which must exist; "see the README" with no section says nothing."""
    sections = {
        line.removeprefix("## ").strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("## ")
    }
    wrong = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"README(?:'s)?,? *\"([^\"]+)\"", text):
            if match.group(1) not in sections:
                wrong.append(f"{page.relative_to(ROOT)}: README section {match.group(1)!r}")
        for match in re.finditer(r"(?:see|in|as) the README\b(?!'s \")", text):
            wrong.append(f"{page.relative_to(ROOT)}: {match.group(0)!r} names no section")
    assert wrong == [], "\n".join(wrong)

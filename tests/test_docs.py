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

import flask_sqlqueue
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
    return _untagged(page.read_text())


def _untagged(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


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


def _console_sample(page: str, command: str) -> list[str]:
    """The lines a ``console`` block of docs/``page`` shows ``$ command`` printing."""
    text = (ROOT / "docs" / page).read_text()
    for block in re.findall(r"```console\n(.*?)```", text, re.DOTALL):
        lines = block.splitlines()
        if f"$ {command}" in lines:
            start = lines.index(f"$ {command}") + 1
            after = [i for i, line in enumerate(lines) if i >= start and line.startswith("$ ")]
            return lines[start : after[0] if after else len(lines)]
    pytest.fail(f"docs/{page} no longer shows `$ {command}`")


def _shape(lines: list[str]) -> list[str]:
    """Lines with their numbers as ``N`` and their spacing as one space: what a sample
    must share with real output whose counts, ages and ids differ."""
    return [re.sub(r"\d+", "N", " ".join(line.split())) for line in lines]


def test_the_tutorials_status_sample_is_what_the_command_prints(tmp_path: Path) -> None:
    """The tutorial's app, in a folder of its own with a real SQLite queue, one job
    enqueued through its own route: ``flask queue status`` prints the lines the tutorial
    shows, warnings (stderr) where a terminal shows them."""
    page = (ROOT / "docs" / "tutorial.md").read_text()
    shop = page.split("Save this as `shop.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "shop.py").write_text(shop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "SQLQUEUE_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout
        return done.stdout

    command = "flask --app shop queue status"
    run("-m", "flask", "--app", "shop", "queue", "db", "upgrade")
    run("-c", "import shop; shop.create_app().test_client().post('/count', data={'text': 'a b'})")
    printed = run("-m", *command.split()).splitlines()
    assert _shape(_console_sample("tutorial.md", command)) == _shape(printed)


def test_the_api_reference_leaves_no_rst_literal_marker(site: Path) -> None:
    """Docstrings are Sphinx-style: the ``::`` that opens a literal block is markup, and
    must not be left in the prose around the code it introduced."""
    page = (site / "reference" / "api" / "index.html").read_text()
    prose = _untagged(re.sub(r"<pre\b.*?</pre>|<code\b.*?</code>", "", page, flags=re.DOTALL))
    stray = [
        " ".join(prose[max(0, m.start() - 60) : m.end()].split()) for m in re.finditer("::", prose)
    ]
    assert stray == [], "\n".join(stray)


def test_the_api_reference_names_no_internal_base_class(site: Path) -> None:
    """A class's bases name only what a reader can import or find on the page
    (``flask_sqlqueue.__all__``, or a class documented there), never an internal one."""
    page = (site / "reference" / "api" / "index.html").read_text()
    documented = set(re.findall(r'id="([\w.]+)"', page))
    internal = []
    for bases in re.findall(r"Bases: (.*?)</p>", page, re.DOTALL):
        top = re.sub(r"\[.*?\]", "", bases)  # Generic[P, R]: the base, not its parameters
        titles = {name: title for title, name in re.findall(r'<span title="([^"]+)">([^<]+)<', top)}
        for name in (n.strip() for n in _untagged(top).split(",")):
            title = titles.get(name, name)
            ours = title.startswith("flask_sqlqueue.")
            if (
                name.startswith("_")
                or "._" in title
                or (ours and name not in flask_sqlqueue.__all__ and title not in documented)
            ):
                internal.append(title)
    assert internal == []


#: The rule that keeps each key of the configuration table on one line.
KEYS_COLUMN = ".config-keys td:first-child code"


def test_the_configuration_tables_keys_never_break(site: Path) -> None:
    """A narrow column must not break ``SQLQUEUE_INLINE_PAYLOAD_LIMIT`` mid-word: the
    table sits in a ``config-keys`` block, and a stylesheet the page loads keeps the
    code of its first column on one line (Material's own rule lets code break anywhere)."""
    page = (site / "reference" / "configuration" / "index.html").read_text()
    block = re.search(r'<div class="config-keys">\s*<table>(.*?)</table>', page, re.DOTALL)
    assert block, "the keys table is not in a config-keys block"
    first = re.findall(r"<tr>\s*<td>(.*?)</td>", block.group(1), re.DOTALL)
    assert sorted(re.sub(r"</?code>", "", cell) for cell in first) == sorted(config.KEYS)
    sheets = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    here = site / "reference" / "configuration"
    css = "".join((here / href).read_text() for href in sheets if "//" not in href)
    rule = re.search(re.escape(KEYS_COLUMN) + r"\s*\{([^}]*)\}", css)
    assert rule, f"no stylesheet of the page has a rule for {KEYS_COLUMN}"
    declared = {
        k.strip(): v.strip()
        for k, v in (d.split(":", 1) for d in rule.group(1).split(";") if d.strip())
    }
    assert declared.get("white-space") == "nowrap", declared
    assert declared.get("word-break") == "keep-all", declared


def test_the_tutorials_retry_step_does_not_leave_the_reader_waiting() -> None:
    """The failure step says how to skip the backoff rather than wait a minute for it,
    and every ``flask queue`` command the tutorial names is a real one."""
    page = (ROOT / "docs" / "tutorial.md").read_text()
    step = page.split("## 7. When a task fails", 1)[1].split("\n## ", 1)[0]
    assert "flask --app shop queue run-now" in step
    names = {full.removeprefix("flask queue ") for full, _ in _commands(queue_cli, "flask queue")}
    used = re.findall(r"flask --app shop queue\s+([a-z-]+(?: [a-z-]+)?)", page)
    unknown = [u for u in used if u not in names and u.split()[0] not in names]
    assert used and unknown == [], unknown

"""MkDocs hook: the reference pages are generated from the code, or checked against it.

- ``<!-- cli-reference -->`` in a page becomes the reference of every ``flask queue``
  command, read from the click commands themselves (usage, arguments, options with
  their defaults, help), so it cannot go stale.
- The docstrings' Sphinx roles (``:class:`Job```, ``:meth:`~Task.using```), which
  mkdocstrings leaves as text, become plain code in the rendered pages.
- The ``::`` that opens a docstring's literal block, which mkdocstrings also leaves as
  text (the indented block itself renders as code), goes as reStructuredText says: a
  paragraph of ``::`` alone is dropped, ``example::`` shows as ``example:``.
- The configuration page must name every key of ``flask_sqlqueue.config.KEYS``; a key
  it lacks is a warning (an error with ``--strict``).
"""

from __future__ import annotations

import html
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

import click

# The checkout's package, whichever one the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from flask_sqlqueue import config as queue_config
from flask_sqlqueue.cli import queue_cli

log = logging.getLogger("mkdocs.hooks.reference")

MARKER = "<!-- cli-reference -->"
# A role before a code span, and the "~" that asks Sphinx to show the last name only.
_ROLE = re.compile(r":(?:class|meth|func|data|attr|exc|mod|obj):(<code>)~?")
# A paragraph of "::" alone, and a paragraph's "::" end (" ::" shows nothing, "::" one colon).
_LITERAL_ALONE = re.compile(r"<p>::</p>\n?")
_LITERAL_END = re.compile(r"( ?)::</p>")
CONFIG_PAGE = "reference/configuration.md"


def commands(
    group: click.Group = queue_cli, path: str = "flask queue"
) -> list[tuple[str, click.Command]]:
    """Every command under ``group``, depth first in name order, with its full name."""
    found: list[tuple[str, click.Command]] = []
    for name in sorted(group.commands):
        command = group.commands[name]
        full = f"{path} {name}"
        found.append((full, command))
        if isinstance(command, click.Group):
            found += commands(command, full)
    return found


def _cell(text: str) -> str:
    """Text for a Markdown table cell: escaped, on one line, no stray pipes."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _command_section(full: str, command: click.Command) -> str:
    context = click.Context(command, info_name=full)
    usage = " ".join(command.collect_usage_pieces(context))
    lines = [f"### `{full}`", "", "```text", f"{full} {usage}".rstrip(), "```", ""]
    for paragraph in inspect.cleandoc(command.help or "").split("\n\n"):
        if paragraph.startswith("\b\n"):  # click's "keep as written": a block of text
            lines += ["```text", inspect.cleandoc(paragraph[2:]), "```", ""]
        elif paragraph.strip():
            lines += [paragraph, ""]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    options = [p for p in command.params if isinstance(p, click.Option)]
    if arguments:
        lines += ["| argument | required | repeatable |", "|---|---|---|"]
        for argument in arguments:
            required = "yes" if argument.required else "no"
            repeatable = "yes" if argument.nargs == -1 else "no"
            name = _cell(argument.human_readable_name)
            lines.append(f"| `{name}` | {required} | {repeatable} |")
        lines.append("")
    if options:
        lines += ["| option | meaning |", "|---|---|"]
        for option in options:
            record = option.get_help_record(context)
            if record is None:
                continue
            names, meaning = record
            # A pipe in a code span does not split a cell: names stay as click prints them.
            lines.append(f"| `{names}` | {_cell(meaning)} |")
        lines.append("")
    if isinstance(command, click.Group):
        subcommands = ", ".join(f"`{name}`" for name in sorted(command.commands))
        lines += [f"Commands: {subcommands}.", ""]
    return "\n".join(lines)


def cli_reference() -> str:
    """The Markdown of every ``flask queue`` command."""
    return "\n".join(_command_section(full, command) for full, command in commands())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if page.file.src_uri == CONFIG_PAGE:
        for key in queue_config.KEYS:
            if f"`{key}`" not in markdown:
                log.warning("%s does not document the config key %s", CONFIG_PAGE, key)
    return markdown


def on_page_content(html_text: str, page: Any, config: Any, files: Any) -> str:
    html_text = _LITERAL_ALONE.sub("", html_text)
    html_text = _LITERAL_END.sub(lambda m: "</p>" if m.group(1) else ":</p>", html_text)
    return _ROLE.sub(r"\1", html_text)

"""MkDocs hook: repository files outside ``docs/`` join the site under ``repo/``.

The pages link to files of the repository as they would on a code host
(``../benchmarks/results/peers.md``, ``../tests/test_x.py``), and ``CHANGELOG.md``,
``SECURITY.md`` and ``CONTRIBUTING.md`` live at the top of the repository where people
look for them. This hook adds each such file to the site once, at ``repo/<its path>``
(a Markdown file as a page, any other file as it is), and rewrites the links of every
page to reach it there. So the same Markdown reads right in the repository and in the
site, and a link to a file that does not exist is still a warning (an error with
``--strict``).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File
from mkdocs.structure.files import Files

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "repo/"
# Always in the site, linked or not: the nav names them.
ALWAYS = ["CHANGELOG.md", "SECURITY.md", "CONTRIBUTING.md", "LICENSE"]
ALWAYS_GLOBS = ["benchmarks/results/*.md"]
# [text](target) and [text](target "title"); a target in <...> is left alone.
_LINK = re.compile(r"(\]\()([^)<>\s]+)((?:\s+\"[^\"]*\")?\))")
_FENCE = re.compile(r"^(```|~~~)")


def _repo_path(src_uri: str) -> str:
    """Where a page of the site lives in the repository."""
    if src_uri.startswith(PREFIX):
        return src_uri[len(PREFIX) :]
    return f"docs/{src_uri}"


def _site_path(repo_path: str) -> str:
    """Where a file of the repository lives in the site."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/") :]
    return PREFIX + ("LICENSE.md" if repo_path == "LICENSE" else repo_path)


def _is_relative(target: str) -> bool:
    return not (
        target.startswith(("#", "/", "mailto:")) or re.match(r"^[a-z][a-z0-9+.-]*:", target)
    )


def _outside_links(text: str, page_repo_path: str) -> list[str]:
    """The repository paths outside docs/ that ``text`` links to, and that exist."""
    found = []
    for target in _targets(text):
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo_path), target))
        if not path.startswith(("docs/", "../")) and (ROOT / path).is_file():
            found.append(path)
    return found


def _targets(text: str) -> list[str]:
    targets = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if not in_fence:
            for match in _LINK.finditer(line):
                target = match.group(2).split("#", 1)[0]
                if target and _is_relative(match.group(2)):
                    targets.append(target)
    return targets


def _content(repo_path: str) -> str:
    text = (ROOT / repo_path).read_text(encoding="utf-8")
    if repo_path == "LICENSE":
        return f"# License\n\n```text\n{text}```\n"
    return text


def on_files(files: Files, config: Any) -> Files:
    wanted = list(ALWAYS)
    for pattern in ALWAYS_GLOBS:
        wanted += sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(pattern))
    pending = list(wanted)
    for file in files.documentation_pages():
        pending += _outside_links(Path(file.abs_src_path or "").read_text(), f"docs/{file.src_uri}")
    seen: set[str] = set()
    while pending:
        repo_path = pending.pop()
        if repo_path in seen:
            continue
        seen.add(repo_path)
        site_path = _site_path(repo_path)
        if repo_path.endswith(".md") or repo_path == "LICENSE":
            content = _content(repo_path)
            pending += _outside_links(content, repo_path)
            files.append(File.generated(config, site_path, content=content))
        else:
            files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    page_repo = _repo_path(page.file.src_uri)
    page_dir = posixpath.dirname(page.file.src_uri)
    lines = []
    in_fence = False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            in_fence = not in_fence
        if not in_fence:
            line = _LINK.sub(lambda m: _rewrite(m, page_repo, page_dir), line)
        lines.append(line)
    return "".join(lines)


def _rewrite(match: re.Match[str], page_repo: str, page_dir: str) -> str:
    target = match.group(2)
    if not _is_relative(target):
        return match.group(0)
    path, _, anchor = target.partition("#")
    if not path:
        return match.group(0)
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if repo_path.startswith("../") or not (ROOT / repo_path).exists():
        return match.group(0)  # left for MkDocs to report
    new = posixpath.relpath(_site_path(repo_path), page_dir or ".")
    return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

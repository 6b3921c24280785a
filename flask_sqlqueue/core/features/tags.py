"""Tags and metadata of jobs (docs/tags.md): their checks, how they are stored, the tag
filter of the job lists, and deleting them with their jobs.

A job's tags are kept twice, on purpose. Its row holds them as a JSON list
(``sqlqueue_jobs.tags``, with its metadata in ``sqlqueue_jobs.meta``), so reading a job
reads them with no join. ``sqlqueue_job_tags`` holds one row per tag, indexed by tag:
a list filtered by tag reads a tag's jobs through that index, on every database, and a
tag matches only itself (equality, never ``LIKE``: no wildcard, no prefix, exact case).
Tags never change once written, so the two cannot drift apart.

A job without tags writes nothing more than before: the same row, the same statement
(the columns stay out of it), and no row in ``sqlqueue_job_tags``. A tagged enqueue adds
one INSERT of its tag rows, run for all of them at once, in its transaction. Every
statement that deletes jobs deletes their tag rows in its transaction (:func:`forget`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..models import JobRow
from ..models import job_tags
from ..models import jobs
from ..payload import decode_value
from ..payload import dumps_trusted
from ..payload import encode_value

#: Tags a job may have (its task's and its call's together).
MAX_TAGS = 16
#: Characters of one tag.
MAX_TAG_LENGTH = 64
#: Bytes (UTF-8) of a job's metadata as compact JSON.
MAX_META_BYTES = 4096
_TAG = re.compile(r"[A-Za-z0-9_.:/=+@#%-]+")
#: What a tag may hold, as error messages say it.
TAG_RULE = (
    f"1-{MAX_TAG_LENGTH} characters, each an ASCII letter, a digit or one of _ . : / = + @ # % -"
)


def check_tag(tag: object, what: str = "tag") -> str:
    """``tag`` if it is a valid tag.

    :raises TypeError: it is not a string.
    :raises ValueError: it is empty, too long, or holds a character tags may not have.
    """
    if not isinstance(tag, str):
        raise TypeError(f"{what} {tag!r} is not a string; a tag is {TAG_RULE}.")
    if not 1 <= len(tag) <= MAX_TAG_LENGTH or not _TAG.fullmatch(tag):
        raise ValueError(f"{what} {tag!r} is not a valid tag: use {TAG_RULE}.")
    return tag


def check_tags(tags: object) -> tuple[str, ...] | None:
    """The distinct tags of ``tags`` (a list of strings), in their order; ``None`` if empty.

    :raises TypeError: ``tags`` is a single string or not a list of strings.
    :raises ValueError: a tag is invalid, or there are more than :data:`MAX_TAGS`.
    """
    if isinstance(tags, str | bytes | Mapping) or not isinstance(tags, Iterable):
        raise TypeError(f"tags takes a list of strings, got {tags!r}; pass tags=[tag] for one.")
    found = tuple(dict.fromkeys(check_tag(tag) for tag in tags))
    if len(found) > MAX_TAGS:
        raise ValueError(
            f"{len(found)} distinct tags given; a job has at most {MAX_TAGS} "
            "(its task's tags count too)."
        )
    return found or None


def merge_tags(
    first: tuple[str, ...] | None, then: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """A task's tags and a call's together, each once, the task's first (checked again:
    together they may be too many)."""
    if not first or not then:
        return first or then
    return check_tags((*first, *then))


def check_meta(meta: object) -> dict[str, Any] | None:
    """A copy of ``meta`` (a dict of JSON values that round-trip, as arguments are
    checked); ``None`` if empty.

    :raises TypeError: it is not a dict with string keys, or holds a value that is not JSON.
    :raises ValueError: a value would not round-trip, or it takes more than
        :data:`MAX_META_BYTES` bytes as JSON.
    """
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta takes a dict of JSON values, got {meta!r}.")
    found = dict(meta)
    size = len(encode_value(found, "meta").encode("utf-8"))
    if size > MAX_META_BYTES:
        raise ValueError(
            f"meta takes {size} bytes as JSON, more than the {MAX_META_BYTES} allowed: keep "
            "it to small values (ids, trace context) and pass data as arguments."
        )
    return found or None


def row_values(tags: tuple[str, ...] | None, meta: Mapping[str, Any] | None) -> JobRow:
    """The columns of a new job's row for these tags and metadata: none for none, so
    that the row of a job without them is the same as before (and its statement too)."""
    values: JobRow = {}
    if tags:
        values["tags"] = dumps_trusted(list(tags))
    if meta:
        values["meta"] = dumps_trusted(meta)
    return values


def read_tags(text: str | None) -> list[str]:
    """A row's tags; empty for none, or for text that is not a list (edited by hand)."""
    if text is None:
        return []
    try:
        found = decode_value(text)
    except ValueError:
        return []
    return [str(tag) for tag in found] if isinstance(found, list) else []


def read_meta(text: str | None) -> dict[str, Any]:
    """A row's metadata; empty for none, or for text that is not an object (edited by hand)."""
    if text is None:
        return {}
    try:
        found = decode_value(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def link(conn: Connection, job_ids: Collection[int], tags: tuple[str, ...] | None) -> None:
    """Write the tag rows of new jobs ``job_ids``, each with ``tags``: one statement."""
    if job_ids and tags:
        conn.execute(
            sa.insert(job_tags), [{"job_id": i, "tag": tag} for i in job_ids for tag in tags]
        )


def tagged(tag: str) -> sa.ColumnElement[bool]:
    """The condition on ``sqlqueue_jobs`` for jobs tagged ``tag`` (exactly), read
    through the tag's index."""
    return jobs.c.id.in_(sa.select(job_tags.c.job_id).where(job_tags.c.tag == tag))


def labels(conn: Connection, job_id: int) -> tuple[list[str], dict[str, Any]]:
    """The tags and metadata of one job (empty if it has none or is gone)."""
    row = conn.execute(sa.select(jobs.c.tags, jobs.c.meta).where(jobs.c.id == job_id)).first()
    if row is None:
        return [], {}
    return read_tags(row.tags), read_meta(row.meta)

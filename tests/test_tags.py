"""Tags and metadata of jobs (docs/tags.md), on every backend, with real workers: what a
task and a reader see, the tag filter of the command line and the admin, the refusals,
and the tag rows deleted with their jobs."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from flask_sqlqueue import Call
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import current_job
from flask_sqlqueue.core import actions
from flask_sqlqueue.core import operations
from flask_sqlqueue.core.features import retention
from flask_sqlqueue.core.features.tags import MAX_META_BYTES
from flask_sqlqueue.core.features.tags import MAX_TAGS
from flask_sqlqueue.core.models import job_tags
from flask_sqlqueue.core.models import jobs
from tests.conftest import install_schema
from tests.sample_app import queue_app
from tests.stores import burst
from tests.stores import store_of
from tests.workflow_app import run_doc_example

queue = SQLQueue()


@queue.task(name="tags.echo", tags=["team:billing"])
def echo(value: Any = None) -> dict[str, Any]:
    """Returns what the running job knows of its tags and metadata."""
    return {"value": value, "tags": current_job.tags, "meta": dict(current_job.meta)}


@queue.task(name="tags.isolated", isolate=True)
def isolated() -> dict[str, Any]:
    """As ``echo``, in a child process of the worker."""
    return {"tags": current_job.tags, "meta": dict(current_job.meta)}


@queue.task(name="tags.plain")
def plain(value: Any = None) -> Any:
    return value


@queue.task(name="tags.fails", max_attempts=1)
def fails() -> None:
    raise RuntimeError("always")


@pytest.fixture
def tags_app(database_uri: str, tmp_path: Path) -> Iterator[Flask]:
    if not database_uri.startswith("sqlite"):
        install_schema(database_uri)
    app = queue_app(__name__, queue, {"SQLQUEUE_DATABASE_URI": database_uri})
    app.instance_path = str(tmp_path / "instance")
    app.config["SECRET_KEY"] = "test secret"
    if database_uri.startswith("sqlite"):
        queue.upgrade_database(app=app)
    app.register_blueprint(queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue")
    yield app
    store_of(app).engine.dispose()


def cli(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["queue", *args])


def tag_rows(app: Flask) -> set[tuple[int, str]]:
    with store_of(app).read() as conn:
        return {(i, t) for i, t in conn.execute(sa.select(job_tags.c.job_id, job_tags.c.tag))}


def job_count(app: Flask) -> int:
    with store_of(app).read() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one())


def listed_ids(output: str) -> set[int]:
    """The job ids of ``flask queue list``'s table."""
    return {int(line.split()[0]) for line in output.splitlines() if line.split()[:1] != ["id"]}


def admin_ids(app: Flask, query: str) -> set[int]:
    response = app.test_client().get(f"/queue/jobs?{query}")
    assert response.status_code == 200, response.get_data(as_text=True)
    page = response.get_data(as_text=True)
    return {int(i) for i in re.findall(r'name="ids" value="(\d+)"', page)}


TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": 1}


def test_tags_and_meta_round_trip_through_a_worker(tags_app: Flask) -> None:
    with tags_app.app_context():
        job = echo.using(tags=["eu", "team:billing", "eu"], meta=TRACE).enqueue(7)
        by_name = queue.enqueue("tags.echo", [8], tags=["batch/7"], meta={"source": "cron"})
        bare = plain.enqueue(9)
        child = isolated.using(tags=["child"], meta=TRACE).enqueue()
        # The task's tags first, then the call's, each once.
        assert job.tags == ["team:billing", "eu"] and job.meta == TRACE
        assert by_name.tags == ["team:billing", "batch/7"]
        assert bare.tags == [] and bare.meta == {}
    burst(tags_app)
    with tags_app.app_context():
        done = queue.get_job(job.id)
        assert done is not None and done.status == "completed"
        assert done.result == {"value": 7, "tags": ["team:billing", "eu"], "meta": TRACE}
        assert (done.tags, done.meta) == (["team:billing", "eu"], TRACE)
        other = queue.get_job(by_name.id)
        assert other is not None
        assert other.result["meta"] == {"source": "cron"} == other.meta
        assert queue.get_job(bare.id).tags == []  # type: ignore[union-attr]
        ran = queue.get_job(child.id)
        assert ran is not None and ran.result == {"tags": ["child"], "meta": TRACE}, ran
    # A job without tags writes no tag row.
    assert tag_rows(tags_app) == {
        (job.id, "team:billing"),
        (job.id, "eu"),
        (by_name.id, "team:billing"),
        (by_name.id, "batch/7"),
        (child.id, "child"),
    }


def test_enqueue_many_carries_tags_and_meta(tags_app: Flask) -> None:
    with tags_app.app_context():
        held = plain.using(idempotency_key="held", tags=["first"]).enqueue(0)
        calls = [Call([i]) for i in range(5)]
        calls += [Call([5], idempotency_key="k"), Call([6], idempotency_key="k")]
        calls.append(Call([7], idempotency_key="held"))
        made = plain.using(tags=["bulk", "x"], meta={"run": 3}).enqueue_many(calls)
        named = queue.enqueue_many("tags.plain", [([i], {}) for i in range(3)], tags=["named"])
    new = {job.id for job in made} - {held.id}
    assert len(new) == 6  # five plain calls and one for the repeated key
    assert made[-1].id == held.id and made[-1].tags == ["first"]
    for job in made[:-1]:
        assert (job.tags, job.meta) == (["bulk", "x"], {"run": 3})
    rows = tag_rows(tags_app)
    # The job that already held its key keeps its own tags; each new job is tagged once.
    assert rows == {(held.id, "first")} | {(i, t) for i in new for t in ("bulk", "x")} | {
        (job.id, "named") for job in named
    }
    with tags_app.app_context():
        for job in made[:-1]:
            read = queue.get_job(job.id)
            assert read is not None and (read.tags, read.meta) == (["bulk", "x"], {"run": 3})


BAD_TAGS: list[tuple[Any, type[Exception], str]] = [
    ("eu", TypeError, "tags=[tag]"),
    ([""], ValueError, "not a valid tag"),
    (["two words"], ValueError, "not a valid tag"),
    (["a,b"], ValueError, "not a valid tag"),
    (["x" * 65], ValueError, "1-64 characters"),
    (["caf\u00e9"], ValueError, "ASCII"),
    (["nul\x00"], ValueError, "not a valid tag"),
    ([7], TypeError, "not a string"),
    ([f"t{i}" for i in range(MAX_TAGS)], ValueError, "at most 16"),  # with the task's
]
BAD_META: list[tuple[Any, type[Exception], str]] = [
    ([("a", 1)], TypeError, "dict"),
    ({"x": math.nan}, ValueError, "finite"),
    ({"x": "nul\x00"}, ValueError, "NUL"),
    ({1: "a"}, TypeError, "key"),
    ({"x": object()}, TypeError, "not JSON"),
    ({"x": (1, 2)}, TypeError, "tuple"),
    ({"x": "y" * MAX_META_BYTES}, ValueError, f"{MAX_META_BYTES} allowed"),
]


@pytest.mark.parametrize(("tags", "error", "says"), BAD_TAGS)
def test_bad_tags_are_refused_and_nothing_is_written(
    tags_app: Flask, tags: Any, error: type[Exception], says: str
) -> None:
    with tags_app.app_context():
        with pytest.raises(error, match=re.escape(says)):
            echo.using(tags=tags).enqueue(1)
        with pytest.raises(error, match=re.escape(says)):
            queue.enqueue("tags.echo", [1], tags=tags)
        with pytest.raises(error, match=re.escape(says)):
            queue.enqueue_many("tags.echo", [([1], {})], tags=tags)
    assert job_count(tags_app) == 0 and tag_rows(tags_app) == set()


@pytest.mark.parametrize(("meta", "error", "says"), BAD_META)
def test_bad_meta_is_refused_and_nothing_is_written(
    tags_app: Flask, meta: Any, error: type[Exception], says: str
) -> None:
    with tags_app.app_context():
        with pytest.raises(error, match=re.escape(says)):
            echo.using(meta=meta).enqueue(1)
        with pytest.raises(error, match=re.escape(says)):
            queue.enqueue("tags.echo", [1], meta=meta)
    assert job_count(tags_app) == 0


def test_a_task_with_bad_tags_is_refused_at_its_declaration() -> None:
    other = SQLQueue()
    with pytest.raises(ValueError, match="not a valid tag"):

        @other.task(name="tags.bad", tags=["no spaces"])
        def bad() -> None: ...

    assert "tags.bad" not in other.registry


# Each a tag that another is a prefix, a substring or a LIKE pattern of.
TAGGED = ["a", "ab", "AB", "abc", "a_c", "a%", "xa"]


def _tag_each(app: Flask) -> dict[str, int]:
    with app.app_context():
        ids = {tag: plain.using(tags=[tag, "all"]).enqueue().id for tag in TAGGED}
        plain.enqueue()  # untagged
    return ids


def test_the_command_line_filters_by_exact_tag(tags_app: Flask) -> None:
    ids = _tag_each(tags_app)
    for tag, job_id in ids.items():
        done = cli(tags_app, "list", "--tag", tag)
        assert done.exit_code == 0, done.output
        assert listed_ids(done.output) == {job_id}, (tag, done.output)
        header, *lines = done.output.splitlines()
        assert header.split()[-1] == "tags" and lines[0].split()[-1] == f"{tag},all"
    assert listed_ids(cli(tags_app, "list", "--tag", "all").output) == set(ids.values())
    assert cli(tags_app, "list", "--tag", "b").output.strip() == "No jobs match."
    with_status = cli(tags_app, "list", "--tag", "ab", "--status", "dead")
    assert with_status.output.strip() == "No jobs match."
    bad = cli(tags_app, "list", "--tag", "two words")
    assert bad.exit_code != 0 and "not a valid tag" in bad.output


def test_the_admin_filters_by_exact_tag_and_shows_tags(tags_app: Flask) -> None:
    ids = _tag_each(tags_app)
    for tag, job_id in ids.items():
        assert admin_ids(tags_app, f"tag={tag.replace('%', '%25')}") == {job_id}, tag
    assert admin_ids(tags_app, "tag=all") == set(ids.values())
    assert admin_ids(tags_app, "tag=all&status=pending&per_page=3") == set(
        sorted(ids.values())[-3:]
    )
    older = admin_ids(tags_app, f"tag=all&before={ids['abc']}")
    assert older == {ids["a"], ids["ab"], ids["AB"]}
    assert admin_ids(tags_app, "tag=all&status=dead") == set()
    assert admin_ids(tags_app, "tag=zz") == set()
    page = tags_app.test_client().get("/queue/jobs?tag=a_c").get_data(as_text=True)
    assert 'class="tag" href="/queue/jobs?tag=a_c">a_c</a>' in page
    bad = tags_app.test_client().get("/queue/jobs?tag=two+words")
    assert bad.status_code == 400 and "not a valid tag" in bad.get_data(as_text=True)


def test_show_and_the_job_page_give_tags_and_meta(tags_app: Flask) -> None:
    with tags_app.app_context():
        job = echo.using(tags=["x"], meta={"note": "<script>"}).enqueue()
        bare = plain.enqueue()
    shown = cli(tags_app, "show", str(job.id)).output
    assert re.search(r"^tags\s+team:billing, x$", shown, re.MULTILINE), shown
    assert 'meta:\n  {\n    "note": "<script>"\n  }' in shown
    assert re.search(r"^tags\s+-$", cli(tags_app, "show", str(bare.id)).output, re.MULTILINE)
    page = tags_app.test_client().get(f"/queue/jobs/{job.id}").get_data(as_text=True)
    assert 'href="/queue/jobs?tag=team:billing">team:billing</a>' in page
    assert "&#34;note&#34;: &#34;&lt;script&gt;&#34;" in page  # escaped
    assert "<script>" not in page.split('id="sqlqueue-meta"')[1].split("</dd>")[0]


def test_the_command_line_enqueues_with_tags_and_meta(tags_app: Flask) -> None:
    done = cli(
        tags_app, "enqueue", "tags.echo", "--args", "[1]", "--tag", "cli", "--tag", "ops",
        "--meta", '{"by": "ops"}',
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    with tags_app.app_context():
        (job,) = [queue.get_job(i) for i, _ in tag_rows(tags_app) if _ == "cli"]
        assert job is not None
        assert (job.tags, job.meta) == (["team:billing", "cli", "ops"], {"by": "ops"})
    for args, says in [
        (["--tag", "a b"], "not a valid tag"),
        (["--meta", "[1]"], "--meta must be a JSON object"),
        (["--meta", "{"], "--meta is not valid JSON"),
    ]:
        refused = cli(tags_app, "enqueue", "tags.echo", *args)
        assert refused.exit_code != 0 and says in refused.output, refused.output
    assert job_count(tags_app) == 1


def test_replaying_dead_jobs_by_tag_replays_only_those(tags_app: Flask) -> None:
    with tags_app.app_context():
        mine = [fails.using(tags=["mine"]).enqueue() for _ in range(2)]
        other = fails.enqueue()
    burst(tags_app)
    client = tags_app.test_client()
    confirm = client.get("/queue/jobs/retry-dead?tag=mine").get_data(as_text=True)
    assert '<strong class="count">2</strong>' in confirm
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', confirm)
    assert token is not None
    client.post("/queue/jobs/retry-dead", data={"tag": "mine", "csrf_token": token.group(1)})
    with tags_app.app_context():
        assert [queue.get_job(j.id).status for j in mine] == ["pending", "pending"]  # type: ignore[union-attr]
        assert queue.get_job(other.id).status == "dead"  # type: ignore[union-attr]
    done = cli(tags_app, "retry", "--dead", "--tag", "nobody")
    assert done.exit_code == 0 and "Replayed 0 job(s)." in done.output


def test_purge_delete_and_retention_remove_the_tag_rows(tags_app: Flask) -> None:
    store = store_of(tags_app)
    with tags_app.app_context():
        purged = plain.using(tags=["p"]).enqueue()
        pruned = fails.using(tags=["r"]).enqueue()
        deleted = plain.using(tags=["d"], delay=3600).enqueue()
        kept = plain.using(tags=["k"], delay=3600).enqueue()
    burst(tags_app)  # purged completes, pruned goes dead
    later = store.now() + timedelta(days=1)
    with store.write() as conn:
        assert retention.prune_jobs_batch(conn, "dead", later, 10) == 1
    assert {tag for _, tag in tag_rows(tags_app)} == {"p", "d", "k"}
    with store.write() as conn:
        assert actions.purge(conn, "completed", later) == 1
    assert {tag for _, tag in tag_rows(tags_app)} == {"d", "k"}
    assert operations.delete(store, [deleted.id]) == 1
    assert tag_rows(tags_app) == {(kept.id, "k")}
    with tags_app.app_context():
        assert [queue.get_job(i) for i in (purged.id, pruned.id, deleted.id)] == [None] * 3


def test_the_example_of_the_docs_runs(tmp_path: Path) -> None:
    assert run_doc_example(tmp_path, "tags_demo.py", "tags.md") == [
        "['reports', 'customer:42'] {'asked_by': 'ops'}",
        "{'customer': 42, 'asked_by': 'ops'}",
    ]


@queue.task(name="tags.expiring", tags=["short-lived"], expires=3600)
def expiring() -> None: ...


def test_a_tasks_default_tags_and_expiry_both_apply(tags_app: Flask) -> None:
    """Each of the task's defaults reaches its jobs, none replacing another."""
    with tags_app.app_context():
        job = expiring.using(tags=["extra"]).enqueue()
        stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.tags == ["short-lived", "extra"]
    assert stored.expires_at is not None
    assert 3590 <= (stored.expires_at - stored.created_at).total_seconds() <= 3610

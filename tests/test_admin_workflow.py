"""The admin's workflow page: the jobs joined by dependencies, as a picture and a table,
and the dependencies on a job's own page."""

from __future__ import annotations

import re
from typing import Any

from flask import Flask

from flask_sqlqueue.admin.workflow import columns
from flask_sqlqueue.admin.workflow import draw
from flask_sqlqueue.core.features import dependencies
from flask_sqlqueue.core.features.dependencies import Workflow
from tests import sample_app
from tests.conftest import query

NODE = re.compile(r'<a href="[^"]*/jobs/(\d+)" class="node status-(\w+)')


def _admin(make_app: Any) -> Flask:
    app = make_app()
    app.secret_key = "test secret"
    app.register_blueprint(sample_app.queue.admin_blueprint(authorize=lambda: True))
    return app


def _diamond(app: Flask) -> tuple[int, int, int, int, int]:
    """a; b and c after a; d after b and c; and e, on its own workflow."""
    add = sample_app.add
    with app.app_context():
        a = add.enqueue(1, 1)
        b = add.using(depends_on=[a]).enqueue(1, 2)
        c = add.using(depends_on=[a.id]).enqueue(1, 3)
        d = add.using(depends_on=[b, c]).enqueue(1, 4)
        e = add.enqueue(1, 5)
    return a.id, b.id, c.id, d.id, e.id


def test_the_workflow_page_draws_every_member_after_its_dependencies(make_app: Any) -> None:
    app = _admin(make_app)
    a, b, c, d, e = _diamond(app)
    page = app.test_client().get(f"/jobs/{b}/workflow")
    assert page.status_code == 200
    body = page.get_data(as_text=True)
    drawn = dict(NODE.findall(body))
    assert drawn == {str(a): "pending", str(b): "waiting", str(c): "waiting", str(d): "waiting"}
    assert body.count('class="edge"') == 4 and str(e) not in drawn
    assert "4 jobs:" in body and 'class="node status-waiting current"' in body
    # The table lists what each member depends on.
    row = re.search(rf'/jobs/{d}">{d}</a></td>.*?</tr>', body, re.S)
    assert (
        row and f'/jobs/{b}">{b}</a>, <a' in row.group(0) and f'/jobs/{c}">{c}</a>' in row.group(0)
    )

    sample_app.queue.worker(app=app).run(burst=True)  # the whole diamond runs, in order
    drawn = dict(NODE.findall(app.test_client().get(f"/jobs/{a}/workflow").get_data(as_text=True)))
    assert set(drawn.values()) == {"completed"} and len(drawn) == 4


def test_the_job_page_lists_dependencies_and_dependents(make_app: Any) -> None:
    app = _admin(make_app)
    _a, b, c, d, e = _diamond(app)
    client = app.test_client()
    body = client.get(f"/jobs/{d}").get_data(as_text=True)
    section = body[body.index('id="sqlqueue-dependencies"') :]
    section = section[: section.index("</section>")]
    assert f'/jobs/{b}">{b}</a> <span class="badge status-waiting">' in section
    assert f'/jobs/{c}">{c}</a>' in section and f"/jobs/{d}/workflow" in section
    lone = client.get(f"/jobs/{e}").get_data(as_text=True)
    assert 'id="sqlqueue-dependencies"' not in lone
    alone = client.get(f"/jobs/{e}/workflow").get_data(as_text=True)
    assert f"Job {e} has no dependencies and no dependents." in alone
    assert client.get("/jobs/999999/workflow").status_code == 404


def test_a_purged_dependency_is_drawn_as_gone(make_app: Any, database_uri: str) -> None:
    app = _admin(make_app)
    a, _b, _c, _d, _e = _diamond(app)
    with app.app_context():
        done = sample_app.add.enqueue(2, 2)
        after = sample_app.add.using(depends_on=[done, a]).enqueue(2, 3)
    query(database_uri, "DELETE FROM sqlqueue_jobs WHERE id = :i", i=done.id)  # as a purge
    body = app.test_client().get(f"/jobs/{after.id}/workflow").get_data(as_text=True)
    assert dict(NODE.findall(body))[str(done.id)] == "gone"
    assert "(purged)" in body


def test_the_walk_stops_at_its_limit(make_app: Any) -> None:
    app = make_app()
    with app.app_context():
        first = sample_app.add.enqueue(0, 0)
        for i in range(5):
            sample_app.add.using(depends_on=[first]).enqueue(i, i)
    store = app.extensions["sqlqueue"].store
    with store.read() as conn:
        flow = dependencies.workflow(conn, first.id, most=3)
        whole = dependencies.workflow(conn, first.id)
    assert flow.partial and len(flow.jobs) == 3 and first.id in flow.jobs
    assert all(a in flow.jobs and b in flow.jobs for a, b in flow.edges)
    assert not whole.partial and len(whole.jobs) == 6 and len(whole.edges) == 5


def test_columns_put_each_job_one_past_its_furthest_dependency() -> None:
    # 1 -> 2 -> 4, 1 -> 3 -> 4, 3 -> 5; and 6 alone.
    edges = [(1, 2), (1, 3), (2, 4), (3, 4), (3, 5), (4, 5)]
    flow = Workflow({i: ("t", "waiting") for i in range(1, 7)}, edges, False)
    assert columns(flow) == {1: 0, 2: 1, 3: 1, 4: 2, 5: 3, 6: 0}
    picture = draw(flow)
    x = {node.id: node.x for node in picture.nodes}
    assert all(x[a] < x[b] for a, b in edges)  # every edge points right
    assert len({(node.x, node.y) for node in picture.nodes}) == 6  # no two boxes overlap


def test_a_long_chain_is_placed_without_recursion() -> None:
    n = 5_000
    flow = Workflow(
        {i: ("t", "waiting") for i in range(n)}, [(i, i + 1) for i in range(n - 1)], False
    )
    assert columns(flow)[n - 1] == n - 1

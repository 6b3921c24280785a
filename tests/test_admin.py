"""The admin blueprint through Flask's test client, on a real database per backend."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from datetime import datetime
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from flask_sqlqueue.core import charts
from flask_sqlqueue.core import models
from flask_sqlqueue.core import queries
from flask_sqlqueue.core import roster
from flask_sqlqueue.core.models import utcnow
from tests import sample_app
from tests.conftest import query

XSS = ["<script>alert(1)</script>", "\"'><img src=x onerror=alert(1)>"]
TOKEN = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
IDS = re.compile(r'name="ids" value="(\d+)"')
ACTIONS = ("retry", "cancel", "delete")


def read(response: Any) -> Any:
    """Buffer the body and close the response (static files are streamed from disk)."""
    response.get_data()
    response.close()
    return response


@dataclass
class Admin:
    app: Flask
    client: FlaskClient
    prefix: str
    database_uri: str

    def get(self, path: str = "/", **kwargs: Any) -> Any:
        return read(self.client.get(self.prefix + path, **kwargs))

    def token(self) -> str:
        found = TOKEN.search(self.get("/jobs").get_data(as_text=True))
        assert found, "no CSRF token in the job list"
        return found.group(1)

    def post(self, path: str, data: dict[str, Any] | None = None, *, token: bool = True) -> Any:
        data = dict(data or {})
        if token:
            data["csrf_token"] = self.token()
        return read(self.client.post(self.prefix + path, data=data))

    def status(self, job_id: int) -> str | None:
        rows = query(self.database_uri, "SELECT status FROM sqlqueue_jobs WHERE id = :i", i=job_id)
        return rows[0][0] if rows else None

    def ctx(self) -> Any:
        return self.app.app_context()

    def work(self) -> None:
        sample_app.queue.worker(app=self.app).run(burst=True)


@pytest.fixture
def build(make_app: Callable[..., Flask], database_uri: str) -> Callable[..., Admin]:
    def make(
        authorize: Callable[[], Any] | None = lambda: True,
        *,
        secret_key: str | None = "test secret",
        prefix: str = "/queue",
    ) -> Admin:
        app = make_app()
        app.secret_key = secret_key
        app.register_blueprint(
            sample_app.queue.admin_blueprint(authorize=authorize), url_prefix=prefix
        )
        return Admin(app, app.test_client(), prefix, database_uri)

    return make


@pytest.fixture
def admin(build: Callable[..., Admin]) -> Admin:
    return build()


def dead_job(admin: Admin, message: str = "boom") -> int:
    with admin.ctx():
        job = sample_app.always_fails.using(max_attempts=1).enqueue(message)
    admin.work()
    assert admin.status(job.id) == "dead"
    return job.id


def pending_job(admin: Admin, **options: Any) -> int:
    with admin.ctx():
        return sample_app.add.using(**options).enqueue(1, 2).id


def listed(response: Any) -> list[int]:
    return [int(i) for i in IDS.findall(response.get_data(as_text=True))]


# -- safety ---------------------------------------------------------------------------------


def test_closed_by_default(build: Callable[..., Admin]) -> None:
    admin = build(authorize=None)
    job_id = dead_job(admin)
    for path in (
        "/",
        "/?span=24h",
        "/jobs",
        f"/jobs/{job_id}",
        "/jobs/retry-dead",
        "/metrics",
        "/workers",
        "/static/sqlqueue/admin.css",
    ):
        response = admin.get(path)
        assert response.status_code == 403, path
        assert "authorize=" in response.get_data(as_text=True)
    token_less = admin.client.post(f"{admin.prefix}/jobs/{job_id}/retry")
    assert token_less.status_code == 403
    assert admin.status(job_id) == "dead"


class User:
    """What ``authorize=lambda: current_user`` returns: truthy, and not True."""

    is_authenticated = False


def beside_an_open_admin(
    make_app: Callable[..., Flask], database_uri: str, authorize: Callable[[], Any]
) -> tuple[Admin, str]:
    """An admin gated by ``authorize`` at ``/gated``, and the CSRF token that an open
    admin of the same app gave this client: a token the gated one would accept."""
    app = make_app()
    app.secret_key = "test secret"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True), url_prefix="/queue"
    )
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=authorize), url_prefix="/gated", name="gated"
    )
    client = app.test_client()
    token = Admin(app, client, "/queue", database_uri).token()
    return Admin(app, client, "/gated", database_uri), token


@pytest.mark.parametrize(
    "answer",
    [False, None, 0, "", 1, "yes", [True], User()],
    ids=["False", "None", "0", "empty", "1", "yes", "list", "user"],
)
def test_anything_but_true_is_refused(
    make_app: Callable[..., Flask], database_uri: str, answer: Any
) -> None:
    admin, token = beside_an_open_admin(make_app, database_uri, lambda: answer)
    job_id = dead_job(admin)
    for path in (
        "/",
        "/jobs",
        f"/jobs/{job_id}",
        "/metrics",
        "/workers",
        "/static/sqlqueue/admin.js",
    ):
        response = admin.get(path)
        assert response.status_code == 403, path
        body = response.get_data(as_text=True)
        assert "You are not allowed to use the queue admin." in body
        assert "boom" not in body
        if answer is not None and not isinstance(answer, bool):
            assert "only True lets a request through" in body
    refused = admin.client.post(f"/gated/jobs/{job_id}/retry", data={"csrf_token": token})
    assert refused.status_code == 403
    assert admin.status(job_id) == "dead"


@pytest.mark.parametrize("kind", ["redirect", "response"])
def test_a_response_from_authorize_is_sent_as_it_is(
    make_app: Callable[..., Flask], database_uri: str, kind: str
) -> None:
    from flask import Response
    from flask import redirect

    def authorize() -> Any:
        if kind == "redirect":
            return redirect("/login?next=/gated/")
        return Response("who are you?", status=401, headers={"WWW-Authenticate": "Basic"})

    admin, token = beside_an_open_admin(make_app, database_uri, authorize)
    job_id = dead_job(admin)
    for path in (
        "/",
        "/jobs",
        f"/jobs/{job_id}",
        "/jobs?status=dead",
        "/static/sqlqueue/admin.css",
    ):
        response = admin.get(path)
        body = response.get_data(as_text=True)
        if kind == "redirect":
            assert response.status_code == 302, path
            assert response.headers["Location"] == "/login?next=/gated/"
        else:
            assert response.status_code == 401, path
            assert response.headers["WWW-Authenticate"] == "Basic"
            assert body == "who are you?"
        assert "boom" not in body and "Dashboard" not in body
    posted = admin.client.post(f"/gated/jobs/{job_id}/retry", data={"csrf_token": token})
    assert posted.status_code == (302 if kind == "redirect" else 401)
    assert admin.status(job_id) == "dead"


def test_authorize_is_called_on_every_request(build: Callable[..., Admin]) -> None:
    calls: list[int] = []
    allowed = [True]

    def authorize() -> bool:
        calls.append(1)
        return allowed[0]

    admin = build(authorize=authorize)
    for _ in range(3):
        assert admin.get("/").status_code == 200
    assert len(calls) == 3
    allowed[0] = False
    assert admin.get("/").status_code == 403
    assert admin.get("/static/sqlqueue/admin.js").status_code == 403
    assert len(calls) == 5
    allowed[0] = True
    assert admin.get("/jobs").status_code == 200


def test_posts_without_the_right_csrf_token_are_refused_and_change_nothing(
    admin: Admin, build: Callable[..., Admin]
) -> None:
    dead = dead_job(admin)
    pending = pending_job(admin)
    admin.get("/")  # the session has a secret from here on
    other = build()  # another browser: its own session, its own token
    foreign = other.token()
    for bad in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}, {"csrf_token": foreign}):
        for path, form in (
            (f"/jobs/{dead}/retry", {}),
            (f"/jobs/{pending}/cancel", {}),
            (f"/jobs/{pending}/delete", {}),
            ("/jobs/bulk", {"action": "delete", "ids": [dead, pending]}),
            ("/jobs/retry-dead", {}),
        ):
            response = admin.client.post(admin.prefix + path, data={**form, **bad})
            assert response.status_code == 400, (path, bad)
            assert "security token" in response.get_data(as_text=True)
    assert (admin.status(dead), admin.status(pending)) == ("dead", "pending")
    # A client that never loaded a page has no session secret at all.
    fresh = admin.app.test_client()
    assert fresh.post(f"{admin.prefix}/jobs/{dead}/retry").status_code == 400
    assert admin.post(f"/jobs/{dead}/retry").status_code == 303
    assert admin.status(dead) == "pending"


def test_without_a_secret_key_pages_work_and_posts_are_refused(
    build: Callable[..., Admin],
) -> None:
    admin = build(secret_key=None)
    dead = dead_job(admin)
    page = admin.get(f"/jobs/{dead}")
    assert page.status_code == 200
    assert "app.secret_key" in page.get_data(as_text=True)
    response = admin.client.post(f"{admin.prefix}/jobs/{dead}/retry", data={"csrf_token": "x"})
    assert response.status_code == 500
    assert "secret_key" in response.get_data(as_text=True)
    assert admin.status(dead) == "dead"


@pytest.mark.parametrize("method", ["get", "put", "delete"])
def test_actions_only_answer_post(admin: Admin, method: str) -> None:
    dead = dead_job(admin)
    pending = pending_job(admin)
    paths = [f"/jobs/{dead}/{action}" for action in ACTIONS]
    paths += [f"/jobs/{pending}/cancel", "/jobs/bulk"]
    for path in paths:
        response = getattr(admin.client, method)(admin.prefix + path)
        assert response.status_code == 405, path
        assert response.headers["X-Frame-Options"] == "DENY"
    assert (admin.status(dead), admin.status(pending)) == ("dead", "pending")


def assert_secure(response: Any) -> None:
    csp = response.headers["Content-Security-Policy"]
    for part in (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ):
        assert part in csp
    assert "unsafe-inline" not in csp
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "same-origin"


def test_every_admin_response_carries_the_security_headers(
    admin: Admin, build: Callable[..., Admin]
) -> None:
    dead = dead_job(admin)
    running = pending_job(admin)
    query(
        admin.database_uri, "UPDATE sqlqueue_jobs SET status = 'running' WHERE id = :i", i=running
    )
    responses = {
        200: [
            admin.get("/"),
            admin.get("/jobs"),
            admin.get(f"/jobs/{dead}"),
            admin.get("/jobs/retry-dead"),
            admin.get("/?span=24h"),
            admin.get("/metrics?window=7d"),
            admin.get("/workers"),
            admin.get("/static/sqlqueue/admin.css"),
            admin.get("/static/sqlqueue/admin.js"),
        ],
        303: [admin.post(f"/jobs/{dead}/retry")],
        400: [
            admin.get("/jobs?before=x"),
            admin.get("/?span=2h"),
            admin.get("/metrics?window=1y"),
            admin.post("/jobs/bulk", token=False),
        ],
        403: [build(authorize=lambda: False).get("/")],
        404: [admin.get("/jobs/999999"), admin.get("/nowhere")],
        405: [admin.get(f"/jobs/{dead}/retry")],
        409: [admin.post(f"/jobs/{running}/delete")],
    }
    for status, answers in responses.items():
        for response in answers:
            assert response.status_code == status
            assert_secure(response)
    # The app's own pages are left alone.
    assert "Content-Security-Policy" not in admin.client.get("/elsewhere").headers


def test_pages_use_no_inline_script_or_style(admin: Admin) -> None:
    dead = dead_job(admin)
    for path in (
        "/",
        "/?span=24h",
        "/jobs",
        "/jobs?status=dead",
        f"/jobs/{dead}",
        "/jobs/retry-dead",
        "/metrics",
        "/workers",
    ):
        body = admin.get(path).get_data(as_text=True)
        assert re.search(r"<script(?![^>]*\bsrc=)", body) is None, path
        assert " style=" not in body and "<style" not in body, path
        assert re.search(r"<[^>]*\son[a-z]+=", body) is None, path  # no event handlers
        assert "http://" not in body and "https://" not in body, path  # no CDN, no fonts


def test_everything_shown_is_escaped(admin: Admin) -> None:
    a, b = XSS
    with admin.ctx():
        echo = sample_app.echo.using(idempotency_key=b).enqueue(a, b, **{a: b, b: a})
        named = sample_app.queue.enqueue(a, args=[b], unregistered=True)  # stays pending
    with admin.ctx():
        failing = sample_app.always_fails.using(max_attempts=1).enqueue(a + b)
    admin.work()
    assert admin.status(echo.id) == "completed"
    assert admin.status(failing.id) == "dead"
    # The unknown task's job, finished by hand, so its name shows on the metrics page too.
    query(
        admin.database_uri,
        "UPDATE sqlqueue_jobs SET status = 'completed', attempts = 1, started_at = created_at,"
        " finished_at = created_at WHERE id = :i",
        i=named.id,
    )
    pages = [
        admin.get("/"),
        admin.get("/jobs"),
        admin.get(f"/jobs/{echo.id}"),
        admin.get(f"/jobs/{named.id}"),
        admin.get(f"/jobs/{failing.id}"),
        admin.get("/jobs", query_string={"q": a, "task": b, "queue": a}),
        admin.get("/jobs", query_string={"status": a}),
        admin.get("/jobs/retry-dead", query_string={"q": b, "task": a, "queue": b}),
        admin.get("/jobs", query_string={"per_page": b}),
        admin.get("/", query_string={"span": a}),
        admin.get("/metrics", query_string={"window": b}),
        admin.get("/metrics"),
        admin.get("/jobs?status=dead"),
    ]
    shown = {id(p): p.get_data(as_text=True) for p in pages}
    for page in pages:
        body = shown[id(page)]
        assert "<script>alert" not in body
        assert "<img src=x" not in body
    # ...and they do appear, escaped, where they belong.
    job_page = shown[id(pages[2])]
    assert html.escape(a, quote=False) in job_page  # args, kwargs keys, result
    assert "&lt;img src=x onerror=alert(1)&gt;" in job_page  # idempotency key
    assert job_page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 4
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown[id(pages[3])]  # task name
    failed_page = shown[id(pages[4])]
    assert "RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt;" in failed_page  # last_error
    assert "raise RuntimeError(message)" in failed_page  # the traceback is shown
    assert "Traceback" in failed_page
    assert "&lt;script&gt;" in shown[id(pages[5])] and "&lt;img src=x" in shown[id(pages[5])]
    assert pages[6].status_code == 400 and "&lt;script&gt;" in shown[id(pages[6])]
    assert pages[8].status_code == 400
    assert pages[9].status_code == 400 and "&lt;script&gt;" in shown[id(pages[9])]
    assert pages[10].status_code == 400 and "&lt;img src=x" in shown[id(pages[10])]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in shown[id(pages[11])]  # a task's metrics


@pytest.mark.parametrize(
    ("prefix", "script_name"), [("/queue", ""), ("/ops/jobs-admin", ""), ("/queue", "/app")]
)
def test_links_follow_the_url_prefix_and_script_name(
    build: Callable[..., Admin], prefix: str, script_name: str
) -> None:
    admin = build(prefix=prefix)
    dead = dead_job(admin)
    root = script_name + prefix
    overrides = {"SCRIPT_NAME": script_name} if script_name else {}
    for path in ("/", "/jobs", f"/jobs/{dead}", "/jobs/retry-dead", "/metrics", "/workers"):
        response = admin.client.get(prefix + path, environ_overrides=overrides)
        assert response.status_code == 200
        links = re.findall(r'(?:href|src|action)="([^"]*)"', response.get_data(as_text=True))
        assert links
        for link in links:
            assert link.startswith(root + "/"), (path, link)
    assert read(admin.client.get(f"{prefix}/static/sqlqueue/admin.css")).status_code == 200
    # An action posted under the prefix redirects back under it.
    page = admin.client.get(prefix + f"/jobs/{dead}", environ_overrides=overrides)
    token = TOKEN.search(page.get_data(as_text=True))
    assert token
    response = admin.client.post(
        prefix + f"/jobs/{dead}/retry",
        data={"csrf_token": token.group(1)},
        environ_overrides=overrides,
    )
    assert response.status_code == 303
    assert response.headers["Location"] == f"{root}/jobs/{dead}"
    assert admin.status(dead) == "pending"


# -- the dashboard -------------------------------------------------------------------------


def test_dashboard_shows_counts_queues_workers_and_throughput(admin: Admin) -> None:
    with admin.ctx():
        for i in range(3):
            sample_app.add.enqueue(i, i)
        sample_app.always_fails.using(max_attempts=1).enqueue("x")
    admin.work()  # 3 completed, 1 dead
    with admin.ctx():
        sample_app.report.enqueue(1)  # queue "reports"
        waiting = sample_app.report.enqueue(2)
        sample_app.add.using(delay=3600).enqueue(0, 0)  # pending but not eligible yet
    running = pending_job(admin)
    store = admin.app.extensions["sqlqueue"].store
    now = store.now()
    store.run_write(
        lambda conn: roster.register_worker(
            conn, "worker-a", "build-host-7", 4242, ["default", "reports"], 3, now
        )
    )
    query(
        admin.database_uri,
        "UPDATE sqlqueue_jobs SET status = 'running', worker_id = 'worker-a' WHERE id = :i",
        i=running,
    )
    query(
        admin.database_uri,
        "UPDATE sqlqueue_jobs SET run_at = :t WHERE queue = 'reports'",
        t=(now - timedelta(minutes=5)).replace(tzinfo=None)
        if admin.database_uri.startswith(("sqlite", "mysql"))
        else now - timedelta(minutes=5),
    )
    response = admin.get("/")
    body = response.get_data(as_text=True)
    assert response.status_code == 200
    counts = dict(re.findall(r'data-status="(\w+)">(\d+)<', body))
    assert counts == {
        "waiting": "0",
        "pending": "3",
        "running": "1",
        "completed": "3",
        "dead": "1",
        "cancelled": "0",
    }
    assert ">reports</a>" in body and ">default</a>" in body
    assert "5 min ago" in body  # the oldest eligible job of "reports" waited 5 minutes
    assert "build-host-7" in body and ">4242<" in body and "default, reports" in body
    assert f"#{running} tests.sample_app.add" in body
    assert "3 completed, 1 failed attempt since" in body
    assert body.count('class="completed"') >= 1 and body.count('class="failed"') >= 1
    assert "3 waiting now" in body  # pending and never started, the delayed one included
    assert "<svg" in body
    assert 'data-refresh="5"' in body and "sqlqueue/admin.js" in body
    assert waiting.id  # listed through the queue's count


def test_the_dashboard_script_and_styles_are_served(admin: Admin) -> None:
    js = admin.get("/static/sqlqueue/admin.js")
    assert js.status_code == 200 and "javascript" in js.headers["Content-Type"]
    assert "localStorage" in js.get_data(as_text=True)
    css = admin.get("/static/sqlqueue/admin.css")
    assert css.headers["Content-Type"].startswith("text/css")
    assert "prefers-color-scheme: dark" in css.get_data(as_text=True)


# -- the job list ---------------------------------------------------------------------------


def test_the_job_list_filters(admin: Admin) -> None:
    with admin.ctx():
        a = sample_app.add.enqueue(1, 1).id
        r = sample_app.report.enqueue(5).id
        k = sample_app.add.using(idempotency_key="Order-4711-Paid").enqueue(2, 2).id
        f = sample_app.always_fails.using(max_attempts=1).enqueue("disk 100% full").id
    admin.work()
    with admin.ctx():
        p = sample_app.add.enqueue(3, 3).id
    assert listed(admin.get("/jobs")) == [p, f, k, r, a]
    assert listed(admin.get("/jobs?status=dead")) == [f]
    assert listed(admin.get("/jobs?status=pending")) == [p]
    assert listed(admin.get("/jobs?queue=reports")) == [r]
    assert listed(admin.get("/jobs?task=tests.sample_app.add")) == [p, k, a]
    assert listed(admin.get("/jobs?task=tests.sample_app.add&status=completed")) == [k, a]
    assert listed(admin.get(f"/jobs?q={r}")) == [r]
    assert listed(admin.get("/jobs?q=Order-4711-Paid")) == [k]  # the key
    assert listed(admin.get("/jobs?q=Order-47")) == [k]  # or its beginning
    # Not the middle of a key, nor another case: the key's unique index answers.
    assert listed(admin.get("/jobs?q=4711-Paid")) == []
    assert listed(admin.get("/jobs?q=order-4711")) == []
    assert listed(admin.get("/jobs", query_string={"q": "100% FULL"})) == [f]  # error text
    assert listed(admin.get("/jobs", query_string={"q": "full", "status": "dead"})) == [f]
    # Error text is searched among dead, pending and running jobs only.
    assert listed(admin.get("/jobs", query_string={"q": "full", "status": "completed"})) == []
    assert listed(admin.get("/jobs", query_string={"q": "_"})) == []  # LIKE chars are literal
    assert listed(admin.get("/jobs", query_string={"q": "Order_4711"})) == []
    assert listed(admin.get("/jobs?q=nothing-like-this")) == []
    assert listed(admin.get("/jobs?task=tests.sample_app.nope")) == []
    assert listed(admin.get("/jobs?queue=nope")) == []
    assert "idempotency key or its beginning" in admin.get("/jobs").get_data(as_text=True)
    assert admin.get("/jobs?status=sleeping").status_code == 400


def test_waiting_jobs_are_filtered_counted_and_cancelled(admin: Admin) -> None:
    with admin.ctx():
        first = sample_app.add.using(delay=3600).enqueue(1, 1).id
        then = sample_app.add.using(depends_on=[first]).enqueue(2, 2).id
        last = sample_app.add.using(depends_on=[then]).enqueue(3, 3).id
    assert listed(admin.get("/jobs?status=waiting")) == [last, then]
    counts = dict(re.findall(r'data-status="(\w+)">(\d+)<', admin.get("/").get_data(as_text=True)))
    assert (counts["waiting"], counts["pending"]) == ("2", "1")
    page = admin.get(f"/jobs/{then}").get_data(as_text=True)
    assert f'action="/queue/jobs/{then}/cancel"' in page
    assert admin.post(f"/jobs/{then}/cancel").status_code == 303
    assert [admin.status(then), admin.status(last), admin.status(first)] == [
        "cancelled",
        "cancelled",
        "pending",
    ]


def test_a_filtered_list_past_the_newest_jobs_reads_the_same(admin: Admin) -> None:
    # The list walks the newest jobs first, then older ones through the filter's index;
    # the two halves join without a gap or a repeat, whatever the window.
    ids = [pending_job(admin) for _ in range(9)]
    reports = [ids[1], ids[4], ids[5], ids[8]]
    for job_id in reports:
        set_job(admin, job_id, queue="reports")
    store = admin.app.extensions["sqlqueue"].store
    where = queries.JobFilter(queue="reports")
    with store.read() as conn:
        for window in (0, 1, 2, 4, 100):
            assert [j.id for j in queries.search_jobs(conn, where, window=window)] == [
                ids[8],
                ids[5],
                ids[4],
                ids[1],
            ]
            for before, limit, expected in (
                (ids[8], 2, [ids[5], ids[4]]),
                (ids[5], 5, [ids[4], ids[1]]),
            ):
                page = queries.search_jobs(
                    conn, where, before_id=before, limit=limit, window=window
                )
                assert [j.id for j in page] == expected


def test_the_job_list_pages_by_id(admin: Admin) -> None:
    ids = [pending_job(admin) for _ in range(7)]
    first = admin.get("/jobs?per_page=3")
    assert listed(first) == ids[::-1][:3]
    older = re.search(r'href="([^"]+)">Older', first.get_data(as_text=True))
    assert older
    pending_job(admin)  # a new job does not shift the pages already being read
    second = admin.client.get(html.unescape(older.group(1)))
    assert listed(second) == ids[::-1][3:6]
    body = second.get_data(as_text=True)
    assert "Newest" in body
    older = re.search(r'href="([^"]+)">Older', body)
    assert older
    third = admin.client.get(html.unescape(older.group(1)))
    assert listed(third) == [ids[0]]
    assert "Older" not in third.get_data(as_text=True)
    # Filters survive paging.
    assert listed(admin.get(f"/jobs?status=pending&per_page=2&before={ids[2]}")) == [
        ids[1],
        ids[0],
    ]
    assert admin.get("/jobs?before=-1").status_code == 400
    assert admin.get("/jobs?per_page=0").status_code == 400


# -- malformed input --------------------------------------------------------------------------

PAGES = ("/", "/jobs", "/jobs/retry-dead", "/metrics", "/workers")
PARAMETERS = ("status", "queue", "task", "q", "before", "per_page", "span", "window")


def test_a_nul_in_any_parameter_of_any_page_is_a_400(admin: Admin) -> None:
    dead = dead_job(admin)
    for path in (*PAGES, f"/jobs/{dead}"):
        for name in PARAMETERS:
            for value in ("%00", "dead%00", "%00reports"):
                response = admin.get(f"{path}?{name}={value}")
                assert response.status_code == 400, (path, name, value)
                body = response.get_data(as_text=True)
                assert f"{name} holds a NUL character (%00)" in body, (path, name)
        # The same parameter with a clean value still works.
        assert admin.get(f"{path}?status=dead").status_code == 200, path
    assert admin.status(dead) == "dead"


@pytest.mark.parametrize("value", ["²", "١٢", "1e3", "-1", " ", "9" * 30])
def test_a_malformed_number_or_search_is_a_400_or_is_searched(admin: Admin, value: str) -> None:
    # "²" passes str.isdigit() and fails int(); a 500 before.
    dead = dead_job(admin)
    for name in ("before", "per_page"):
        response = admin.get(f"/jobs?{name}={value}")
        assert response.status_code == (200 if not value.strip() else 400), (name, value)
    for path in ("/jobs", "/jobs/retry-dead"):
        response = admin.get(f"{path}?q={value}")
        assert response.status_code == 200, (path, value)
    assert admin.status(dead) == "dead"


def test_forms_and_paths_with_a_nul_change_nothing(admin: Admin) -> None:
    dead = dead_job(admin)
    pending = pending_job(admin)
    for path, form in (
        ("/jobs/retry-dead", {"q": "boom\x00"}),
        ("/jobs/retry-dead", {"queue": "default\x00"}),
        ("/jobs/retry-dead", {"task": "\x00"}),
        ("/jobs/bulk", {"action": "delete", "ids": [dead, pending], "q": "\x00"}),
        ("/jobs/bulk", {"action": "delete", "ids": [str(dead), f"{pending}\x00"]}),
        ("/jobs/bulk", {"action": "delete\x00", "ids": [dead]}),
        ("/queues/default%00/pause", {}),
        ("/queues/%00/resume", {}),
    ):
        response = admin.post(path, form)
        assert response.status_code == 400, (path, form)
        assert "NUL character" in response.get_data(as_text=True)
    assert (admin.status(dead), admin.status(pending)) == ("dead", "pending")
    with admin.ctx():
        assert sample_app.queue.paused_queues() == {}


def test_job_ids_past_the_largest_are_404_everywhere(admin: Admin) -> None:
    dead = dead_job(admin)
    huge = 2**63
    assert admin.get(f"/jobs/{huge}").status_code == 404
    for action in ACTIONS:
        response = admin.post(f"/jobs/{huge}/{action}")
        assert response.status_code == 404, action
        assert "job ids stop at" in response.get_data(as_text=True)
    assert admin.status(dead) == "dead"


# -- big jobs -----------------------------------------------------------------------------------

MIB = 1024 * 1024
#: Columns a list must never read in full.
BULKY = {"payload", "result", "errors"}


def big_jobs(admin: Admin, n: int = 3, size: int = 3 * MIB) -> list[int]:
    """Dead jobs whose payload, result, error history, last error and progress message
    each hold ``size`` characters (written one column per statement: MariaDB's packet)."""
    filler = "x" * size
    ids = []
    for _ in range(n):
        job_id = dead_job(admin)
        now = utcnow()
        record = {"attempt": 1, "type": "E", "message": "m", "traceback": filler}
        values = {
            "payload": json.dumps({"args": [filler], "kwargs": {}}),
            "result": json.dumps(filler),
            "errors": json.dumps([{**record, "at": now.isoformat()}]),
            "last_error": "E: " + filler,
            "progress_message": filler,
        }
        for column, value in values.items():
            set_job(admin, job_id, **{column: value})
        ids.append(job_id)
    return ids


@pytest.mark.slow
def test_list_pages_read_no_payload_result_or_history(admin: Admin) -> None:
    import tracemalloc

    ids = big_jobs(admin)
    engine = admin.app.extensions["sqlqueue"].store.engine
    read: list[str] = []

    def columns(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        read.extend(column[0].lower() for column in cursor.description or ())

    pages = [
        "/",
        "/?span=24h",
        "/jobs",
        "/jobs?status=dead",
        "/jobs?q=E%3A",
        f"/jobs?q={ids[0]}",
        "/jobs?queue=default&task=tests.sample_app.always_fails",
        "/jobs/retry-dead",
        "/metrics",
        "/workers",
    ]
    for path in pages:  # compiling the templates is not what is measured
        admin.get(path)
    sa.event.listen(engine, "after_cursor_execute", columns)
    tracemalloc.start()
    try:
        for path in pages:
            response = admin.get(path)
            assert response.status_code == 200, path
            assert len(response.get_data()) < 200_000, path  # no value shown in full
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sa.event.remove(engine, "after_cursor_execute", columns)
    assert not BULKY & set(read), sorted(BULKY & set(read))
    # Three jobs of 15 MiB each; reading any one value of one would be 3 MiB.
    assert peak < MIB, peak
    dead = admin.get("/jobs?status=dead")
    assert set(listed(dead)) >= set(ids)
    assert "E: xxx" in dead.get_data(as_text=True)  # the last error's beginning is shown
    # One job's own page shows it all.
    one = admin.get(f"/jobs/{ids[0]}")
    assert one.status_code == 200
    assert one.get_data(as_text=True).count("x" * 1000) >= 3 * MIB // 1000


def test_the_cli_list_reads_no_payload_result_or_history(admin: Admin) -> None:
    ids = big_jobs(admin, n=2)
    engine = admin.app.extensions["sqlqueue"].store.engine
    read: list[str] = []

    def columns(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        read.extend(column[0].lower() for column in cursor.description or ())

    sa.event.listen(engine, "after_cursor_execute", columns)
    try:
        result = admin.app.test_cli_runner().invoke(args=["queue", "list", "--status", "dead"])
    finally:
        sa.event.remove(engine, "after_cursor_execute", columns)
    assert result.exit_code == 0, result.output
    assert not BULKY & set(read), sorted(BULKY & set(read))
    listed_ids = {int(line.split()[0]) for line in result.output.splitlines()[1:]}
    assert listed_ids == set(ids)
    assert "E: xxx" in result.output  # the last error's beginning


def test_the_failure_chart_reads_the_end_of_each_history(admin: Admin) -> None:
    now = admin.app.extensions["sqlqueue"].store.now()
    ago = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    long = "x" * (charts.HISTORY_TAIL * 2)

    def record(i: int, at: datetime, traceback: str = "") -> dict[str, Any]:
        return {
            "attempt": i,
            "type": "E",
            "message": "m",
            "traceback": traceback,
            "at": at.isoformat(),
        }

    # Records are oldest first and each ends with its time, so what a long record hides
    # is the records before it.
    a = pending_job(admin)  # failed 5 h, 3 h (a long traceback) and 1 min ago
    b = pending_job(admin)  # failed 20 min and 1 min ago (a long traceback)
    set_job(
        admin,
        a,
        attempts=3,
        updated_at=ago(1),
        errors=json.dumps([record(1, ago(300)), record(2, ago(180), long), record(3, ago(1))]),
    )
    store = admin.app.extensions["sqlqueue"].store
    with store.read() as conn:
        data = charts.activity(conn, now)
    # The record cut off is older than one still read that is older than the hour.
    assert (sum(data.failed), data.failed_partial) == (1, False)
    set_job(
        admin,
        b,
        attempts=2,
        updated_at=ago(1),
        errors=json.dumps([record(1, ago(20)), record(2, ago(1), long)]),
    )
    with store.read() as conn:
        data = charts.activity(conn, now)
    # b's failure 20 min ago is before the end that is read: a lower bound, and said so.
    assert (sum(data.failed), data.failed_partial) == (2, True)
    assert "2+ failed attempts" in admin.get("/").get_data(as_text=True)


# -- one job --------------------------------------------------------------------------------


def test_the_job_page_shows_every_field(admin: Admin) -> None:
    with admin.ctx():
        job = sample_app.echo.using(idempotency_key="key-77", priority=4).enqueue(
            1, "two", nested={"list": [1, 2], "text": "é"}
        )
        reserving = sample_app.reserve.enqueue("send-mail-9")
    admin.work()
    body = admin.get(f"/jobs/{job.id}").get_data(as_text=True)
    for shown in ("echo", "default", "completed", "key-77", ">4<", "1 of 5", " UTC", " ago"):
        assert shown in body, shown
    assert '"nested": {\n    "list": [\n      1,' in html.unescape(body)  # pretty-printed
    assert '"text": "é"' in html.unescape(body)
    assert "&#34;args&#34;: [\n    1,\n    &#34;two&#34;\n  ]," in body  # the result
    effects = admin.get(f"/jobs/{reserving.id}").get_data(as_text=True)
    assert "send-mail-9" in effects and "Reserved effects" in effects


def test_the_job_page_shows_each_attempt_with_its_traceback(admin: Admin) -> None:
    with admin.ctx():
        job = sample_app.always_fails.enqueue("third time unlucky")  # max_attempts=3
    admin.work()
    body = admin.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert admin.status(job.id) == "dead"
    for attempt in (1, 2, 3):
        assert f"Attempt {attempt}: " in body
    assert body.count("Traceback (most recent call last)") == 3
    assert body.count("third time unlucky") >= 4


def test_unknown_jobs_are_404(admin: Admin) -> None:
    assert admin.get("/jobs/424242").status_code == 404
    assert admin.get(f"/jobs/{2**70}").status_code == 404
    assert admin.post("/jobs/424242/retry").status_code == 409


def test_single_job_actions(admin: Admin) -> None:
    dead = dead_job(admin)
    pending = pending_job(admin)
    response = admin.post(f"/jobs/{dead}/retry")
    assert response.status_code == 303
    assert admin.status(dead) == "pending"
    assert "pending again" in admin.client.get(response.headers["Location"]).get_data(as_text=True)
    assert admin.post(f"/jobs/{pending}/cancel").status_code == 303
    assert admin.status(pending) == "cancelled"
    assert admin.post(f"/jobs/{pending}/retry").status_code == 303  # cancelled jobs replay too
    assert admin.status(pending) == "pending"
    response = admin.post(f"/jobs/{pending}/delete")
    assert response.status_code == 303 and response.headers["Location"].endswith("/queue/jobs")
    assert admin.status(pending) is None


def test_impossible_actions_are_a_409_page_not_a_500(admin: Admin) -> None:
    running = pending_job(admin)
    query(
        admin.database_uri, "UPDATE sqlqueue_jobs SET status = 'running' WHERE id = :i", i=running
    )
    for action in ("retry", "delete"):  # cancel asks a running job to stop: test_cancel.py
        response = admin.post(f"/jobs/{running}/{action}")
        assert response.status_code == 409, action
        assert "running" in response.get_data(as_text=True)
    assert admin.status(running) == "running"
    pending = pending_job(admin)
    assert admin.post(f"/jobs/{pending}/retry").status_code == 409
    assert admin.status(pending) == "pending"


# -- bulk actions ---------------------------------------------------------------------------


def test_bulk_actions(admin: Admin) -> None:
    dead = [dead_job(admin) for _ in range(2)]
    pending = [pending_job(admin) for _ in range(3)]
    keep = pending_job(admin)
    response = admin.post("/jobs/bulk", {"action": "retry", "ids": dead, "status": "dead"})
    assert response.status_code == 303
    assert response.headers["Location"].endswith("/queue/jobs?status=dead")
    assert [admin.status(i) for i in dead] == ["pending", "pending"]
    assert "2 jobs retried" in admin.client.get(response.headers["Location"]).get_data(as_text=True)
    assert admin.post("/jobs/bulk", {"action": "cancel", "ids": pending[:2]}).status_code == 303
    assert [admin.status(i) for i in pending] == ["cancelled", "cancelled", "pending"]
    assert admin.post("/jobs/bulk", {"action": "delete", "ids": pending}).status_code == 303
    assert [admin.status(i) for i in pending] == [None, None, None]
    assert admin.status(keep) == "pending"


def test_a_bulk_action_that_cannot_apply_to_every_job_changes_none(admin: Admin) -> None:
    dead = dead_job(admin)
    pending = pending_job(admin)
    response = admin.post("/jobs/bulk", {"action": "retry", "ids": [dead, pending]})
    assert response.status_code == 409
    assert f"job {pending}: it is pending" in response.get_data(as_text=True)
    assert (admin.status(dead), admin.status(pending)) == ("dead", "pending")
    assert admin.post("/jobs/bulk", {"action": "explode", "ids": [dead]}).status_code == 400
    assert admin.post("/jobs/bulk", {"action": "delete", "ids": ["1; DROP"]}).status_code == 400
    nothing = admin.post("/jobs/bulk", {"action": "delete"})
    assert nothing.status_code == 303
    assert "Select at least one job" in admin.client.get(nothing.headers["Location"]).get_data(
        as_text=True
    )
    assert (admin.status(dead), admin.status(pending)) == ("dead", "pending")


def test_retry_all_dead_matching_the_filter_shows_the_count_first(admin: Admin) -> None:
    with admin.ctx():
        default = [
            sample_app.always_fails.using(max_attempts=1).enqueue(f"db down {i}").id
            for i in range(3)
        ]
        reports = sample_app.always_fails.using(max_attempts=1, queue="reports").enqueue(
            "smtp down"
        )
    admin.work()
    listing = admin.get("/jobs?status=dead").get_data(as_text=True)
    assert "Retry all 4 dead" in listing
    assert "Retry all 3 dead" in admin.get("/jobs?queue=default").get_data(as_text=True)
    assert "Retry all" not in admin.get("/jobs?status=pending").get_data(as_text=True)
    # With free text the list offers the replay and the confirmation page counts.
    searched = admin.get("/jobs", query_string={"q": "db down"}).get_data(as_text=True)
    assert "Retry every dead job matching" in searched and "Retry all" not in searched
    assert "Retry every dead" not in admin.get("/jobs?q=no-such-error").get_data(as_text=True)
    assert "Replay 3 dead jobs" in admin.get(
        "/jobs/retry-dead", query_string={"q": "db down"}
    ).get_data(as_text=True)
    confirm = admin.get("/jobs/retry-dead?queue=default").get_data(as_text=True)
    assert "Replay 3 dead jobs" in confirm
    assert all(admin.status(i) == "dead" for i in default)  # the confirm page changed nothing
    response = admin.post("/jobs/retry-dead", {"q": "DB DOWN 1"})
    assert response.status_code == 303
    assert "1 dead job replayed" in admin.client.get(response.headers["Location"]).get_data(
        as_text=True
    )
    assert [admin.status(i) for i in default] == ["dead", "pending", "dead"]
    assert admin.post("/jobs/retry-dead", {"queue": "default"}).status_code == 303
    assert [admin.status(i) for i in default] == ["pending"] * 3
    assert admin.status(reports.id) == "dead"
    assert "No dead job matches" in admin.get("/jobs/retry-dead?queue=default").get_data(
        as_text=True
    )
    assert admin.post("/jobs/retry-dead").status_code == 303
    assert admin.status(reports.id) == "pending"


def test_the_admin_sees_the_database_clock(admin: Admin) -> None:
    # Relative times are computed against the queue's clock, not a browser's.
    job_id = pending_job(admin, delay=7200)
    body = admin.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "in 2.0 h" in body or "in 2 h" in body
    assert utcnow().strftime("%Y-%m-%d") in body


# -- charts, metrics, dead letters and workers ------------------------------------------------


def stamp(admin: Admin, moment: datetime) -> datetime:
    """``moment`` as the raw column value: naive UTC where the database keeps no zone."""
    naive = admin.database_uri.startswith(("sqlite", "mysql"))
    return moment.astimezone(UTC).replace(tzinfo=None) if naive else moment


def set_job(admin: Admin, job_id: int, **values: Any) -> None:
    """Overwrite columns of one job (timestamps given aware, converted per backend)."""
    params = {k: stamp(admin, v) if isinstance(v, datetime) else v for k, v in values.items()}
    sets = ", ".join(f"{k} = :{k}" for k in params)
    query(
        admin.database_uri, f"UPDATE sqlqueue_jobs SET {sets} WHERE id = :id", id=job_id, **params
    )


def history(*moments: datetime) -> str:
    return json.dumps(
        [
            {"attempt": i, "type": "RuntimeError", "message": "x", "at": at.isoformat()}
            for i, at in enumerate(moments, 1)
        ]
    )


def test_activity_counts_completed_jobs_failed_attempts_and_waiting_jobs(admin: Admin) -> None:
    now = admin.app.extensions["sqlqueue"].store.now()
    ago = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    ids = [pending_job(admin) for _ in range(7)]
    a, b, c, d, e, f, g = ids
    # a: waited 30 min, ran, completed 9 min ago.
    set_job(
        admin, a, status="completed", created_at=ago(30), started_at=ago(10), finished_at=ago(9)
    )
    # b: waiting for 20 min, never started.
    set_job(admin, b, created_at=ago(20))
    # c: cancelled 2 min ago before it ever started.
    set_job(admin, c, status="cancelled", created_at=ago(5), finished_at=ago(2))
    # d: failed at -40 and -39, went dead at -3 (its third failure).
    set_job(
        admin,
        d,
        status="dead",
        attempts=3,
        created_at=ago(50),
        started_at=ago(3),
        finished_at=ago(3),
        updated_at=ago(3),
        errors=history(ago(40), ago(39), ago(3)),
    )
    # e: failed a minute ago, pending for its retry.
    set_job(
        admin,
        e,
        attempts=1,
        created_at=ago(2),
        started_at=ago(1),
        updated_at=ago(1),
        errors=history(ago(1)),
        last_error="RuntimeError: x",
    )
    # f: failed and completed two hours ago: only in the day's span.
    set_job(
        admin,
        f,
        status="completed",
        attempts=2,
        created_at=ago(125),
        started_at=ago(121),
        finished_at=ago(121),
        updated_at=ago(121),
        errors=history(ago(122)),
    )
    # g: created 30 h ago, still waiting: waiting in every bucket of both spans.
    set_job(admin, g, created_at=ago(30 * 60))

    stops = {a: ago(10), b: None, c: ago(2), d: ago(3), e: ago(1), f: ago(121), g: None}
    created = {a: ago(30), b: ago(20), c: ago(5), d: ago(50), e: ago(2), f: ago(125), g: ago(1800)}
    failures = [ago(40), ago(39), ago(3), ago(1), ago(122)]
    store = admin.app.extensions["sqlqueue"].store
    for span, step in (
        (timedelta(hours=1), timedelta(minutes=1)),
        (timedelta(days=1), timedelta(minutes=10)),
    ):
        with store.read() as conn:
            data = charts.activity(conn, now, span=span, step=step)
        assert len(data.starts) == span / step
        assert data.starts[-1] <= now < data.starts[-1] + step  # the current bucket is last
        ends = [start + step for start in data.starts]

        def inside(t: datetime, i: int, data: Any = data, ends: Any = ends) -> bool:
            return bool(data.starts[i] <= t < ends[i])

        done_at = [ago(9)] + ([ago(121)] if span > timedelta(hours=2) else [])
        assert data.completed == [sum(inside(t, i) for t in done_at) for i in range(len(ends))]
        assert data.failed == [sum(inside(t, i) for t in failures) for i in range(len(ends))]
        expected_waiting = [
            sum(
                1 for job in ids if created[job] < end and (stops[job] is None or stops[job] >= end)
            )
            for end in ends
        ]
        assert data.waiting == expected_waiting
        assert data.waiting[-1] == 2  # b and g
        assert data.failed_partial is False
    with store.read() as conn:
        capped = charts.activity(conn, now, failure_rows=1)
    assert capped.failed_partial and sum(capped.failed) < 4

    hour = admin.get("/").get_data(as_text=True)
    assert "1 completed, 4 failed attempts since" in hour
    assert "2 waiting now" in hour
    minute = ago(9).replace(second=0, microsecond=0)
    label = f"{minute:%H:%M}\u2013{minute + timedelta(minutes=1):%H:%M} UTC"
    assert f"{label}: 1 completed, 0 failed attempts" in hour
    day = admin.get("/?span=24h")
    assert day.status_code == 200
    body = day.get_data(as_text=True)
    assert "2 completed, 5 failed attempts since" in body
    assert "per 10 minutes" in body and 'data-refresh="60"' in body
    bad = admin.get("/?span=2h")
    assert bad.status_code == 400 and "span must be one of 1h, 24h" in bad.get_data(as_text=True)


def test_per_task_metrics_over_a_window(admin: Admin) -> None:
    now = admin.app.extensions["sqlqueue"].store.now()
    ago = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    # add: four completed runs of 1, 2, 3 and 10 s that waited 4 s each; one of them
    # needed two attempts. Another one finished three days ago.
    for seconds, attempts in ((1, 1), (2, 1), (3, 2), (10, 1)):
        job = pending_job(admin)
        finished = ago(120) + timedelta(seconds=seconds)
        set_job(
            admin,
            job,
            status="completed",
            attempts=attempts,
            created_at=ago(120) - timedelta(seconds=4),
            started_at=ago(120),
            finished_at=finished,
        )
    old = pending_job(admin)
    set_job(
        admin,
        old,
        status="completed",
        attempts=1,
        created_at=ago(3 * 1440 + 1),
        started_at=ago(3 * 1440),
        finished_at=ago(3 * 1440) + timedelta(seconds=100),
    )
    dead = dead_job(admin)  # always_fails, one attempt
    pending_job(admin)  # not finished: not counted

    store = admin.app.extensions["sqlqueue"].store
    with store.read() as conn:
        day = {m.task: m for m in charts.task_metrics(conn, ago(1440))}
        week = {m.task: m for m in charts.task_metrics(conn, ago(7 * 1440))}
        sampled = {m.task: m for m in charts.task_metrics(conn, ago(1440), sample=2)}
    add = day["tests.sample_app.add"]
    assert (add.completed, add.dead, add.attempts, add.sampled) == (4, 0, 5, 4)
    assert add.failed_attempts == 1 and add.failure_rate == pytest.approx(0.2)
    assert (add.p50, add.p95) == (pytest.approx(2.0), pytest.approx(10.0))
    assert add.mean_wait == pytest.approx(4.0)
    fails = day["tests.sample_app.always_fails"]
    assert (fails.completed, fails.dead, fails.attempts, fails.failure_rate) == (0, 1, 1, 1.0)
    assert fails.p50 is None and fails.sampled == 0
    assert week["tests.sample_app.add"].completed == 5
    assert week["tests.sample_app.add"].p95 == pytest.approx(100.0)
    # The timings come from the latest completed jobs: here the 10 s and 3 s ones.
    assert sampled["tests.sample_app.add"].sampled == 2
    assert sampled["tests.sample_app.add"].p95 == pytest.approx(10.0)
    assert sampled["tests.sample_app.add"].p50 == pytest.approx(3.0)
    assert sampled["tests.sample_app.add"].completed == 4  # counts stay exact
    # Runs are estimated from the sample when it is not every job: its latest two made
    # 1 and 2 attempts, so four jobs made about 6.
    assert (add.attempts, add.attempts_exact) == (5, True)
    assert sampled["tests.sample_app.add"].attempts == 6
    assert not sampled["tests.sample_app.add"].attempts_exact

    page = admin.get("/metrics")
    body = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "Per-task metrics, last 24 hours" in body
    row = re.search(r"tests\.sample_app\.add</a></th>(.*?)</tr>", body, re.S)
    assert row
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells == [
        "5",
        "4",
        '<span class="muted">0</span>',
        "20.0%",
        "2.0 s",
        "10.0 s",
        "4.0 s",
        "4",
    ]
    assert 'href="/queue/jobs?task=tests.sample_app.always_fails&amp;status=dead">1<' in body
    assert "100.0%" in body
    assert dead
    assert "1.7 min" in admin.get("/metrics?window=7d").get_data(as_text=True)  # 100 s p95
    hour = admin.get("/metrics?window=1h").get_data(as_text=True)
    assert "tests.sample_app.always_fails" in hour and "tests.sample_app.add" not in hour
    set_job(admin, dead, finished_at=ago(90))
    assert "No job finished last hour" in admin.get("/metrics?window=1h").get_data(as_text=True)
    bad = admin.get("/metrics?window=30d")
    assert bad.status_code == 400
    assert "window must be one of 1h, 24h, 7d, not &#39;30d&#39;" in bad.get_data(as_text=True)


def test_admin_reads_are_planned_for_their_parameters(admin: Admin, backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("only PostgreSQL switches prepared statements to generic plans")
    store = admin.app.extensions["sqlqueue"].store
    with store.read() as conn:
        store.ops.plan_per_execution(conn)
        assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "force_custom_plan"
    with store.read() as conn:  # for that transaction only
        assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "auto"


def test_percentiles_are_nearest_rank() -> None:
    assert charts.percentile([], 0.5) is None
    assert charts.percentile([7.0], 0.95) == 7.0
    values = [float(v) for v in range(1, 101)]
    assert charts.percentile(values, 0.5) == 50.0
    assert charts.percentile(values, 0.95) == 95.0
    assert charts.percentile(values, 1.0) == 100.0


def test_the_dead_letter_view_shows_the_effects_each_job_reserved(admin: Admin) -> None:
    with admin.ctx():
        reserved = sample_app.always_fails.using(max_attempts=1).enqueue("after charging")
        bare = sample_app.always_fails.using(max_attempts=1).enqueue("before anything")
        many = sample_app.always_fails.using(max_attempts=1).enqueue("after five mails")
    admin.work()
    store = admin.app.extensions["sqlqueue"].store
    keys = [(reserved.id, "charge-order-17"), (reserved.id, "<b>mail-receipt</b>")]
    keys += [(many.id, f"mail-{i}") for i in range(5)]
    store.run_write(
        lambda conn: conn.execute(
            sa.insert(models.effects),
            [{"key": k, "job_id": j, "created_at": store.now()} for j, k in keys],
        )
    )
    body = admin.get("/jobs?status=dead").get_data(as_text=True)
    assert "Reserved effects" in body and "will not repeat" in body
    counts = dict(re.findall(r'name="ids" value="(\d+)".*?data-effects="(\d+)"', body, re.S))
    assert counts == {str(reserved.id): "2", str(bare.id): "0", str(many.id): "5"}
    assert "<code title=" in body and "charge-order-17</code>" in body
    assert "&lt;b&gt;mail-receipt&lt;/b&gt;" in body and "<b>mail" not in body
    assert "and 2 more" in body  # three keys shown, the rest on the job's page
    assert "none reserved" in body
    # Other lists keep their columns.
    assert "Reserved effects" not in admin.get("/jobs").get_data(as_text=True)


def test_the_workers_page_shows_live_and_recently_gone_workers(admin: Admin) -> None:
    store = admin.app.extensions["sqlqueue"].store
    now = store.now()
    stale_after = admin.app.extensions["sqlqueue"].settings.stale_after

    def register(worker_id: str, host: str, pid: int, at: datetime) -> None:
        store.run_write(
            lambda conn: roster.register_worker(conn, worker_id, host, pid, ["mail"], 2, at)
        )

    register("w-live", "live-host", 101, now)
    register("w-stopped", "stopped-host", 102, now - timedelta(hours=2))
    register("w-lost", "lost-host", 103, now - timedelta(hours=3))
    register("w-old", "old-host", 104, now - timedelta(days=3))
    store.run_write(lambda conn: roster.unregister_worker(conn, "w-stopped", now))
    store.run_write(lambda conn: roster.unregister_worker(conn, "w-old", now - timedelta(days=2)))
    # w-lost's last heartbeat was 3 h ago: a rescue declares it lost.
    store.run_write(
        lambda conn: roster.rescue_stale(conn, now - timedelta(seconds=stale_after), now)
    )
    body = admin.get("/workers").get_data(as_text=True)
    live, gone = body.split('id="sqlqueue-gone-workers"')
    assert "live-host" in live and "stopped-host" not in live and "lost-host" not in live
    assert "stopped-host" in gone and "lost-host" in gone
    assert "old-host" not in body  # gone for longer than a day
    lost_row = re.search(r"lost-host.*?</tr>", gone, re.S)
    stopped_row = re.search(r"stopped-host.*?</tr>", gone, re.S)
    assert lost_row and 'status-dead">lost<' in lost_row.group(0)
    assert stopped_row and ">stopped<" in stopped_row.group(0)
    assert gone.index("stopped-host") < gone.index("lost-host") or True  # both at `now`
    dashboard = admin.get("/").get_data(as_text=True)
    assert "live-host" in dashboard and "lost-host" not in dashboard
    assert 'href="/queue/workers"' in dashboard


def test_filter_menus_list_every_queue_and_task(admin: Admin) -> None:
    with admin.ctx():
        for queue in ("zeta", "alpha", "mail", "alpha"):
            sample_app.add.using(queue=queue).enqueue(1, 1)
        sample_app.report.enqueue(1)
        sample_app.queue.enqueue("z.last", args=[], unregistered=True)
    store = admin.app.extensions["sqlqueue"].store
    with store.read() as conn:
        assert queries.distinct_values(conn, "queue") == [
            "alpha",
            "default",
            "mail",
            "reports",
            "zeta",
        ]
        assert queries.distinct_values(conn, "task") == [
            "tests.sample_app.add",
            "tests.sample_app.report",
            "z.last",
        ]
        assert queries.distinct_values(conn, "queue", limit=2) == ["alpha", "default"]
    body = admin.get("/jobs").get_data(as_text=True)
    assert re.findall(
        r'<option value="(\w+)">\1</option>', body.split('name="queue"')[1].split("</select>")[0]
    ) == [
        "alpha",
        "default",
        "mail",
        "reports",
        "zeta",
    ]
    assert '<option value="z.last">' in body


def test_queue_counts_stop_at_their_caps(admin: Admin) -> None:
    dead_job(admin)
    for _ in range(3):
        pending_job(admin)
    with admin.ctx():
        sample_app.report.enqueue(1)
    store = admin.app.extensions["sqlqueue"].store
    caps = {**queries.COUNT_CAPS, "pending": 2}
    with store.read() as conn:
        capped = {q.queue: q for q in queries.queue_counts(conn, store.now(), caps)}
        exact = {q.queue: q for q in queries.queue_counts(conn, store.now())}
    assert capped["default"].counts == {"pending": 2, "dead": 1}
    assert capped["default"].capped == {"pending"}
    assert capped["reports"].counts == {"pending": 1} and not capped["reports"].capped
    assert exact["default"].counts == {"pending": 3, "dead": 1} and not exact["default"].capped
    assert exact["default"].oldest_eligible is not None


def test_the_dashboard_says_when_a_count_stopped_at_its_cap(admin: Admin) -> None:
    with admin.ctx():
        sample_app.add.enqueue(1, 1)
    admin.work()
    columns = "queue, task, payload, status, attempts, max_attempts, priority, run_at, created_at"
    columns += ", updated_at, started_at, finished_at"
    cap = queries.COUNT_CAPS["completed"]
    for _ in range(cap.bit_length()):  # double the completed jobs past the cap
        query(
            admin.database_uri,
            f"INSERT INTO sqlqueue_jobs ({columns}) SELECT {columns} FROM sqlqueue_jobs"
            " WHERE status = 'completed'",
        )
    body = admin.get("/").get_data(as_text=True)
    assert f'data-status="completed">{cap}</span><span class="more"' in body
    assert f"at least: counted up to {cap} per queue" in body
    assert f"Counts stop at {cap} completed per queue" in body
    assert 'data-status="pending">0<' in body  # exact counts say nothing more
    assert body.count("at least:") == 1


def test_running_jobs_are_listed_longest_running_first(admin: Admin) -> None:
    now = admin.app.extensions["sqlqueue"].store.now()
    ids = [pending_job(admin) for _ in range(3)]
    for job_id, minutes in zip(ids, (5, 30, 10), strict=True):
        set_job(admin, job_id, status="running", started_at=now - timedelta(minutes=minutes))
    store = admin.app.extensions["sqlqueue"].store
    with store.read() as conn:
        assert [row.id for row in queries.running_jobs(conn)] == [ids[1], ids[2], ids[0]]
        assert [row.id for row in queries.running_jobs(conn, limit=1)] == [ids[1]]

"""The admin blueprint through Flask's test client, on a real database per backend."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_sqlqueue.core import lifecycle
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
    for path in ("/", "/jobs", f"/jobs/{job_id}", "/jobs/retry-dead", "/static/sqlqueue/admin.css"):
        response = admin.get(path)
        assert response.status_code == 403, path
        assert "authorize=" in response.get_data(as_text=True)
    token_less = admin.client.post(f"{admin.prefix}/jobs/{job_id}/retry")
    assert token_less.status_code == 403
    assert admin.status(job_id) == "dead"


@pytest.mark.parametrize("answer", [False, None, 0, ""])
def test_a_falsy_authorize_is_refused(build: Callable[..., Admin], answer: Any) -> None:
    admin = build(authorize=lambda: answer)
    job_id = dead_job(admin)
    for path in ("/", "/jobs", f"/jobs/{job_id}"):
        response = admin.get(path)
        assert response.status_code == 403
        assert "not allowed" in response.get_data(as_text=True)
        assert "boom" not in response.get_data(as_text=True)
    assert admin.client.post(f"{admin.prefix}/jobs/{job_id}/retry").status_code == 403
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
            admin.get("/static/sqlqueue/admin.css"),
            admin.get("/static/sqlqueue/admin.js"),
        ],
        303: [admin.post(f"/jobs/{dead}/retry")],
        400: [admin.get("/jobs?before=x"), admin.post("/jobs/bulk", token=False)],
        403: [build(authorize=lambda: False).get("/")],
        404: [admin.get("/jobs/999999"), admin.get("/nowhere")],
        405: [admin.get(f"/jobs/{dead}/retry")],
        409: [admin.post(f"/jobs/{running}/cancel")],
    }
    for status, answers in responses.items():
        for response in answers:
            assert response.status_code == status
            assert_secure(response)
    # The app's own pages are left alone.
    assert "Content-Security-Policy" not in admin.client.get("/elsewhere").headers


def test_pages_use_no_inline_script_or_style(admin: Admin) -> None:
    dead = dead_job(admin)
    for path in ("/", "/jobs", f"/jobs/{dead}", "/jobs/retry-dead"):
        body = admin.get(path).get_data(as_text=True)
        assert re.search(r"<script(?![^>]*\bsrc=)", body) is None, path
        assert " style=" not in body and "<style" not in body, path
        assert re.search(r"<[^>]*\son[a-z]+=", body) is None, path  # no event handlers
        assert "http://" not in body and "https://" not in body, path  # no CDN, no fonts


def test_everything_shown_is_escaped(admin: Admin) -> None:
    a, b = XSS
    with admin.ctx():
        echo = sample_app.echo.using(idempotency_key=b).enqueue(a, b, **{a: b, b: a})
        named = sample_app.queue.enqueue(a, args=[b])  # no such task: stays pending
    with admin.ctx():
        failing = sample_app.always_fails.using(max_attempts=1).enqueue(a + b)
    admin.work()
    assert admin.status(echo.id) == "completed"
    assert admin.status(failing.id) == "dead"
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
    for path in ("/", "/jobs", f"/jobs/{dead}", "/jobs/retry-dead"):
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
        lambda conn: lifecycle.register_worker(
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
    assert "3 completed, 1 went dead" in body
    assert body.count('class="completed"') >= 1 and body.count('class="dead"') >= 1
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
    assert listed(admin.get("/jobs?q=order-4711")) == [k]  # key substring, any case
    assert listed(admin.get("/jobs", query_string={"q": "100% FULL"})) == [f]  # error text
    assert listed(admin.get("/jobs", query_string={"q": "_"})) == []  # LIKE chars are literal
    assert listed(admin.get("/jobs?q=nothing-like-this")) == []
    assert admin.get("/jobs?status=sleeping").status_code == 400


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
    for action in ACTIONS:
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
    assert f"{pending} is pending" in response.get_data(as_text=True)
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

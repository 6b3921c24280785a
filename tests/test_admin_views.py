"""The admin's views are module-level functions: a test imports and calls one in a
request context of its URL, and each finds its blueprint's queue and actor through the
request (tests/test_admin.py has two blueprints side by side, under two names)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flask import Flask
from werkzeug.exceptions import NotFound

from flask_sqlqueue.admin import actions
from flask_sqlqueue.admin import context
from flask_sqlqueue.admin import pages
from flask_sqlqueue.core import operations
from tests import sample_app


def with_admin(app: Flask, **register: str) -> Flask:
    app.secret_key = "test secret"
    app.register_blueprint(
        sample_app.queue.admin_blueprint(authorize=lambda: True, actor=lambda: "ada"),
        **{"url_prefix": "/queue", **register},
    )
    return app


def test_a_view_runs_in_a_request_context_of_its_url(make_app: Callable[..., Flask]) -> None:
    app = with_admin(make_app())
    with app.app_context():
        job = sample_app.add.using(delay=3600).enqueue(1, 2)
    with app.test_request_context(f"/queue/jobs/{job.id}"):
        assert context.current().queue is sample_app.queue
        assert context.acting().actor == "ada"
        assert f"/queue/jobs/{job.id}/run-now" in pages.job(job.id)
        with pytest.raises(NotFound):
            pages.job(job.id + 1000)
    with app.test_request_context(f"/queue/jobs/{job.id}/run-now", method="POST"):
        assert actions.run_now(job.id).status_code == 303
    with app.app_context():
        store = sample_app.queue.state().store
        entries = operations.audit_entries(store, limit=5, job_id=job.id)
    assert [(e.actor, e.action) for e in entries] == [("ada", "run_now")]


def test_outside_an_admin_request_a_view_says_so(make_app: Callable[..., Flask]) -> None:
    app = with_admin(make_app())
    with app.test_request_context("/elsewhere"), pytest.raises(RuntimeError, match="admin"):
        pages.dashboard()

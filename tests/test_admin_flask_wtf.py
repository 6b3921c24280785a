"""The admin beside Flask-WTF's ``CSRFProtect``, which checks every POST of the app.

Its check runs before the admin's views: the admin's forms must carry a token it
accepts, and the admin must still refuse a forged POST where the app exempts it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask
from flask_wtf.csrf import CSRFProtect

from tests import sample_app
from tests.conftest import query

SETUPS = ["protect, then register", "register, then protect", "exempt", "own field name"]


def _status(database_uri: str, job_id: int) -> str:
    return str(
        query(database_uri, "SELECT status FROM sqlqueue_jobs WHERE id = :i", i=job_id)[0][0]
    )


@pytest.mark.parametrize("setup", SETUPS)
def test_admin_actions_work_beside_csrfprotect_and_forgeries_are_refused(
    make_app: Callable[..., Flask], database_uri: str, setup: str
) -> None:
    app = make_app()
    app.secret_key = "test secret"
    field = "xsrf" if setup == "own field name" else "csrf_token"
    app.config["WTF_CSRF_FIELD_NAME"] = field
    blueprint = sample_app.queue.admin_blueprint(authorize=lambda: True)
    csrf = CSRFProtect()
    if setup == "register, then protect":
        app.register_blueprint(blueprint, url_prefix="/queue")
        csrf.init_app(app)
    else:
        csrf.init_app(app)
        if setup == "exempt":
            csrf.exempt(blueprint)
        app.register_blueprint(blueprint, url_prefix="/queue")
    with app.app_context():
        dead = sample_app.always_fails.using(max_attempts=1).enqueue("boom").id
    sample_app.queue.worker(app=app).run(burst=True)
    assert _status(database_uri, dead) == "dead"

    client = app.test_client()
    page = client.get("/queue/jobs").get_data(as_text=True)
    found = re.search(rf'name="{field}" value="([^"]+)"', page)
    assert found, page
    forged: list[dict[str, Any]] = [{}, {field: ""}, {field: "not a token"}]
    for data in forged:
        refused = client.post(f"/queue/jobs/{dead}/retry", data=data)
        assert refused.status_code == 400, data
        assert "CSRF token" in refused.get_data(as_text=True), data
    assert _status(database_uri, dead) == "dead"

    done = client.post(f"/queue/jobs/{dead}/retry", data={field: found.group(1)})
    assert done.status_code == 303, done.get_data(as_text=True)
    assert _status(database_uri, dead) == "pending"

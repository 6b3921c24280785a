"""The fixtures of the limits app (tests/limits_app.py), for test_pause.py and
test_limits.py; loaded through ``pytest_plugins`` in tests/conftest.py.

They live apart from the app because worker processes load the app as
``flask --app tests.limits_app``, and those need neither pytest nor the test databases.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from tests import limits_app
from tests.conftest import install_schema


@pytest.fixture
def make_lapp(database_uri: str) -> Iterator[Callable[..., Flask]]:
    """The limits app on the test's database, schema in place."""
    made: list[Flask] = []

    def make(config: dict[str, Any] | None = None) -> Flask:
        if not made and not database_uri.startswith("sqlite"):
            install_schema(database_uri)
        app = limits_app.create_app({"SQLQUEUE_DATABASE_URI": database_uri, **(config or {})})
        if database_uri.startswith("sqlite"):
            limits_app.queue.upgrade_database(app=app)
        made.append(app)
        return app

    yield make
    for app in made:
        app.extensions["sqlqueue"].store.engine.dispose()


@pytest.fixture
def lapp(make_lapp: Callable[..., Flask]) -> Flask:
    return make_lapp()

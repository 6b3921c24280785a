"""The fixtures of the limits app (tests/limits_app.py), for test_pause.py and
test_limits.py; loaded through ``pytest_plugins`` in tests/conftest.py.

They live apart from the app because worker processes load the app as
``flask --app tests.limits_app``, and those need neither pytest nor the test databases.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator

import pytest
from flask import Flask

from tests import limits_app
from tests.conftest import apps_on


@pytest.fixture
def make_lapp(database_uri: str) -> Iterator[Callable[..., Flask]]:
    """The limits app on the test's database, schema in place (:func:`apps_on`)."""
    yield from apps_on(database_uri, limits_app.create_app, limits_app.queue)


@pytest.fixture
def lapp(make_lapp: Callable[..., Flask]) -> Flask:
    return make_lapp()

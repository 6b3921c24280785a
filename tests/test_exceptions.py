"""The errors the core raises belong to the one tree a caller catches
(``SQLQueueError``), and keep the standard base they had, so existing ``except``
clauses still catch them."""

from __future__ import annotations

import pytest

from flask_sqlqueue.core import actions
from flask_sqlqueue.core.features import versions
from flask_sqlqueue.exceptions import InvalidTransition
from flask_sqlqueue.exceptions import NewerVersion
from flask_sqlqueue.exceptions import SQLQueueError
from flask_sqlqueue.exceptions import UpcastError


@pytest.mark.parametrize("error", [InvalidTransition, UpcastError, NewerVersion])
def test_the_core_errors_are_sqlqueue_errors_and_value_errors(error: type[Exception]) -> None:
    assert issubclass(error, SQLQueueError)
    assert issubclass(error, ValueError)
    with pytest.raises(SQLQueueError):
        raise error("refused")


def test_the_modules_that_raise_them_raise_these_classes() -> None:
    assert actions.InvalidTransition is InvalidTransition
    assert versions.UpcastError is UpcastError
    assert versions.NewerVersion is NewerVersion

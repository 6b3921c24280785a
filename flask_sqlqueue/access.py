"""Who may use the admin and metrics blueprints: the ``authorize`` gate both share.

Both are closed by default. ``authorize()`` is called with no arguments, in the request
context, before every request the blueprint serves, and its answer decides:

- ``True`` (exactly; not merely something truthy) lets the request through;
- a response object, such as ``redirect(url_for("login"))`` or any werkzeug
  ``Response``, is sent as it is, in place of the page;
- anything else (``False``, ``None``, ``1``, a user object...) is refused with 403.

Only ``True`` opens, because a gate that opened for anything truthy would let through
the redirect meant for an anonymous visitor, or ``current_user`` itself, which
Flask-Login's anonymous user also is. Without ``authorize`` every request is refused,
with a message saying how to configure it.

The admin has a second gate for changes: ``authorize_write()``, asked the same way about
every POST that ``authorize`` let through (a read-only user gets a 403 saying so). Without
it, whoever may read may act.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.wrappers import Response as BaseResponse

#: ``authorize``: no arguments; ``True``, a response, or anything else (refused).
Authorize = Callable[[], Any]


def not_configured(what: str, factory: str) -> str:
    """The message of a blueprint made without ``authorize``."""
    return (
        f"The {what} is closed until you say who may use it. Pass a function that "
        "returns True for those users (or a response to send instead, such as a "
        f"redirect to your login page): queue.{factory}(authorize=lambda: "
        "current_user.is_authenticated and current_user.is_admin)."
    )


def forbidden(what: str, answer: Any) -> str:
    """The message of a request ``authorize()`` did not let through."""
    message = f"You are not allowed to use the {what}."
    if answer is not None and not isinstance(answer, bool):
        # Said for the developer who returned a user object or 1 and wonders why.
        message += (
            f" (authorize() answered a {type(answer).__name__}; only True lets a request "
            "through, and a response is sent as it is.)"
        )
    return message


def gate(
    authorize: Authorize | None,
    refuse: Callable[[str], BaseResponse],
    *,
    what: str,
    factory: str,
) -> BaseResponse | None:
    """Ask ``authorize`` about this request: ``None`` lets it through, a response is
    what to answer instead.

    :param refuse: makes the 403 response from a message.
    :param what: the blueprint's name in messages (``"queue admin"``).
    :param factory: the ``SQLQueue`` method that makes the blueprint.
    """
    if authorize is None:
        return refuse(not_configured(what, factory))
    answer = authorize()
    if answer is True:
        return None
    if isinstance(answer, BaseResponse):
        return answer
    return refuse(forbidden(what, answer))


def read_only(what: str, answer: Any) -> str:
    """The message of a change ``authorize_write()`` did not let through."""
    message = (
        f"You may look at the {what} but not change anything: this action needs write "
        "access, which authorize_write() did not grant. Ask whoever runs the app for it."
    )
    if answer is not None and not isinstance(answer, bool):
        message += (
            f" (authorize_write() answered a {type(answer).__name__}; only True lets a "
            "change through, and a response is sent as it is.)"
        )
    return message


def gate_write(
    authorize_write: Authorize, refuse: Callable[[str], BaseResponse], *, what: str
) -> BaseResponse | None:
    """Ask ``authorize_write`` about a change (a request ``authorize`` let through):
    ``None`` lets it through, a response is what to answer instead."""
    answer = authorize_write()
    if answer is True:
        return None
    if isinstance(answer, BaseResponse):
        return answer
    return refuse(read_only(what, answer))

"""CSRF protection for the admin's forms, with or without Flask-WTF.

Each browser session gets a random secret in ``flask.session`` (a cookie signed with the
app's ``secret_key``, which another site can neither read nor forge). Every form carries
a token derived from it, and a POST whose token does not match is refused with 400
before anything is read or written. Without ``app.secret_key`` there is no session to
bind a token to: pages still render, and every POST is refused with a 500 naming the fix.

An app that protects every POST with Flask-WTF's ``CSRFProtect`` checks the admin's
forms before the admin sees them, with its own tokens: the forms then carry Flask-WTF's
token, in the field its ``WTF_CSRF_FIELD_NAME`` names, and the admin checks that token
with Flask-WTF too (so the check holds also where the app exempts the admin's blueprint).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from flask import current_app
from flask import request
from flask import session

SESSION_KEY = "_sqlqueue_csrf"
FIELD = "csrf_token"
NO_SECRET_KEY = (
    "The queue admin needs the app's secret_key (SECRET_KEY) to protect its forms "
    "against cross-site request forgery; set app.secret_key and reload the page."
)


class CSRFError(Exception):
    """A POST without a valid token (400), or an app without a secret key (500)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def can_protect() -> bool:
    return bool(current_app.secret_key)


def _flask_wtf() -> bool:
    """Whether the app protects its POSTs with Flask-WTF's ``CSRFProtect``."""
    return "csrf" in current_app.extensions


def field() -> str:
    """The name of the forms' token field."""
    if _flask_wtf():
        return str(current_app.config.get("WTF_CSRF_FIELD_NAME", FIELD))
    return FIELD


def token() -> str:
    """The token for this session's forms (creates the session's secret on first use)."""
    if not can_protect():
        return ""
    if _flask_wtf():
        from flask_wtf.csrf import generate_csrf

        return str(generate_csrf())
    secret = session.get(SESSION_KEY)
    if not isinstance(secret, str) or len(secret) < 32:
        secret = secrets.token_hex(32)
        session[SESSION_KEY] = secret
    return _derive(secret)


def _derive(secret: str) -> str:
    # The form token is a MAC of the secret, so the value in the page is never the value
    # in the cookie, and tokens cannot be swapped with another feature's.
    return hmac.new(secret.encode(), b"flask_sqlqueue admin form", hashlib.sha256).hexdigest()


def check() -> None:
    """Refuse this POST unless it carries the session's token.

    :raises CSRFError: no secret key (500), no session secret, or a missing or wrong token.
    """
    if not can_protect():
        raise CSRFError(NO_SECRET_KEY, status=500)
    if _flask_wtf():
        _check_with_flask_wtf()
        return
    secret = session.get(SESSION_KEY)
    sent = request.form.get(FIELD, "")
    if not isinstance(secret, str) or not secret:
        raise CSRFError(
            "The form's security token has expired or cookies are blocked; "
            "reload the page and try again."
        )
    if not sent or not hmac.compare_digest(sent.encode(), _derive(secret).encode()):
        raise CSRFError("The form's security token is missing or wrong; reload the page.")


def _check_with_flask_wtf() -> None:
    from flask_wtf.csrf import validate_csrf
    from wtforms import ValidationError

    try:
        validate_csrf(request.form.get(field(), ""))
    except ValidationError as exc:
        raise CSRFError(f"{exc} Reload the page and try again.") from exc

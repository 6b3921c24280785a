"""``SQLQUEUE_*`` configuration keys, read once into a frozen :class:`Settings`.

:data:`KEYS` is the one table of keys: every key the package reads, with its default and
how a value is read. A key starting with ``SQLQUEUE_`` that is not in it is refused (a
misspelt key would otherwise be ignored in silence). Values may be given as strings, as
the environment gives them (``app.config.from_mapping(os.environ)``, or what
``from_prefixed_env`` leaves as text): each is read as its key's type, and a value that
cannot be read is refused with a message naming the key, the value and what it accepts.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from datetime import timedelta
from typing import Any
from typing import NamedTuple

from .exceptions import ConfigurationError

DEFAULT_DATABASE_FILE = "sqlqueue.db"
PREFIX = "SQLQUEUE_"

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_LONGEST_KEEP = 100 * 366 * 86400.0
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
# Decimal numbers only: float() would also take "nan", "inf", "1_000" and "0x10".
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class Key(NamedTuple):
    """One configuration key: its default, and how a value of it is read."""

    default: Any
    #: Returns the value as its type; raises ``ValueError`` when it cannot.
    read: Callable[[Any], Any]
    #: What the key accepts, for the error message.
    accepts: str


def _integer(default: int, minimum: int) -> Key:
    def read(value: Any) -> int:
        if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError
        return value

    return Key(default, read, f"a whole number >= {minimum} (or such a string, e.g. '3')")


def _number(default: float, minimum: float) -> Key:
    def read(value: Any) -> float:
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError
        if not (math.isfinite(value) and value >= minimum):
            raise ValueError
        return float(value)

    return Key(default, read, f"a number >= {minimum:g} (or such a string, e.g. '2.5')")


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
    elif isinstance(value, int) and value in (0, 1):  # bools, and from_prefixed_env's 0/1
        return bool(value)
    raise ValueError


def _keep(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        seconds = float(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError
    if not (math.isfinite(seconds) and 0 < seconds <= _LONGEST_KEEP):
        raise ValueError
    return seconds


def _uri(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise ValueError


def _options(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError
    return dict(value)


def _synchronous(value: Any) -> str:
    if isinstance(value, str) and value.strip().upper() in _SYNCHRONOUS:
        return value.strip().upper()
    raise ValueError


_FLAG = (
    "True or False (as a string: 'true', '1', 'yes', 'on' or 'false', '0', 'no', 'off', "
    "in any case)"
)
_KEEP = (
    "a number of seconds or a timedelta, more than zero and at most 100 years, or None "
    "to keep forever (as a string: '604800' or 'none')"
)

#: Every key the package reads, with its default and reader; each fills the
#: :class:`Settings` field of its name without the prefix, in lower case. ``None`` for
#: the URI means "a file in the instance folder".
KEYS: dict[str, Key] = {
    "SQLQUEUE_DATABASE_URI": Key(None, _uri, "a database URL string"),
    # Flask-SQLAlchemy's database (its default engine's URL) instead of a URI of its own.
    "SQLQUEUE_USE_APP_DATABASE": Key(False, _flag, _FLAG),
    "SQLQUEUE_ENGINE_OPTIONS": Key(
        {}, _options, "a dict of create_engine arguments (or that dict as a JSON string)"
    ),
    "SQLQUEUE_MAX_ATTEMPTS": _integer(5, minimum=1),
    # Crashes (attempts lost with their worker) before a job is quarantined (dead).
    "SQLQUEUE_MAX_CRASHES": _integer(3, minimum=1),
    "SQLQUEUE_BACKOFF_BASE": _number(30.0, minimum=0),
    "SQLQUEUE_BACKOFF_CAP": _number(3600.0, minimum=0),
    "SQLQUEUE_BACKOFF_JITTER": _number(20.0, minimum=0),
    "SQLQUEUE_STALE_AFTER": _number(60.0, minimum=1),
    "SQLQUEUE_EAGER": Key(False, _flag, _FLAG),
    "SQLQUEUE_SQLITE_SYNCHRONOUS": Key("FULL", _synchronous, f"one of {', '.join(_SYNCHRONOUS)}"),
    "SQLQUEUE_SQLITE_BUSY_TIMEOUT": _number(30.0, minimum=0),
    # Retention: how long finished jobs are kept before the workers delete them (seconds
    # or a timedelta; None keeps them forever). Effect keys default to forever.
    "SQLQUEUE_KEEP_COMPLETED": Key(timedelta(days=7), _keep, _KEEP),
    "SQLQUEUE_KEEP_DEAD": Key(timedelta(days=30), _keep, _KEEP),
    "SQLQUEUE_KEEP_EFFECTS": Key(None, _keep, _KEEP),
    "SQLQUEUE_PRUNE_INTERVAL": _number(60.0, minimum=0.1),
    # Bytes of a job's payload kept in its row; a larger one goes to sqlqueue_payloads.
    "SQLQUEUE_INLINE_PAYLOAD_LIMIT": _integer(65536, minimum=0),
}

#: Every key with its default (what ``init_app`` puts in ``app.config`` when unset).
DEFAULTS: dict[str, Any] = {name: key.default for name, key in KEYS.items()}


def default(name: str) -> Any:
    """The default of key ``name`` as :class:`Settings` holds it (read as its type: the
    7-day ``timedelta`` of ``SQLQUEUE_KEEP_COMPLETED`` is 604800.0 seconds).

    :data:`KEYS` is the one place a default is written; :class:`Settings`, the core's
    ``Backoff`` and ``WorkerOptions`` take theirs from here.
    """
    return KEYS[name].read(KEYS[name].default)


def read(config: Mapping[str, Any], name: str) -> Any:
    """The value of key ``name`` in ``config`` (or its default), read as its type.

    :raises ConfigurationError: the value cannot be read; the message says what it accepts.
    """
    key = KEYS[name]
    value = config.get(name, key.default)
    try:
        return key.read(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise ConfigurationError(f"{name} must be {key.accepts}, got {value!r}.") from None


def check_keys(config: Mapping[str, Any]) -> None:
    """Refuse a ``SQLQUEUE_*`` key that is not in :data:`KEYS`, naming the closest one.

    :raises ConfigurationError: an unknown key (a typo would otherwise be ignored).
    """
    for name in config:
        if isinstance(name, str) and name.startswith(PREFIX) and name not in KEYS:
            closest = difflib.get_close_matches(name, KEYS, n=1, cutoff=0)[0]
            raise ConfigurationError(
                f"{name} is not a flask_sqlqueue setting, and would be ignored; "
                f"did you mean {closest}? (Every key is listed in the README's "
                "Configuration section.)"
            )


@dataclass(frozen=True, slots=True)
class Settings:
    """The queue's configuration for one app, validated and frozen."""

    # Each default is its key's, from KEYS: written once, there.
    database_uri: str
    #: The URI is Flask-SQLAlchemy's (read by the extension), not ``SQLQUEUE_DATABASE_URI``.
    use_app_database: bool = default("SQLQUEUE_USE_APP_DATABASE")
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    max_attempts: int = default("SQLQUEUE_MAX_ATTEMPTS")
    #: Attempts lost to crashes of their worker before a job is quarantined.
    max_crashes: int = default("SQLQUEUE_MAX_CRASHES")
    backoff_base: float = default("SQLQUEUE_BACKOFF_BASE")
    backoff_cap: float = default("SQLQUEUE_BACKOFF_CAP")
    backoff_jitter: float = default("SQLQUEUE_BACKOFF_JITTER")
    stale_after: float = default("SQLQUEUE_STALE_AFTER")
    eager: bool = default("SQLQUEUE_EAGER")
    sqlite_synchronous: str = default("SQLQUEUE_SQLITE_SYNCHRONOUS")
    sqlite_busy_timeout: float = default("SQLQUEUE_SQLITE_BUSY_TIMEOUT")
    #: Seconds completed and cancelled jobs are kept after they finish; None: forever.
    keep_completed: float | None = default("SQLQUEUE_KEEP_COMPLETED")
    #: Seconds dead jobs are kept after they went dead; None: forever.
    keep_dead: float | None = default("SQLQUEUE_KEEP_DEAD")
    #: Seconds an effect key is kept after it was reserved, and only once its job is
    #: gone too; None: forever.
    keep_effects: float | None = default("SQLQUEUE_KEEP_EFFECTS")
    #: Seconds between two pruning rounds of one worker.
    prune_interval: float = default("SQLQUEUE_PRUNE_INTERVAL")
    #: Bytes (UTF-8) of a payload kept in its job's row; a larger one is kept in
    #: ``sqlqueue_payloads`` (docs/payloads.md).
    inline_payload_limit: int = default("SQLQUEUE_INLINE_PAYLOAD_LIMIT")

    @classmethod
    def from_mapping(
        cls,
        config: Mapping[str, Any],
        instance_path: str,
        app_database: Callable[[], str] | None = None,
    ) -> Settings:
        """Build settings from a Flask config, refusing unknown keys and bad values with a
        message per key.

        :param app_database: the URL of the app's own database (Flask-SQLAlchemy's), for
            ``SQLQUEUE_USE_APP_DATABASE``; called only when that is set.
        :raises ConfigurationError: an unknown ``SQLQUEUE_*`` key, a value that cannot
            be read as its key's type, or both ``SQLQUEUE_DATABASE_URI`` and
            ``SQLQUEUE_USE_APP_DATABASE``.
        """
        check_keys(config)
        # Each key fills the field of its name: SQLQUEUE_MAX_ATTEMPTS is max_attempts.
        values = {name.removeprefix(PREFIX).lower(): read(config, name) for name in KEYS}
        if values["use_app_database"]:
            if values["database_uri"] is not None:
                raise ConfigurationError(
                    "SQLQUEUE_USE_APP_DATABASE uses the app's Flask-SQLAlchemy database, and "
                    "SQLQUEUE_DATABASE_URI names one too; set one of them, not both."
                )
            if app_database is None:
                raise ConfigurationError(
                    "SQLQUEUE_USE_APP_DATABASE needs the app's database URL, which only the "
                    "Flask extension can read (queue.init_app(app))."
                )
            values["database_uri"] = app_database()
        elif values["database_uri"] is None:
            values["database_uri"] = "sqlite:///" + os.path.join(
                instance_path, DEFAULT_DATABASE_FILE
            )
        return cls(**values)

"""``SQLQUEUE_*`` configuration keys, read once into a frozen :class:`Settings`."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from datetime import timedelta
from typing import Any

from .exceptions import ConfigurationError

DEFAULT_DATABASE_FILE = "sqlqueue.db"

#: Every key with its default. ``None`` for the URI means "a file in the instance folder".
DEFAULTS: dict[str, Any] = {
    "SQLQUEUE_DATABASE_URI": None,
    "SQLQUEUE_ENGINE_OPTIONS": {},
    "SQLQUEUE_MAX_ATTEMPTS": 5,
    "SQLQUEUE_BACKOFF_BASE": 30.0,
    "SQLQUEUE_BACKOFF_CAP": 3600.0,
    "SQLQUEUE_BACKOFF_JITTER": 20.0,
    "SQLQUEUE_STALE_AFTER": 60.0,
    "SQLQUEUE_EAGER": False,
    "SQLQUEUE_SQLITE_SYNCHRONOUS": "FULL",
    "SQLQUEUE_SQLITE_BUSY_TIMEOUT": 30.0,
    # Retention: how long finished jobs are kept before the workers delete them (seconds
    # or a timedelta; None keeps them forever). Effect keys default to forever.
    "SQLQUEUE_KEEP_COMPLETED": timedelta(days=7),
    "SQLQUEUE_KEEP_DEAD": timedelta(days=30),
    "SQLQUEUE_KEEP_EFFECTS": None,
    "SQLQUEUE_PRUNE_INTERVAL": 60.0,
}

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
_LONGEST_KEEP = 100 * 366 * 86400.0


@dataclass(frozen=True, slots=True)
class Settings:
    """The queue's configuration for one app, validated and frozen."""

    database_uri: str
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    max_attempts: int = 5
    backoff_base: float = 30.0
    backoff_cap: float = 3600.0
    backoff_jitter: float = 20.0
    stale_after: float = 60.0
    eager: bool = False
    sqlite_synchronous: str = "FULL"
    sqlite_busy_timeout: float = 30.0
    #: Seconds completed and cancelled jobs are kept after they finish; None: forever.
    keep_completed: float | None = 7 * 86400.0
    #: Seconds dead jobs are kept after they went dead; None: forever.
    keep_dead: float | None = 30 * 86400.0
    #: Seconds an effect key is kept after it was reserved, and only once its job is
    #: gone too; None: forever.
    keep_effects: float | None = None
    #: Seconds between two pruning rounds of one worker.
    prune_interval: float = 60.0

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], instance_path: str) -> Settings:
        """Build settings from a Flask config, refusing bad values with a message per key."""

        def number(key: str, *, minimum: float, integer: bool = False) -> Any:
            value = config.get(key, DEFAULTS[key])
            kind = int if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
                what = "a whole number" if integer else "a number"
                raise ConfigurationError(f"{key} must be {what} >= {minimum}, got {value!r}.")
            return value if integer else float(value)

        def keep(key: str) -> float | None:
            value = config.get(key, DEFAULTS[key])
            if value is None:
                return None
            if isinstance(value, timedelta):
                seconds = value.total_seconds()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                seconds = float(value)
            else:
                seconds = math.nan
            if not (math.isfinite(seconds) and 0 < seconds <= _LONGEST_KEEP):
                raise ConfigurationError(
                    f"{key} must be a number of seconds or a timedelta, more than zero and "
                    f"at most 100 years, or None to keep forever; got {value!r}."
                )
            return seconds

        uri = config.get("SQLQUEUE_DATABASE_URI") or (
            "sqlite:///" + os.path.join(instance_path, DEFAULT_DATABASE_FILE)
        )
        if not isinstance(uri, str):
            raise ConfigurationError(f"SQLQUEUE_DATABASE_URI must be a string, got {uri!r}.")
        options = config.get("SQLQUEUE_ENGINE_OPTIONS", {}) or {}
        if not isinstance(options, Mapping):
            raise ConfigurationError(
                f"SQLQUEUE_ENGINE_OPTIONS must be a dict of create_engine arguments, "
                f"got {options!r}."
            )
        synchronous = str(config.get("SQLQUEUE_SQLITE_SYNCHRONOUS", "FULL")).upper()
        if synchronous not in _SYNCHRONOUS:
            raise ConfigurationError(
                f"SQLQUEUE_SQLITE_SYNCHRONOUS must be one of {', '.join(_SYNCHRONOUS)}, "
                f"got {synchronous!r}."
            )
        return cls(
            database_uri=uri,
            engine_options=dict(options),
            max_attempts=number("SQLQUEUE_MAX_ATTEMPTS", minimum=1, integer=True),
            backoff_base=number("SQLQUEUE_BACKOFF_BASE", minimum=0),
            backoff_cap=number("SQLQUEUE_BACKOFF_CAP", minimum=0),
            backoff_jitter=number("SQLQUEUE_BACKOFF_JITTER", minimum=0),
            stale_after=number("SQLQUEUE_STALE_AFTER", minimum=1),
            eager=bool(config.get("SQLQUEUE_EAGER", False)),
            sqlite_synchronous=synchronous,
            sqlite_busy_timeout=number("SQLQUEUE_SQLITE_BUSY_TIMEOUT", minimum=0),
            keep_completed=keep("SQLQUEUE_KEEP_COMPLETED"),
            keep_dead=keep("SQLQUEUE_KEEP_DEAD"),
            keep_effects=keep("SQLQUEUE_KEEP_EFFECTS"),
            prune_interval=number("SQLQUEUE_PRUNE_INTERVAL", minimum=0.1),
        )

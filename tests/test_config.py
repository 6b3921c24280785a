"""``SQLQUEUE_*`` keys: unknown ones refused, string values read as the key's type.

Values often come from the environment (``app.config.from_mapping(os.environ)``, or what
``from_prefixed_env`` cannot decode as JSON), so every key reads its value from a string
the same way, and a value it cannot read is refused by ``init_app`` before anything is
set up or written.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from flask_sqlqueue import ConfigurationError
from flask_sqlqueue import SQLQueue
from flask_sqlqueue import config
from flask_sqlqueue.config import Settings
from tests import sample_app
from tests.conftest import ROOT
from tests.conftest import query


def _app(tmp_path: Path, **config: Any) -> Flask:
    app = Flask("config_test", instance_path=str(tmp_path / "instance"))
    app.config["SQLQUEUE_DATABASE_URI"] = f"sqlite:///{tmp_path / 'queue.db'}"
    app.config.update(config)
    return app


def _settings(**config: Any) -> Settings:
    return Settings.from_mapping(config, instance_path="/tmp")


def _refused(tmp_path: Path, **config: Any) -> str:
    """The message ``init_app`` refuses ``config`` with; checks nothing was set up."""
    app = _app(tmp_path, **config)
    with pytest.raises(ConfigurationError) as raised:
        SQLQueue().init_app(app)
    assert "sqlqueue" not in app.extensions
    assert not (tmp_path / "queue.db").exists()  # nothing written
    return str(raised.value)


# -- unknown keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("SQLQUEUE_DATABASE_URL", "SQLQUEUE_DATABASE_URI"),
        ("SQLQUEUE_MAX_ATTEMPT", "SQLQUEUE_MAX_ATTEMPTS"),
        ("SQLQUEUE_BACKOFF_JITER", "SQLQUEUE_BACKOFF_JITTER"),
        ("SQLQUEUE_KEEP_COMPLETE", "SQLQUEUE_KEEP_COMPLETED"),
        ("SQLQUEUE_SQLITE_SYNC", "SQLQUEUE_SQLITE_SYNCHRONOUS"),
        ("SQLQUEUE_EAGER_MODE", "SQLQUEUE_EAGER"),
    ],
)
def test_an_unknown_key_is_refused_naming_the_closest(
    tmp_path: Path, typo: str, meant: str
) -> None:
    message = _refused(tmp_path, **{typo: "sqlite:///elsewhere.db"})
    assert message.startswith(f"{typo} is not a flask_sqlqueue setting")
    assert f"did you mean {meant}?" in message


def test_a_misspelt_database_key_never_falls_back_to_the_default_database(
    tmp_path: Path,
) -> None:
    app = Flask("config_test", instance_path=str(tmp_path / "instance"))
    app.config["SQLQUEUE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'meant.db'}"
    with pytest.raises(ConfigurationError, match="did you mean SQLQUEUE_DATABASE_URI"):
        SQLQueue().init_app(app)
    assert not (tmp_path / "instance").exists()  # the default database was not made


def test_every_key_the_package_reads_is_known() -> None:
    # Any SQLQUEUE_ key named in the package's code or its docs must be in the table,
    # or init_app would refuse a key the docs tell users to set.
    named: set[str] = set()
    sources = [*(ROOT / "flask_sqlqueue").rglob("*.py"), ROOT / "README.md"]
    for path in [*sources, *(ROOT / "docs").rglob("*.md")]:
        for line in path.read_text().splitlines():
            if "did you mean" not in line:  # the README's example of a typo
                named |= set(re.findall(r"SQLQUEUE_[A-Z_]*[A-Z]", line))
    # Environment variables of the test suite, not configuration keys.
    named -= {"SQLQUEUE_TEST_POSTGRES_URL", "SQLQUEUE_TEST_MYSQL_URL"}
    # "SQLQUEUE_KEEP_*" and "SQLQUEUE_BACKOFF_BASE / _CAP" style mentions.
    named = {key for key in named if not key.endswith("_KEEP")}
    assert named <= set(config.KEYS), sorted(named - set(config.KEYS))
    assert set(config.DEFAULTS) == set(config.KEYS)


def test_other_config_keys_are_left_alone(tmp_path: Path) -> None:
    app = _app(tmp_path, SQLQUEUE=1, SQLALCHEMY_DATABASE_URI="sqlite://", MY_SQLQUEUE_X=1)
    queue = SQLQueue()
    queue.init_app(app)
    queue.state(app).store.engine.dispose()


# -- values given as strings -----------------------------------------------------------------


@pytest.mark.parametrize("text", ["false", "False", "FALSE", "0", "no", "No", "off", "OFF"])
def test_false_strings_turn_eager_mode_off(text: str) -> None:
    assert _settings(SQLQUEUE_EAGER=text).eager is False


@pytest.mark.parametrize("text", ["true", "True", "1", "yes", "YES", "on", " On "])
def test_true_strings_turn_eager_mode_on(text: str) -> None:
    assert _settings(SQLQUEUE_EAGER=text).eager is True


@pytest.mark.parametrize("value", [True, False, 1, 0])
def test_booleans_and_0_1_are_read_as_themselves(value: Any) -> None:
    # from_prefixed_env decodes FLASK_SQLQUEUE_EAGER=1 as the int 1.
    assert _settings(SQLQUEUE_EAGER=value).eager is bool(value)


@pytest.mark.parametrize("value", ["maybe", "", "2", "t", "disabled", 2, -1, 0.5, [], None])
def test_an_unreadable_boolean_is_refused(tmp_path: Path, value: Any) -> None:
    message = _refused(tmp_path, SQLQUEUE_EAGER=value)
    assert message.startswith("SQLQUEUE_EAGER must be True or False")
    assert f"got {value!r}" in message
    assert "'false', '0', 'no', 'off'" in message


def test_eager_false_as_a_string_runs_nothing_inline(make_app: Any, database_uri: str) -> None:
    # What an app that loads its config from the environment has.
    app = make_app({"SQLQUEUE_EAGER": "false"})
    with app.app_context():
        job = sample_app.add.enqueue(2, 3)
    assert query(database_uri, "SELECT status FROM sqlqueue_jobs WHERE id = :i", i=job.id) == [
        ("pending",)
    ]
    eager = make_app({"SQLQUEUE_EAGER": "on"})
    with eager.app_context():
        done = sample_app.add.enqueue(2, 3)
    assert (done.status, done.result) == ("completed", 5)


def test_leftovers_of_from_prefixed_env_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from_prefixed_env decodes what it can as JSON and keeps the rest as strings:
    # "off" and "normal" stay strings, "3" becomes 3 and "2.5" becomes 2.5.
    for key, value in {
        "EAGER": "off",
        "MAX_ATTEMPTS": "3",
        "BACKOFF_BASE": "2.5",
        "SQLITE_SYNCHRONOUS": "normal",
        "KEEP_DEAD": "86400",
    }.items():
        monkeypatch.setenv(f"FLASK_SQLQUEUE_{key}", value)
    app = _app(tmp_path)
    app.config.from_prefixed_env()
    assert app.config["SQLQUEUE_EAGER"] == "off"
    queue = SQLQueue()
    queue.init_app(app)
    try:
        settings = queue.state(app).settings
    finally:
        queue.state(app).store.engine.dispose()
    assert settings.eager is False
    assert settings.max_attempts == 3
    assert settings.backoff_base == 2.5
    assert settings.sqlite_synchronous == "NORMAL"
    assert settings.keep_dead == 86400.0


NUMBERS = {
    "SQLQUEUE_BACKOFF_BASE": "backoff_base",
    "SQLQUEUE_BACKOFF_CAP": "backoff_cap",
    "SQLQUEUE_BACKOFF_JITTER": "backoff_jitter",
    "SQLQUEUE_STALE_AFTER": "stale_after",
    "SQLQUEUE_SQLITE_BUSY_TIMEOUT": "sqlite_busy_timeout",
    "SQLQUEUE_PRUNE_INTERVAL": "prune_interval",
    "SQLQUEUE_KEEP_COMPLETED": "keep_completed",
    "SQLQUEUE_KEEP_DEAD": "keep_dead",
    "SQLQUEUE_KEEP_EFFECTS": "keep_effects",
}


@pytest.mark.parametrize("key", sorted(NUMBERS))
@pytest.mark.parametrize(("text", "number"), [("3", 3.0), ("2.5", 2.5), (" 90 ", 90.0)])
def test_every_number_key_reads_int_and_float_strings(key: str, text: str, number: float) -> None:
    assert getattr(_settings(**{key: text}), NUMBERS[key]) == number


@pytest.mark.parametrize("key", sorted(NUMBERS))
@pytest.mark.parametrize("text", ["abc", "nan", "inf", "-1", "1h", "1_000", "0x10", ""])
def test_every_number_key_refuses_what_is_not_a_number(tmp_path: Path, key: str, text: str) -> None:
    message = _refused(tmp_path, **{key: text})
    assert message.startswith(f"{key} must be ")
    assert f"got {text!r}" in message


def test_whole_number_keys_read_whole_number_strings_only(tmp_path: Path) -> None:
    assert _settings(SQLQUEUE_MAX_ATTEMPTS="3").max_attempts == 3
    assert _settings(SQLQUEUE_MAX_ATTEMPTS=" 12 ").max_attempts == 12
    for text in ("2.5", "3.0", "0", "-2", "three", ""):
        message = _refused(tmp_path, SQLQUEUE_MAX_ATTEMPTS=text)
        assert message == (
            "SQLQUEUE_MAX_ATTEMPTS must be a whole number >= 1 (or such a string, e.g. '3'), "
            f"got {text!r}."
        )


def test_retention_reads_none_from_a_string() -> None:
    settings = _settings(SQLQUEUE_KEEP_COMPLETED="none", SQLQUEUE_KEEP_DEAD="None")
    assert (settings.keep_completed, settings.keep_dead) == (None, None)
    assert _settings(SQLQUEUE_KEEP_DEAD=timedelta(hours=1)).keep_dead == 3600.0


def test_number_keys_refuse_nan_and_infinity_as_floats_too(tmp_path: Path) -> None:
    for key in ("SQLQUEUE_BACKOFF_BASE", "SQLQUEUE_STALE_AFTER", "SQLQUEUE_PRUNE_INTERVAL"):
        for value in (float("nan"), float("inf")):
            assert _refused(tmp_path, **{key: value}).startswith(f"{key} must be a number")


def test_engine_options_read_a_json_object_string(tmp_path: Path) -> None:
    assert _settings(SQLQUEUE_ENGINE_OPTIONS='{"pool_size": 5}').engine_options == {"pool_size": 5}
    for text in ("pool_size=5", "[1, 2]", '{"pool_size": '):
        message = _refused(tmp_path, SQLQUEUE_ENGINE_OPTIONS=text)
        assert message.startswith("SQLQUEUE_ENGINE_OPTIONS must be a dict")
        assert f"got {text!r}" in message


def test_synchronous_reads_any_case_and_refuses_the_rest(tmp_path: Path) -> None:
    assert _settings(SQLQUEUE_SQLITE_SYNCHRONOUS="normal").sqlite_synchronous == "NORMAL"
    message = _refused(tmp_path, SQLQUEUE_SQLITE_SYNCHRONOUS="slow")
    assert message == (
        "SQLQUEUE_SQLITE_SYNCHRONOUS must be one of OFF, NORMAL, FULL, EXTRA, got 'slow'."
    )


def test_defaults_are_unchanged() -> None:
    assert _settings() == Settings(database_uri="sqlite:////tmp/sqlqueue.db")


@pytest.mark.parametrize(
    ("uri", "fix"),
    [
        ("postgres://user@db.example/app", "write postgresql+psycopg://"),
        ("mysql://root@db.example/app", "write mysql+pymysql://"),
        ("mariadb://root@db.example/app", "write mariadb+pymysql://"),
        ("postgresql+pg8000://user:secret@db.example/app", "write postgresql+psycopg://"),
    ],
)
def test_a_url_without_a_known_scheme_or_installed_driver_names_the_fix(uri: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        sample_app.create_app({"SQLQUEUE_DATABASE_URI": uri})
    message = str(refused.value)
    assert fix in message
    assert "secret" not in message  # a password is never repeated


@pytest.mark.parametrize("uri", ["sqlite://", "sqlite:///:memory:"])
def test_the_queues_own_in_memory_database_is_refused_as_configuration(
    tmp_path: Path, uri: str
) -> None:
    """``SQLQUEUE_DATABASE_URI`` naming an in-memory SQLite database: ``init_app`` refuses
    it with the queue's own configuration error, as it does any other bad setting."""
    message = _refused(tmp_path, SQLQUEUE_DATABASE_URI=uri)
    assert "in-memory SQLite database cannot be shared by a worker" in message
    assert "sqlite:///path/to/queue.db" in message

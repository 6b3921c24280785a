"""Every default is written once: the config keys' in ``config.KEYS``, the worker's in
``WorkerOptions``; everything else (``Settings``, ``Backoff``, the CLI's flags) reads it."""

from __future__ import annotations

import dataclasses

from flask import Flask

from flask_sqlqueue import WorkerOptions
from flask_sqlqueue import config
from flask_sqlqueue.cli import queue_cli
from flask_sqlqueue.config import Settings
from flask_sqlqueue.core.failures import Backoff


def test_every_setting_defaults_to_its_keys_default() -> None:
    settings = Settings(database_uri="sqlite:///x.db")
    fields = {field.name for field in dataclasses.fields(Settings)}
    for name in config.KEYS:
        field = name.removeprefix(config.PREFIX).lower()
        assert field in fields, name
        if field != "database_uri":  # required: its default depends on the app
            assert getattr(settings, field) == config.default(name), name


def test_default_reads_the_key_as_settings_hold_it() -> None:
    assert config.default("SQLQUEUE_KEEP_COMPLETED") == 7 * 86400.0
    assert config.default("SQLQUEUE_MAX_ATTEMPTS") == 5
    assert config.default("SQLQUEUE_KEEP_EFFECTS") is None


def test_backoff_and_worker_default_to_the_settings() -> None:
    settings = Settings(database_uri="sqlite:///x.db")
    configured = Backoff(settings.backoff_base, settings.backoff_cap, settings.backoff_jitter)
    assert Backoff() == configured
    assert WorkerOptions().stale_after == settings.stale_after


def test_the_work_flags_default_to_the_worker_options() -> None:
    work = queue_cli.commands["work"]
    defaults = {param.name: param.default for param in work.params}
    options = WorkerOptions()
    for name in ("concurrency", "poll_interval", "grace"):
        assert defaults[name] == getattr(options, name), name


def test_the_help_shows_the_worker_defaults() -> None:
    app = Flask(__name__)
    app.cli.add_command(queue_cli)
    shown = app.test_cli_runner().invoke(args=["queue", "work", "--help"]).output
    shown = shown.split("Options:", 1)[1]
    options = WorkerOptions()
    for flag in ("--concurrency", "--poll-interval", "--grace"):
        line = " ".join(shown.split(flag, 1)[1].split("--", 1)[0].split())
        value = getattr(options, flag.lstrip("-").replace("-", "_"))
        assert f"default: {value}" in line, (flag, line)

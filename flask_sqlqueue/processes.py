"""Loading the Flask app in a worker's child processes (``flask queue work --processes``).

Children are started with ``spawn``: they share nothing with the worker but the
environment, the working directory and ``sys.path``, so each loads the app itself, the
way ``flask`` loaded it in the worker (``--app`` / ``FLASK_APP``, or ``wsgi.py`` /
``app.py`` found in the working directory).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass

from flask import Flask
from flask.cli import ScriptInfo

from .core.isolation import ChildRuntime
from .exceptions import ConfigurationError
from .extension import queue_state


@dataclass(frozen=True, slots=True)
class AppLoader:
    """Builds the app in a child process; picklable, so it can be sent to one.

    :param import_path: what ``--app`` / ``FLASK_APP`` said (``"module:create_app"``);
        ``None`` looks for ``wsgi.py`` or ``app.py`` in the working directory.
    :param create_app: a factory given to a custom ``FlaskGroup``; it must be a
        module-level function so the child can import it.
    """

    import_path: str | None = None
    create_app: Callable[[], Flask] | None = None

    @classmethod
    def from_script_info(cls, info: ScriptInfo) -> AppLoader:
        """The loader for the app ``flask`` loaded in this process.

        :raises ConfigurationError: a child could not import the app's factory.
        """
        loader = cls(info.app_import_path, info.create_app)
        try:
            pickle.dumps(loader)
        except Exception as exc:
            raise ConfigurationError(
                "Child processes cannot load this app: its factory cannot be imported "
                f"by name ({exc}); point --app or FLASK_APP at a module-level factory."
            ) from None
        return loader

    def __call__(self) -> ChildRuntime:
        app = ScriptInfo(
            app_import_path=self.import_path, create_app=self.create_app, set_debug_flag=False
        ).load_app()
        state = queue_state(app)
        state.ensure_schema()
        return ChildRuntime(state.store, state.registry, app.app_context)
